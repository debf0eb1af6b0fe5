//! BackendTLSPolicy: which Service ports are reached over TLS, with which CAs and names,
//! and the policy status the spec asks for.
//!
//! Policies are weighed oldest first (creation timestamp, then `namespace/name`), so the
//! one that takes precedence for a (Service, port name) claims it and later ones are
//! `Conflicted`. A policy that targets a Service but cannot be used (no valid CA, an
//! unsupported well-known set) still claims it and fails closed: its connections fail
//! and requests answer 5xx, never falling back to plaintext.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use aether_proxy::backend_tls::{self, Alpn, BackendTls, RootCertStore, SubjectAltName};
use aether_proxy::client_auth::{self, CertificateDer};
use gateway_api::backendtlspolicies::{
    BackendTlsPolicy, BackendTlsPolicyStatus, BackendTlsPolicyStatusAncestors,
    BackendTlsPolicyStatusAncestorsAncestorRef, BackendTlsPolicyValidation,
    BackendTlsPolicyValidationSubjectAltNamesType,
};
use gateway_api::httproutes::HttpRouteParentRefs;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use super::conditions as cond;
use super::gateway::{GATEWAY_GROUP, GatewayModel};
use crate::l4route::L4Kind;
use crate::status::ObjectStatus;
use crate::store::{CA_BUNDLE_KEY, ObjectKey, Store};

/// What a usable (or deliberately failing) policy turns into on the data plane.
struct Recipe {
    policy: Arc<str>,
    hostname: String,
    trust: Result<Arc<RootCertStore>, String>,
    sans: Vec<SubjectAltName>,
}

/// One policy's verdict, for its status.
struct Verdict {
    key: ObjectKey,
    generation: i64,
    accepted: Condition,
    resolved: Condition,
    services: BTreeSet<ObjectKey>,
}

/// Every policy of the Store, evaluated once per reconcile.
pub struct PolicyIndex {
    /// (Service, port name; `None` = every port) -> the policy that takes precedence.
    targets: BTreeMap<(ObjectKey, Option<String>), Arc<Recipe>>,
    /// Built data-plane TLS, shared by every route using the same port and protocol.
    built: BTreeMap<(usize, Alpn), Arc<BackendTls>>,
    verdicts: Vec<Verdict>,
}

impl PolicyIndex {
    pub fn new(store: &Store) -> Self {
        let mut ordered: Vec<(&ObjectKey, &BackendTlsPolicy)> = store
            .backend_tls_policies
            .iter()
            .map(|(k, p)| (k, &**p))
            .collect();
        ordered.sort_by_key(|(k, p)| {
            let created = p.metadata.creation_timestamp.as_ref();
            (created.map_or(0, |t| t.0.as_second()), *k)
        });
        let mut index = Self {
            targets: BTreeMap::new(),
            built: BTreeMap::new(),
            verdicts: Vec::new(),
        };
        for (key, policy) in ordered {
            index.add(store, key, policy);
        }
        index
    }

    fn add(&mut self, store: &Store, key: &ObjectKey, policy: &BackendTlsPolicy) {
        let generation = policy.metadata.generation.unwrap_or(1);
        let (trust, resolved) = trust(store, key.namespace(), &policy.spec.validation);
        let resolved = match resolved {
            None => cond::condition(
                "ResolvedRefs",
                true,
                "ResolvedRefs",
                "all references resolved",
                generation,
            ),
            Some((reason, msg)) => cond::condition("ResolvedRefs", false, reason, msg, generation),
        };
        let recipe = Arc::new(Recipe {
            policy: key.to_string().into(),
            hostname: policy.spec.validation.hostname.clone(),
            sans: sans(&policy.spec.validation),
            trust: trust.clone().map_err(|(_, msg)| msg),
        });
        let mut services = BTreeSet::new();
        let (mut claimed, mut missing) = (0, Vec::new());
        let mut lost_to: Option<Arc<str>> = None;
        for t in &policy.spec.target_refs {
            if !(t.group.is_empty() || t.group == "core") || t.kind != "Service" {
                missing.push(format!("{} {} is not a Service", t.kind, t.name));
                continue;
            }
            let svc_key = ObjectKey::new(key.namespace(), t.name.clone());
            let Some(svc) = store.services.get(&svc_key) else {
                missing.push(format!("Service {svc_key} not found"));
                continue;
            };
            if let Some(section) = &t.section_name {
                let has_port = svc
                    .spec
                    .as_ref()
                    .and_then(|s| s.ports.as_ref())
                    .is_some_and(|ps| ps.iter().any(|p| p.name.as_ref() == Some(section)));
                if !has_port {
                    missing.push(format!("Service {svc_key} has no port named {section}"));
                    continue;
                }
            }
            services.insert(svc_key.clone());
            let slot = (svc_key, t.section_name.clone());
            match self.targets.entry(slot) {
                Entry::Occupied(e) => {
                    lost_to.get_or_insert_with(|| Arc::clone(&e.get().policy));
                }
                Entry::Vacant(e) => {
                    e.insert(Arc::clone(&recipe));
                    claimed += 1;
                }
            }
        }
        let accepted = if let (0, Some(winner)) = (claimed, &lost_to) {
            let why = format!(
                "BackendTLSPolicy {winner} takes precedence for the same Service port (older, or first by namespace/name)"
            );
            cond::not_accepted(generation, "Conflicted", why)
        } else if claimed == 0 {
            let why = missing.join("; ");
            cond::not_accepted(generation, "TargetNotFound", why)
        } else if let Err((reason, msg)) = trust {
            cond::not_accepted(generation, reason, msg)
        } else if recipe_hostname_invalid(&recipe.hostname) {
            cond::not_accepted(
                generation,
                "Invalid",
                format!("hostname {:?} is not a DNS name", recipe.hostname),
            )
        } else {
            cond::accepted(generation, "BackendTLSPolicy")
        };
        self.verdicts.push(Verdict {
            key: key.clone(),
            generation,
            accepted,
            resolved,
            services,
        });
    }

    /// The TLS a Service port is reached with: a policy naming the port wins over one
    /// naming the whole Service. `alpn` is what the route kind and port speak.
    pub fn lookup(
        &mut self,
        service: &ObjectKey,
        port_name: Option<&str>,
        alpn: Alpn,
    ) -> Option<Arc<BackendTls>> {
        let specific =
            port_name.and_then(|n| self.targets.get(&(service.clone(), Some(n.to_owned()))));
        let recipe = specific.or_else(|| self.targets.get(&(service.clone(), None)))?;
        let id = Arc::as_ptr(recipe) as usize;
        if let Some(b) = self.built.get(&(id, alpn)) {
            return Some(Arc::clone(b));
        }
        let tls = match &recipe.trust {
            Ok(roots) => BackendTls::new(
                Arc::clone(&recipe.policy),
                &recipe.hostname,
                Arc::clone(roots),
                recipe.sans.clone(),
                alpn,
            )
            .unwrap_or_else(|e| {
                BackendTls::invalid(Arc::clone(&recipe.policy), &recipe.hostname, e.to_string())
            }),
            Err(why) => {
                BackendTls::invalid(Arc::clone(&recipe.policy), &recipe.hostname, why.as_str())
            }
        };
        let tls = Arc::new(tls);
        self.built.insert((id, alpn), Arc::clone(&tls));
        Some(tls)
    }

    /// Policy status: one ancestor per Gateway (of ours) whose HTTPRoutes, GRPCRoutes or
    /// TLSRoutes send traffic to a targeted Service.
    pub fn statuses(
        &self,
        store: &Store,
        controller_name: &str,
        gateways: &BTreeMap<ObjectKey, GatewayModel<'_>>,
        sets: &super::listenerset::ListenerSets,
    ) -> BTreeMap<ObjectKey, ObjectStatus<BackendTlsPolicyStatus>> {
        // Most configurations have no policy: then no route needs its parents resolved.
        if self.verdicts.is_empty() {
            return BTreeMap::new();
        }
        let targeted: BTreeSet<&ObjectKey> =
            self.verdicts.iter().flat_map(|v| &v.services).collect();
        // (route namespace, parentRefs, backendRefs as (group, kind, name, namespace)).
        type Ref<'a> = (Option<&'a str>, Option<&'a str>, &'a str, Option<&'a str>);
        let mut routes: Vec<(&str, &[HttpRouteParentRefs], Vec<Ref<'_>>)> = Vec::new();
        for (key, route) in store.http_routes.iter().chain(&store.grpc_routes) {
            let refs = route.spec.rules.iter().flat_map(|r| r.backend_refs.iter());
            let refs = refs.map(|b| {
                let (g, k) = (b.group.as_deref(), b.kind.as_deref());
                (g, k, &*b.name, b.namespace.as_deref())
            });
            routes.push((key.namespace(), &route.spec.parent_refs, refs.collect()));
        }
        // TLSRoutes: the policy applies to their Terminate listeners' backends.
        for ((kind, key), route) in &store.l4_routes {
            if *kind != L4Kind::Tls {
                continue;
            }
            let refs = route.spec.rules.iter();
            let refs = refs.flat_map(|r| r.backend_refs.iter().flatten());
            let refs = refs.map(|b| {
                let (g, k) = (b.group.as_deref(), b.kind.as_deref());
                (g, k, b.name.as_str(), b.namespace.as_deref())
            });
            let parents = route.spec.parent_refs.as_deref().unwrap_or_default();
            routes.push((key.namespace(), parents, refs.collect()));
        }
        let mut behind: BTreeMap<ObjectKey, BTreeSet<ObjectKey>> = BTreeMap::new();
        for (ns, parents, refs) in routes {
            let services: Vec<ObjectKey> = refs
                .into_iter()
                .filter(|(group, kind, _, _)| {
                    matches!(group.unwrap_or(""), "" | "core")
                        && kind.unwrap_or("Service") == "Service"
                })
                .map(|(_, _, name, namespace)| ObjectKey::new(namespace.unwrap_or(ns), name))
                .filter(|svc| targeted.contains(svc))
                .collect();
            if services.is_empty() {
                continue;
            }
            let parents: Vec<ObjectKey> = parents
                .iter()
                .filter_map(|p| super::parent::parent_target(sets, p, ns, gateways))
                .map(|t| t.gateway)
                .collect();
            for svc in services {
                behind
                    .entry(svc)
                    .or_default()
                    .extend(parents.iter().cloned());
            }
        }
        self.verdicts
            .iter()
            .map(|v| {
                let ancestors: BTreeSet<&ObjectKey> = v
                    .services
                    .iter()
                    .filter_map(|s| behind.get(s))
                    .flatten()
                    .collect();
                let ancestors = ancestors
                    .into_iter()
                    .map(|gw| BackendTlsPolicyStatusAncestors {
                        ancestor_ref: BackendTlsPolicyStatusAncestorsAncestorRef {
                            group: Some(GATEWAY_GROUP.to_owned()),
                            kind: Some("Gateway".to_owned()),
                            name: gw.name().to_string(),
                            namespace: Some(gw.namespace().to_string()),
                            port: None,
                            section_name: None,
                        },
                        conditions: vec![v.accepted.clone(), v.resolved.clone()],
                        controller_name: controller_name.to_owned(),
                    })
                    .collect();
                (
                    v.key.clone(),
                    ObjectStatus::new(v.generation, BackendTlsPolicyStatus { ancestors }),
                )
            })
            .collect()
    }
}

fn recipe_hostname_invalid(hostname: &str) -> bool {
    hostname.is_empty() || hostname.parse::<std::net::IpAddr>().is_ok()
}

fn sans(v: &BackendTlsPolicyValidation) -> Vec<SubjectAltName> {
    v.subject_alt_names
        .iter()
        .flatten()
        .filter_map(|s| match s.r#type {
            BackendTlsPolicyValidationSubjectAltNamesType::Hostname => {
                s.hostname.clone().map(SubjectAltName::Hostname)
            }
            BackendTlsPolicyValidationSubjectAltNamesType::Uri => {
                s.uri.clone().map(SubjectAltName::Uri)
            }
        })
        .collect()
}

type Problem = (&'static str, String);

/// The roots a policy trusts, or why it has none (an Accepted=False reason), and the
/// first unresolvable reference (a ResolvedRefs=False reason).
fn trust(
    store: &Store,
    namespace: &str,
    v: &BackendTlsPolicyValidation,
) -> (Result<Arc<RootCertStore>, Problem>, Option<Problem>) {
    let refs = v.ca_certificate_refs.as_deref().unwrap_or_default();
    match v.well_known_ca_certificates.as_deref() {
        None | Some("") => {}
        Some(_) if !refs.is_empty() => {
            let why = "caCertificateRefs and wellKnownCACertificates are exclusive";
            return (Err(("Invalid", why.to_owned())), None);
        }
        Some("System") => return (Ok(backend_tls::system_roots()), None),
        Some(other) => {
            let why = format!("wellKnownCACertificates {other:?} is not supported; System is");
            return (Err(("Invalid", why)), None);
        }
    }
    let mut certs: Vec<CertificateDer<'static>> = Vec::new();
    let mut problem: Option<Problem> = None;
    for r in refs {
        let found = if !(r.group.is_empty() || r.group == "core") || r.kind != "ConfigMap" {
            Err((
                "InvalidKind",
                format!(
                    "caCertificateRef {}/{} {} is not a ConfigMap",
                    r.group, r.kind, r.name
                ),
            ))
        } else {
            config_map_bundle(store, namespace, &r.name)
        };
        match found {
            Ok(mut c) => certs.append(&mut c),
            Err(p) => {
                problem.get_or_insert(p);
            }
        }
    }
    if certs.is_empty() {
        let why = problem.as_ref().map_or_else(
            || "no caCertificateRefs and no wellKnownCACertificates".to_owned(),
            |(_, m)| m.clone(),
        );
        return (Err(("NoValidCACertificate", why)), problem);
    }
    match backend_tls::roots(certs) {
        Ok(roots) => (Ok(roots), problem),
        Err(e) => {
            let p = (
                "InvalidCACertificateRef",
                format!("CA certificates are not usable: {e}"),
            );
            (Err(("NoValidCACertificate", p.1.clone())), Some(p))
        }
    }
}

fn config_map_bundle(
    store: &Store,
    namespace: &str,
    name: &str,
) -> Result<Vec<CertificateDer<'static>>, Problem> {
    let key = ObjectKey::new(namespace, name);
    let invalid = |why: String| ("InvalidCACertificateRef", why);
    let cm = store
        .config_maps
        .get(&key)
        .ok_or_else(|| invalid(format!("ConfigMap {key} not found")))?;
    let pem = cm
        .data
        .as_ref()
        .and_then(|d| d.get(CA_BUNDLE_KEY))
        .ok_or_else(|| invalid(format!("ConfigMap {key} has no {CA_BUNDLE_KEY}")))?;
    client_auth::ca_bundle(pem.as_bytes())
        .map_err(|e| invalid(format!("ConfigMap {key} {CA_BUNDLE_KEY}: {e}")))
}

#[cfg(test)]
#[path = "backend_tls_tests.rs"]
mod tests;
