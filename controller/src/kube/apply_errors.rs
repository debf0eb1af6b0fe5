//! Writes the API server refused, turned into something users see: the applier
//! records each refused object here, the Store carries the refusals per Gateway (see
//! [`Store::apply_failures`](crate::Store::apply_failures)), and the reconcile turns
//! them into the Gateway's `Programmed=False` condition. The log says it once per
//! change, not once per retry: the applier retries with backoff, and a line every
//! retry would bury the one that matters.

use std::collections::BTreeMap;

use serde_json::Value;

use super::watch::Shared;
use crate::reconcile::services::{LABEL_GATEWAY_NAME, LABEL_GATEWAY_NAMESPACE};
use crate::store::ObjectKey;

/// (kind, object) -> the refusal, for the objects whose last write failed.
#[derive(Default)]
pub struct ApplyFailures {
    failing: BTreeMap<(&'static str, ObjectKey), Failure>,
}

struct Failure {
    gateway: Option<ObjectKey>,
    /// What the Gateway's condition says; `None` for a failure that is not the user's
    /// to fix (a conflict, an unreachable server), which is only logged.
    message: Option<String>,
    /// The error as last logged, so a repeat is not logged again.
    logged: String,
}

impl ApplyFailures {
    /// Records that writing `object` (as applied, labels naming its Gateway) failed.
    pub fn failed(&mut self, kind: &'static str, key: &ObjectKey, object: &Value, e: &kube::Error) {
        let gateway = gateway_of(object);
        let message = refusal(e).map(|why| format!("{kind} {key} cannot be written: {why}"));
        let error = e.to_string();
        let id = (kind, key.clone());
        let repeat = self.failing.get(&id).is_some_and(|f| f.logged == error);
        if repeat {
            tracing::debug!(kind, object = %key, error = %error, "still cannot write a Gateway object; retrying with backoff");
        } else if let Some(m) = &message {
            let gw = gateway
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default();
            tracing::warn!(kind, object = %key, gateway = %gw, "the API server refuses to write a Gateway object: {m}; the Gateway reports Programmed=False until it is allowed; retrying with backoff");
        } else {
            tracing::warn!(kind, object = %key, error = %error, "cannot write a Gateway object; retrying with backoff");
        }
        self.failing.insert(
            id,
            Failure {
                gateway,
                message,
                logged: error,
            },
        );
    }

    /// Records that `object` was written.
    pub fn succeeded(&mut self, kind: &'static str, key: &ObjectKey) {
        if self.failing.remove(&(kind, key.clone())).is_some() {
            tracing::info!(kind, object = %key, "Gateway object written after earlier failures");
        }
    }

    /// Forgets objects no longer wanted (their Gateway went), then hands the refusals
    /// per Gateway to the Store. A change wakes the reconcile; none, nothing happens.
    pub fn publish(
        &mut self,
        shared: &Shared,
        still_wanted: impl Fn(&'static str, &ObjectKey) -> bool,
    ) {
        self.failing
            .retain(|(kind, key), _| still_wanted(kind, key));
        let mut per_gateway: BTreeMap<ObjectKey, String> = BTreeMap::new();
        for f in self.failing.values() {
            if let (Some(gw), Some(m)) = (&f.gateway, &f.message) {
                per_gateway
                    .entry(gw.clone())
                    .and_modify(|all| {
                        all.push_str("; ");
                        all.push_str(m);
                    })
                    .or_insert_with(|| m.clone());
            }
        }
        let per_gateway: crate::store::Map<_, _> = per_gateway.into_iter().collect();
        if shared.with(|s| s.apply_failures != per_gateway) {
            shared.update(|s| s.apply_failures = per_gateway);
        }
    }
}

/// Failing writes by (kind, object) with the error last logged, so that a write
/// retried with backoff is logged when it starts failing, when the error changes and
/// when it recovers, not on every retry (the status writer's).
#[derive(Default)]
pub struct FailureLog {
    failing: std::collections::HashMap<(&'static str, ObjectKey), String>,
}

impl FailureLog {
    pub fn failed(&mut self, kind: &'static str, key: &ObjectKey, e: &kube::Error, what: &str) {
        let error = e.to_string();
        match self.failing.insert((kind, key.clone()), error.clone()) {
            Some(previous) if previous == error => {
                tracing::debug!(kind, object = %key, error = %error, "{what} still failing; retrying with backoff");
            }
            _ => {
                tracing::warn!(kind, object = %key, error = %error, "{what} failed; retrying with backoff (logged again only if the error changes)");
            }
        }
    }

    pub fn succeeded(&mut self, kind: &'static str, key: &ObjectKey, what: &str) {
        if !self.failing.is_empty() && self.failing.remove(&(kind, key.clone())).is_some() {
            tracing::info!(kind, object = %key, "{what} succeeded after earlier failures");
        }
    }
}

/// Why the server refused, when retrying alone won't fix it: forbidden (RBAC), invalid,
/// and the like. Conflicts, throttling, a missing namespace and server or transport
/// errors pass with time and say nothing about the Gateway.
fn refusal(e: &kube::Error) -> Option<String> {
    let kube::Error::Api(s) = e else {
        return None;
    };
    let why = match s.code {
        403 => "forbidden".to_owned(),
        404 | 409 | 429 => return None,
        400..=499 => s.reason.to_ascii_lowercase(),
        _ => return None,
    };
    Some(format!("{why} ({})", s.message))
}

/// The Gateway an applied object belongs to, from the labels every such object carries.
fn gateway_of(object: &Value) -> Option<ObjectKey> {
    let labels = object.get("metadata")?.get("labels")?;
    let get = |k: &str| labels.get(k).and_then(Value::as_str);
    Some(ObjectKey::new(
        get(LABEL_GATEWAY_NAMESPACE)?,
        get(LABEL_GATEWAY_NAME)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;
    use serde_json::json;

    fn api_error(code: u16, reason: &str, message: &str) -> kube::Error {
        kube::Error::Api(Status::failure(message, reason).with_code(code).boxed())
    }

    #[test]
    fn forbidden_writes_reach_their_gateway_once_and_clear() {
        let shared = Shared::default();
        let mut failures = ApplyFailures::default();
        let svc = ObjectKey::new("locked", "gw-aether");
        let object = json!({"metadata": {"labels": {
            LABEL_GATEWAY_NAME: "gw", LABEL_GATEWAY_NAMESPACE: "locked"}}});
        let e = api_error(
            403,
            "Forbidden",
            "services \"gw-aether\" is forbidden: User \"edge\" cannot patch",
        );
        failures.failed("Service", &svc, &object, &e);
        failures.publish(&shared, |_, _| true);
        let got = shared.with(|s| s.apply_failures.clone());
        let msg = got
            .get(&ObjectKey::new("locked", "gw"))
            .cloned()
            .unwrap_or_default();
        assert!(
            msg.starts_with("Service locked/gw-aether cannot be written: forbidden ("),
            "{msg}"
        );
        assert!(msg.contains("User \"edge\" cannot patch"), "{msg}");

        // A conflict is transient: logged, never a condition.
        failures.failed(
            "Service",
            &svc,
            &object,
            &api_error(409, "Conflict", "try again"),
        );
        failures.publish(&shared, |_, _| true);
        assert!(shared.with(|s| s.apply_failures.is_empty()));

        failures.failed("Service", &svc, &object, &e);
        failures.succeeded("Service", &svc);
        failures.publish(&shared, |_, _| true);
        assert!(shared.with(|s| s.apply_failures.is_empty()));

        // The Gateway went: its refusals go with it.
        failures.failed("Service", &svc, &object, &e);
        failures.publish(&shared, |_, _| false);
        assert!(shared.with(|s| s.apply_failures.is_empty()));
    }

    /// The whole way: a refused write, published to the Store, read by the reconcile.
    #[test]
    fn a_refused_service_makes_the_gateway_not_programmed_until_written() {
        use crate::reconcile::reconcile_with;
        use crate::reconcile::services::ServiceSettings;

        use crate::testing;
        let yaml = "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\n\
            metadata: {name: aether}\nspec: {controllerName: aether.io/edge}\n---\n\
            apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\n\
            metadata: {name: gw, namespace: locked, uid: u1}\n\
            spec: {gatewayClassName: aether, listeners: [{name: http, port: 80, protocol: HTTP}]}\n";
        let shared = Shared::default();
        shared.update(|s| *s = testing::store(yaml));
        let settings = testing::settings();
        let addressing = testing::internal_ports(
            "20000-20099",
            ServiceSettings::shared(ObjectKey::new("aether-system", "aether-edge")),
        );
        let gw = ObjectKey::new("locked", "gw");
        let condition = |shared: &Shared, ty: &str| {
            let out = reconcile_with(&shared.snapshot(), &settings, &addressing);
            let st = &out.statuses.gateways[&gw].status;
            let c = st.conditions.iter().flatten().find(|c| c.type_ == ty);
            c.map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
                .unwrap_or_else(|| panic!("no {ty}"))
        };
        let mut failures = ApplyFailures::default();
        let svc = ObjectKey::new("locked", "gw-aether");
        let object = json!({"metadata": {"labels": {
            LABEL_GATEWAY_NAME: "gw", LABEL_GATEWAY_NAMESPACE: "locked"}}});
        failures.failed(
            "Service",
            &svc,
            &object,
            &api_error(403, "Forbidden", "nope"),
        );
        failures.publish(&shared, |_, _| true);
        let (status, reason, message) = condition(&shared, "Programmed");
        assert_eq!(
            (status.as_str(), reason.as_str()),
            ("False", "AddressNotAssigned")
        );
        assert_eq!(
            message,
            "Service locked/gw-aether cannot be written: forbidden (nope)"
        );
        let (status, reason, _) = condition(&shared, "AddressesAssigned");
        assert_eq!((status.as_str(), reason.as_str()), ("False", "NotAssigned"));

        failures.succeeded("Service", &svc);
        failures.publish(&shared, |_, _| true);
        let (_, _, message) = condition(&shared, "Programmed");
        assert!(!message.contains("forbidden"), "{message}");
    }
}
