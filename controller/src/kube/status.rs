//! Writes computed status to the status subresource without storms: nothing is
//! written when the server already holds it (conditions compared without
//! `lastTransitionTime`, which is carried over from the server's object while a
//! condition's status is unchanged), so every replica converges on the same bytes;
//! writes are server-side apply under one field manager; bursts coalesce (only the
//! latest Statuses is kept); failures back off.

use std::any::Any;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use gateway_api::backendtlspolicies::BackendTlsPolicy;
use gateway_api::gatewayclasses::GatewayClass;
use gateway_api::gateways::Gateway;
use gateway_api::grpcroutes::GrpcRoute;
use gateway_api::httproutes::{HttpRoute, HttpRouteStatus, HttpRouteStatusParents};
use gateway_api::listenersets::ListenerSet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::{Api, Client};
use metrics::counter;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::watch;

use super::FIELD_MANAGER;
use super::apply_errors::FailureLog;
use super::crd::{GatewaySchema, ROUTABILITY_LEFT_OUT};
use super::retry_schedule::{Retries, news_or_retry};
use super::watch::Shared;
use crate::Statuses;
use crate::l4route::L4Kind;
use crate::status::{ObjectStatus, with_routability};
use crate::store::ObjectKey;

/// The Gateway API caps `status.parents` at 32 entries.
const MAX_PARENTS: usize = 32;
/// Least time between two write passes: coalesces churn.
const MIN_INTERVAL: Duration = Duration::from_millis(200);

pub struct StatusWriter {
    client: Client,
    shared: Arc<Shared>,
    controller_name: String,
    /// What we last wrote per object (its fingerprint), with the resourceVersion it
    /// produced: a watch event older than our write must not make us write the same
    /// thing again. A fingerprint, not the status: every route's written status kept
    /// as JSON was 3 KiB per route, the writer's largest memory in a cluster.
    written: HashMap<(StatusKind, ObjectKey), (u64, Fingerprint)>,
    /// Writes failing now, so each is logged once per change of error.
    failures: FailureLog,
    /// Failed writes, each backing off on its own (see `retry_schedule`).
    retries: Retries<(StatusKind, ObjectKey)>,
    /// What the installed Gateway CRD declares (see `crd`); None until it was read.
    schema: watch::Receiver<Option<GatewaySchema>>,
    /// Routes found in sync at the last pass, with what decided it. While both stand a
    /// pass skips the route without rendering either side: a change then costs the
    /// routes it touched, not a serialization of every route's status.
    in_sync: HashMap<(StatusKind, ObjectKey), InSync>,
}

/// Our status for a route and the server's object, as they were when they agreed.
/// Holding both `Arc`s keeps a pointer from being reused for another object.
#[derive(Clone)]
struct InSync {
    ours: Arc<HttpRouteStatus>,
    server: Arc<dyn Any + Send + Sync>,
}

/// The kinds whose status the writer writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum StatusKind {
    GatewayClass,
    Gateway,
    ListenerSet,
    HttpRoute,
    GrpcRoute,
    L4(L4Kind),
    BackendTlsPolicy,
}

impl StatusKind {
    fn as_str(self) -> &'static str {
        match self {
            StatusKind::GatewayClass => "GatewayClass",
            StatusKind::Gateway => "Gateway",
            StatusKind::ListenerSet => "ListenerSet",
            StatusKind::HttpRoute => "HTTPRoute",
            StatusKind::GrpcRoute => "GRPCRoute",
            StatusKind::L4(kind) => kind.as_str(),
            StatusKind::BackendTlsPolicy => "BackendTLSPolicy",
        }
    }

    /// Is the status a list other controllers write entries of too (routes'
    /// `parents`, policies' `ancestors`)? Such a write carries their entries and the
    /// resourceVersion it read them at.
    fn shared_with_other_controllers(self) -> bool {
        !matches!(
            self,
            StatusKind::GatewayClass | StatusKind::Gateway | StatusKind::ListenerSet
        )
    }
}

/// One object's write, ready to send.
struct Write {
    kind: StatusKind,
    key: ObjectKey,
    /// The status as compared (our part, transition times stripped).
    ours: Fingerprint,
    body: Value,
}

impl StatusWriter {
    pub fn new(
        client: Client,
        shared: Arc<Shared>,
        controller_name: String,
        schema: watch::Receiver<Option<GatewaySchema>>,
    ) -> Self {
        Self {
            client,
            shared,
            controller_name,
            written: HashMap::new(),
            failures: FailureLog::default(),
            retries: Retries::default(),
            schema,
            in_sync: HashMap::new(),
        }
    }

    /// Writes the latest Statuses from `rx` until the sender goes away.
    pub async fn run(
        mut self,
        mut rx: watch::Receiver<Arc<Statuses>>,
        mut held: watch::Receiver<bool>,
    ) {
        // Gateway status is not written before the CRD says whether it takes
        // `routability`: a guess either way is refused or loses the field. The CRD
        // watch answers on its first list, or on its first error.
        if self.schema.wait_for(Option::is_some).await.is_err() {
            return;
        }
        loop {
            if !super::lease::until_held(&mut held).await {
                return;
            }
            let desired = Arc::clone(&rx.borrow_and_update());
            self.schema.borrow_and_update();
            self.sync(&desired).await;
            // At most one pass per MIN_INTERVAL; then wait for a change (of status or
            // of the CRD), or for the next failed write's retry.
            tokio::time::sleep(MIN_INTERVAL).await;
            let retry = self.retries.next();
            let news = tokio::select! {
                ok = news_or_retry(&mut rx, &mut held, retry) => ok,
                ok = self.schema.changed() => ok.is_ok(),
            };
            if !news {
                return;
            }
        }
    }

    /// One pass: writes every object whose status differs. True if any write failed.
    async fn sync(&mut self, desired: &Statuses) -> bool {
        let routability_declared = self.schema.borrow().is_some_and(|s| s.status_routability);
        let mut in_sync = HashMap::with_capacity(self.in_sync.len());
        let writes = self.shared.with(|store| {
            let mut out = Vec::new();
            for (name, s) in &desired.gateway_classes {
                if let Some(obj) = store.gateway_classes.get(name) {
                    let mut status = (*s.status).clone();
                    carry(
                        status.conditions.iter_mut().flatten(),
                        obj.status.as_ref().and_then(|x| x.conditions.as_deref()),
                    );
                    let server = obj.status.as_ref().map(to_value);
                    out.push(self.plan(
                        StatusKind::GatewayClass,
                        ObjectKey::new("", name.as_str()),
                        rv(&obj.metadata),
                        to_value(&status),
                        server,
                        None,
                    ));
                }
            }
            for (key, s) in &desired.gateways {
                if let Some(obj) = store.gateways.get(key) {
                    let mut status = (*s.status).clone();
                    let server = obj.status.as_ref();
                    carry(
                        status.conditions.iter_mut().flatten(),
                        server.and_then(|x| x.conditions.as_deref()),
                    );
                    for l in status.listeners.iter_mut().flatten() {
                        let prev = server
                            .and_then(|x| x.listeners.as_ref())
                            .and_then(|ls| ls.iter().find(|x| x.name == l.name));
                        carry(
                            l.conditions.iter_mut(),
                            prev.map(|p| p.conditions.as_slice()),
                        );
                    }
                    // routability (GEP-5093) on both sides, so they compare like with like;
                    // left out, and said so, where the CRD would refuse it.
                    let mut scopes: Vec<Option<String>> = desired
                        .address_routability
                        .get(key)
                        .map(|v| v.iter().cloned().map(Some).collect())
                        .unwrap_or_default();
                    if !routability_declared && !scopes.is_empty() {
                        scopes.clear();
                        note_left_out(status.conditions.iter_mut().flatten());
                    }
                    let server_scopes = store
                        .gateway_ext
                        .get(key)
                        .map(|e| e.status_routability.clone())
                        .unwrap_or_default();
                    out.push(self.plan(
                        StatusKind::Gateway,
                        key.clone(),
                        rv(&obj.metadata),
                        with_routability(to_value(&status), &scopes),
                        server.map(|s| with_routability(to_value(s), &server_scopes)),
                        None,
                    ));
                }
            }
            for (key, s) in &desired.listener_sets {
                if let Some(obj) = store.listener_sets.get(key) {
                    let mut status = (*s.status).clone();
                    let server = obj.status.as_ref();
                    carry(
                        status.conditions.iter_mut().flatten(),
                        server.and_then(|x| x.conditions.as_deref()),
                    );
                    for l in status.listeners.iter_mut().flatten() {
                        let prev = server
                            .and_then(|x| x.listeners.as_ref())
                            .and_then(|ls| ls.iter().find(|x| x.name == l.name));
                        carry(
                            l.conditions.iter_mut(),
                            prev.map(|p| p.conditions.as_slice()),
                        );
                    }
                    out.push(self.plan(
                        StatusKind::ListenerSet,
                        key.clone(),
                        rv(&obj.metadata),
                        to_value(&status),
                        server.map(to_value),
                        None,
                    ));
                }
            }
            // Every route kind's status has HTTPRoute's shape: (kind, key, desired,
            // the server's object, its status, its resourceVersion).
            type RouteRow<'a> = (
                StatusKind,
                &'a ObjectKey,
                &'a ObjectStatus<HttpRouteStatus>,
                Arc<dyn Any + Send + Sync>,
                Option<&'a HttpRouteStatus>,
                Option<u64>,
            );
            let mut routes: Vec<RouteRow<'_>> = Vec::new();
            for (kind, map, held) in [
                (
                    StatusKind::HttpRoute,
                    &desired.http_routes,
                    &store.http_routes,
                ),
                (
                    StatusKind::GrpcRoute,
                    &desired.grpc_routes,
                    &store.grpc_routes,
                ),
            ] {
                routes.extend(map.iter().filter_map(|(k, s)| {
                    let obj = held.get(k)?;
                    let any: Arc<dyn Any + Send + Sync> = Arc::clone(obj) as _;
                    Some((kind, k, s, any, obj.status.as_deref(), obj.resource_version))
                }));
            }
            routes.extend(desired.l4_routes.iter().filter_map(|((kind, k), s)| {
                let obj = store.l4_routes.get(&(*kind, k.clone()))?;
                let any: Arc<dyn Any + Send + Sync> = Arc::clone(obj) as _;
                Some((
                    StatusKind::L4(*kind),
                    k,
                    s,
                    any,
                    obj.status.as_ref(),
                    rv(&obj.metadata),
                ))
            }));
            let (mut skipped, mut compared) = (0usize, 0usize);
            for (kind, key, s, server_obj, server_status, server_rv) in routes {
                let id = (kind, key.clone());
                let agreed = InSync {
                    ours: Arc::clone(&s.status),
                    server: server_obj,
                };
                if let Some(was) = self.in_sync.get(&id)
                    && Arc::ptr_eq(&was.ours, &agreed.ours)
                    && Arc::ptr_eq(&was.server, &agreed.server)
                {
                    in_sync.insert(id, agreed);
                    skipped += 1;
                    continue;
                }
                compared += 1;
                let server: &[HttpRouteStatusParents] =
                    server_status.map_or(&[], |x| x.parents.as_slice());
                let (mine, others): (Vec<_>, Vec<_>) = server
                    .iter()
                    .partition(|p| p.controller_name == self.controller_name);
                let mut ours = s.status.parents.clone();
                for p in &mut ours {
                    let prev = mine.iter().find(|x| x.parent_ref == p.parent_ref);
                    carry(
                        p.conditions.iter_mut(),
                        prev.map(|x| x.conditions.as_slice()),
                    );
                }
                // `status.parents` is an atomic list: apply must carry the other
                // controllers' entries as the server holds them, and the
                // resourceVersion guards against overwriting a newer list.
                let mut parents: Vec<Value> = others.iter().map(to_value).collect();
                parents.extend(ours.iter().map(to_value));
                parents.truncate(MAX_PARENTS);
                let status = json!({ "parents": parents });
                let write = self.plan(
                    kind,
                    key.clone(),
                    server_rv,
                    to_value(&ours),
                    Some(to_value(&mine)),
                    Some(status),
                );
                if write.is_none() {
                    in_sync.insert(id, agreed);
                }
                out.push(write);
            }
            tracing::debug!(
                routes_skipped = skipped,
                routes_compared = compared,
                "status pass"
            );
            for row in super::policy_status::rows(desired, store, &self.controller_name) {
                out.push(self.plan(
                    StatusKind::BackendTlsPolicy,
                    row.key,
                    row.server_rv,
                    row.ours,
                    Some(row.mine),
                    Some(row.status),
                ));
            }
            out.into_iter().flatten().collect::<Vec<_>>()
        });
        self.in_sync = in_sync;
        // A write no longer needed stops backing off; one whose backoff runs waits.
        self.retries
            .retain(|id| writes.iter().any(|w| w.kind == id.0 && w.key == id.1));
        let now = tokio::time::Instant::now();
        let mut failed = false;
        for w in writes {
            if !self.retries.due(&(w.kind, w.key.clone()), now) {
                continue;
            }
            let result = self.send(&w).await;
            let outcome = match &result {
                Ok(_) => "ok",
                Err(kube::Error::Api(s)) if s.code == 409 => "conflict",
                Err(_) => "error",
            };
            counter!(aether_proxy::telemetry::STATUS_WRITES_TOTAL, "kind" => w.kind.as_str(), "result" => outcome)
                .increment(1);
            match result {
                Ok(new_rv) => {
                    tracing::debug!(kind = w.kind.as_str(), object = %w.key, "status written");
                    self.failures
                        .succeeded(w.kind.as_str(), &w.key, "status write");
                    self.retries.succeeded(&(w.kind, w.key.clone()));
                    self.written.insert((w.kind, w.key), (new_rv, w.ours));
                }
                Err(e) => {
                    // Forbidden, conflict, unreachable: retried with backoff, never in
                    // a tight loop, and logged once per change of error.
                    self.failures
                        .failed(w.kind.as_str(), &w.key, &e, "status write");
                    self.retries
                        .failed((w.kind, w.key.clone()), tokio::time::Instant::now());
                    failed = true;
                }
            }
        }
        failed
    }

    /// Decides whether an object needs a write. `ours` is what we want (for routes: our
    /// parents only), `server` the same part as the server holds it; `status` the full
    /// status to apply when it differs from `ours`.
    fn plan(
        &self,
        kind: StatusKind,
        key: ObjectKey,
        server_rv: Option<u64>,
        ours: Value,
        server: Option<Value>,
        status: Option<Value>,
    ) -> Option<Write> {
        let ours_cmp = strip_times(ours.clone());
        if server.map(strip_times).as_ref() == Some(&ours_cmp) {
            return None;
        }
        let ours_cmp = Fingerprint::of(&ours_cmp);
        if let Some((written_rv, written)) = self.written.get(&(kind, key.clone()))
            && *written == ours_cmp
            && server_rv.is_some_and(|rv| rv < *written_rv)
        {
            // The watch has not caught up with our own write yet.
            return None;
        }
        let mut metadata = json!({ "name": key.name() });
        if kind != StatusKind::GatewayClass {
            metadata["namespace"] = json!(key.namespace());
        }
        // Routes' status.parents (and policies' ancestors) is an atomic list shared with
        // other controllers.
        if kind.shared_with_other_controllers()
            && let Some(rv) = server_rv
        {
            metadata["resourceVersion"] = json!(rv.to_string());
        }
        let body = json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": kind.as_str(),
            "metadata": metadata,
            "status": status.unwrap_or(ours),
        });
        Some(Write {
            kind,
            key,
            ours: ours_cmp,
            body,
        })
    }

    /// Applies one status; returns the resourceVersion the server answered with.
    async fn send(&self, w: &Write) -> Result<u64, kube::Error> {
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let patch = Patch::Apply(&w.body);
        let meta = match w.kind {
            StatusKind::GatewayClass => {
                Api::<GatewayClass>::all(self.client.clone())
                    .patch_status(w.key.name(), &params, &patch)
                    .await?
                    .metadata
            }
            StatusKind::Gateway => {
                Api::<Gateway>::namespaced(self.client.clone(), w.key.namespace())
                    .patch_status(w.key.name(), &params, &patch)
                    .await?
                    .metadata
            }
            StatusKind::ListenerSet => {
                Api::<ListenerSet>::namespaced(self.client.clone(), w.key.namespace())
                    .patch_status(w.key.name(), &params, &patch)
                    .await?
                    .metadata
            }
            StatusKind::BackendTlsPolicy => {
                Api::<BackendTlsPolicy>::namespaced(self.client.clone(), w.key.namespace())
                    .patch_status(w.key.name(), &params, &patch)
                    .await?
                    .metadata
            }
            StatusKind::GrpcRoute => {
                Api::<GrpcRoute>::namespaced(self.client.clone(), w.key.namespace())
                    .patch_status(w.key.name(), &params, &patch)
                    .await?
                    .metadata
            }
            StatusKind::L4(kind) => {
                let gvk = GroupVersionKind::gvk("gateway.networking.k8s.io", "v1", kind.as_str());
                let plural = format!("{}s", kind.as_str().to_ascii_lowercase());
                let resource = ApiResource::from_gvk_with_plural(&gvk, &plural);
                Api::<DynamicObject>::namespaced_with(
                    self.client.clone(),
                    w.key.namespace(),
                    &resource,
                )
                .patch_status(w.key.name(), &params, &patch)
                .await?
                .metadata
            }
            StatusKind::HttpRoute => {
                Api::<HttpRoute>::namespaced(self.client.clone(), w.key.namespace())
                    .patch_status(w.key.name(), &params, &patch)
                    .await?
                    .metadata
            }
        };
        Ok(rv(&meta).unwrap_or(0))
    }
}

/// A 64-bit hash of a status as JSON. Two different statuses share one with odds of
/// 2^-64, and then only while the watch lags behind our write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Fingerprint(u64);

impl Fingerprint {
    fn of(status: &Value) -> Self {
        /// Feeds the serializer's output to the hasher: no string is built.
        struct Feed(std::hash::DefaultHasher);
        impl std::io::Write for Feed {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                std::hash::Hasher::write(&mut self.0, bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut feed = Feed(std::hash::DefaultHasher::new());
        // Writing a Value to a writer that never fails cannot fail.
        let _ = serde_json::to_writer(&mut feed, status);
        Fingerprint(std::hash::Hasher::finish(&feed.0))
    }
}

pub(super) fn rv(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Option<u64> {
    meta.resource_version.as_deref()?.parse().ok()
}

pub(super) fn to_value<T: Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

/// Says in `AddressesAssigned` that the addresses' routability was left out.
fn note_left_out<'a>(conditions: impl Iterator<Item = &'a mut Condition>) {
    for c in conditions.filter(|c| c.type_ == "AddressesAssigned") {
        c.message = format!("{}; {ROUTABILITY_LEFT_OUT}", c.message);
    }
}

/// Keeps the server's `lastTransitionTime` for conditions whose status is unchanged.
pub(super) fn carry<'a>(
    conditions: impl Iterator<Item = &'a mut Condition>,
    server: Option<&[Condition]>,
) {
    let server = server.unwrap_or_default();
    for c in conditions {
        if let Some(s) = server.iter().find(|s| s.type_ == c.type_)
            && s.status == c.status
        {
            c.last_transition_time = s.last_transition_time.clone();
        }
    }
}

fn strip_times(mut v: Value) -> Value {
    fn walk(v: &mut Value) {
        match v {
            Value::Object(m) => {
                m.remove("lastTransitionTime");
                m.values_mut().for_each(walk);
            }
            Value::Array(a) => a.iter_mut().for_each(walk),
            _ => {}
        }
    }
    walk(&mut v);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_ignored_but_nothing_else() {
        let a = json!({"conditions": [{"type": "Accepted", "status": "True", "lastTransitionTime": "2020-01-01T00:00:00Z"}]});
        let b = json!({"conditions": [{"type": "Accepted", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}]});
        let c = json!({"conditions": [{"type": "Accepted", "status": "False", "lastTransitionTime": "2020-01-01T00:00:00Z"}]});
        assert_eq!(strip_times(a.clone()), strip_times(b));
        assert_ne!(strip_times(a), strip_times(c));
    }

    #[test]
    fn a_fingerprint_tells_statuses_apart_as_equality_does() {
        let status = |reason: &str| {
            json!({"parents": [{"parentRef": {"name": "gw"}, "controllerName": "x",
                "conditions": [{"type": "Accepted", "status": "True", "reason": reason}]}]})
        };
        assert_eq!(
            Fingerprint::of(&status("Accepted")),
            Fingerprint::of(&status("Accepted").clone())
        );
        assert_ne!(
            Fingerprint::of(&status("Accepted")),
            Fingerprint::of(&status("NotAllowedByListeners"))
        );
        assert_ne!(Fingerprint::of(&json!({})), Fingerprint::of(&json!([])));
    }
}
