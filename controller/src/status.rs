//! Computed status per object, in the shape Kubernetes mode will write, plus the two
//! post-reconcile steps: stamping transition times and recording bind failures.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use aether_proxy::{BindFailure, Snapshot};
use gateway_api::backendtlspolicies::BackendTlsPolicyStatus;
use gateway_api::gatewayclasses::GatewayClassStatus;
use gateway_api::gateways::GatewayStatus;
use gateway_api::httproutes::HttpRouteStatus;
use gateway_api::listenersets::ListenerSetStatus;
use imbl::OrdMap;
use imbl::ordmap::DiffItem;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use serde::Serialize;
use serde_json::{Value, json};

use crate::l4route::L4Kind;
use crate::reconcile::conditions as cond;
use crate::store::ObjectKey;

/// An object's status, shared by `Arc`: the incremental reconciler hands out the same
/// status for an object that did not change, and publishing copies pointers.
#[derive(Debug, Clone)]
pub struct ObjectStatus<S> {
    pub generation: i64,
    pub status: Arc<S>,
}

/// Equal contents, with the shared status (the common case in a diff of two runs'
/// maps) answered by a pointer comparison.
impl<S: PartialEq> PartialEq for ObjectStatus<S> {
    fn eq(&self, other: &Self) -> bool {
        self.generation == other.generation
            && (Arc::ptr_eq(&self.status, &other.status) || self.status == other.status)
    }
}

impl<S> ObjectStatus<S> {
    pub fn new(generation: i64, status: S) -> Self {
        Self {
            generation,
            status: Arc::new(status),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Statuses {
    pub gateway_classes: BTreeMap<String, ObjectStatus<GatewayClassStatus>>,
    pub gateways: BTreeMap<ObjectKey, ObjectStatus<GatewayStatus>>,
    /// Route statuses are persistent maps: the reconciler patches the routes a change
    /// touched, and copies are O(1), however many routes there are.
    pub http_routes: RouteStatuses,
    /// GRPCRoute status has HTTPRoute's shape exactly.
    pub grpc_routes: RouteStatuses,
    /// GEP-5093: the routability of each Gateway `status.addresses` entry, index for
    /// index (the typed status has no field for it; writers add it).
    pub address_routability: BTreeMap<ObjectKey, Vec<String>>,
    /// TCPRoutes, UDPRoutes and TLSRoutes; their status has HTTPRoute's shape.
    pub l4_routes: BTreeMap<(L4Kind, ObjectKey), ObjectStatus<HttpRouteStatus>>,
    /// ListenerSets whose parent is one of our Gateways.
    pub listener_sets: BTreeMap<ObjectKey, ObjectStatus<ListenerSetStatus>>,
    pub backend_tls_policies: BTreeMap<ObjectKey, ObjectStatus<BackendTlsPolicyStatus>>,
}

/// Adds `routability` to each entry of a serialized status's `addresses`.
pub fn with_routability(mut status: Value, scopes: &[Option<String>]) -> Value {
    if let Some(addresses) = status.get_mut("addresses").and_then(Value::as_array_mut) {
        for (a, scope) in addresses.iter_mut().zip(scopes) {
            if let (Some(obj), Some(scope)) = (a.as_object_mut(), scope) {
                obj.insert("routability".to_owned(), Value::String(scope.clone()));
            }
        }
    }
    status
}

/// HTTPRoute or GRPCRoute statuses by route.
pub type RouteStatuses = OrdMap<ObjectKey, ObjectStatus<HttpRouteStatus>>;

const API_VERSION: &str = "gateway.networking.k8s.io/v1";

impl Statuses {
    /// One Kubernetes-shaped object per GatewayClass, Gateway and route.
    pub fn items(&self) -> Vec<Value> {
        fn item<S: Serialize>(
            kind: &str,
            name: &str,
            namespace: Option<&str>,
            s: &ObjectStatus<S>,
        ) -> Value {
            let mut metadata = json!({ "name": name, "generation": s.generation });
            if let Some(ns) = namespace {
                metadata["namespace"] = json!(ns);
            }
            json!({
                "apiVersion": API_VERSION,
                "kind": kind,
                "metadata": metadata,
                "status": serde_json::to_value(&s.status).unwrap_or(Value::Null),
            })
        }
        let classes = self
            .gateway_classes
            .iter()
            .map(|(n, s)| item("GatewayClass", n, None, s));
        let gateways = self.gateways.iter().map(|(k, s)| {
            let mut v = item("Gateway", k.name(), Some(k.namespace()), s);
            if let Some(scopes) = self.address_routability.get(k) {
                let scopes: Vec<Option<String>> = scopes.iter().cloned().map(Some).collect();
                v["status"] = with_routability(v["status"].take(), &scopes);
            }
            v
        });
        let routes = self
            .http_routes
            .iter()
            .map(|(k, s)| item("HTTPRoute", k.name(), Some(k.namespace()), s));
        let grpc_routes = self
            .grpc_routes
            .iter()
            .map(|(k, s)| item("GRPCRoute", k.name(), Some(k.namespace()), s));
        let l4 = self
            .l4_routes
            .iter()
            .map(|((kind, k), s)| item(kind.as_str(), k.name(), Some(k.namespace()), s));
        let sets = self
            .listener_sets
            .iter()
            .map(|(k, s)| item("ListenerSet", k.name(), Some(k.namespace()), s));
        let policies = self
            .backend_tls_policies
            .iter()
            .map(|(k, s)| item("BackendTLSPolicy", k.name(), Some(k.namespace()), s));
        classes
            .chain(gateways)
            .chain(sets)
            .chain(routes)
            .chain(grpc_routes)
            .chain(l4)
            .chain(policies)
            .collect()
    }

    /// Gives every condition a real `lastTransitionTime`: the previous one when the
    /// condition's status is unchanged, `now` otherwise. `previous` is what was last
    /// published and `previous_input` what it was stamped from: an entry that still
    /// holds the very status it held then is taken from `previous` as it is, so an
    /// unchanged object costs a pointer copy.
    pub fn carry_transition_times(
        &mut self,
        previous_input: &Statuses,
        previous: &Statuses,
        now: Timestamp,
    ) {
        carry(
            &mut self.gateway_classes,
            &previous_input.gateway_classes,
            &previous.gateway_classes,
            |s, prev| {
                let prev = prev.and_then(|p| p.conditions.as_deref());
                stamp(
                    s.conditions.iter_mut().flatten(),
                    prev.unwrap_or_default(),
                    now,
                );
            },
        );
        carry(
            &mut self.gateways,
            &previous_input.gateways,
            &previous.gateways,
            |s, prev| {
                stamp(
                    s.conditions.iter_mut().flatten(),
                    prev.and_then(|p| p.conditions.as_deref())
                        .unwrap_or_default(),
                    now,
                );
                for l in s.listeners.iter_mut().flatten() {
                    let prev_l = prev
                        .and_then(|p| p.listeners.as_ref())
                        .and_then(|ls| ls.iter().find(|x| x.name == l.name))
                        .map(|x| x.conditions.as_slice());
                    stamp(l.conditions.iter_mut(), prev_l.unwrap_or_default(), now);
                }
            },
        );
        carry(
            &mut self.listener_sets,
            &previous_input.listener_sets,
            &previous.listener_sets,
            |s, prev| {
                stamp(
                    s.conditions.iter_mut().flatten(),
                    prev.and_then(|p| p.conditions.as_deref())
                        .unwrap_or_default(),
                    now,
                );
                for l in s.listeners.iter_mut().flatten() {
                    let prev_l = prev
                        .and_then(|p| p.listeners.as_ref())
                        .and_then(|ls| ls.iter().find(|x| x.name == l.name))
                        .map(|x| x.conditions.as_slice());
                    stamp(l.conditions.iter_mut(), prev_l.unwrap_or_default(), now);
                }
            },
        );
        carry(
            &mut self.backend_tls_policies,
            &previous_input.backend_tls_policies,
            &previous.backend_tls_policies,
            |s, prev| {
                for a in &mut s.ancestors {
                    let prev_a = prev
                        .and_then(|p| {
                            p.ancestors
                                .iter()
                                .find(|x| x.ancestor_ref == a.ancestor_ref)
                        })
                        .map(|x| x.conditions.as_slice());
                    stamp(a.conditions.iter_mut(), prev_a.unwrap_or_default(), now);
                }
            },
        );
        let route = |s: &mut HttpRouteStatus, prev: Option<&HttpRouteStatus>| {
            for parent in &mut s.parents {
                let prev_p = prev
                    .and_then(|p| p.parents.iter().find(|x| x.parent_ref == parent.parent_ref))
                    .map(|x| x.conditions.as_slice());
                stamp(
                    parent.conditions.iter_mut(),
                    prev_p.unwrap_or_default(),
                    now,
                );
            }
        };
        carry_changes(
            &mut self.http_routes,
            &previous_input.http_routes,
            &previous.http_routes,
            route,
        );
        carry_changes(
            &mut self.grpc_routes,
            &previous_input.grpc_routes,
            &previous.grpc_routes,
            route,
        );
        carry(
            &mut self.l4_routes,
            &previous_input.l4_routes,
            &previous.l4_routes,
            route,
        );
    }

    /// Records sockets that could not be bound on the listeners they belong to.
    pub fn mark_bind_failures(&mut self, snapshot: &Snapshot, failures: &[BindFailure]) {
        for f in failures {
            // UDP sockets have their own map; a TCP socket at the same address wins.
            let Some(listener) = snapshot
                .listener(&f.addr)
                .or_else(|| snapshot.udp.get(&f.addr).map(AsRef::as_ref))
            else {
                continue;
            };
            self.mark_set_bind_failures(&listener.sections, f);
            let Some((ns, name)) = listener.gateway.split_once('/') else {
                continue;
            };
            let Some(gw) = self.gateways.get_mut(&ObjectKey::new(ns, name)) else {
                continue;
            };
            let generation = gw.generation;
            let status = Arc::make_mut(&mut gw.status);
            for l in status.listeners.iter_mut().flatten() {
                if !listener.sections.iter().any(|s| **s == l.name) {
                    continue;
                }
                let msg = format!("cannot bind {}: {}", f.addr, f.reason);
                replace(
                    &mut l.conditions,
                    cond::not_accepted(generation, "PortUnavailable", msg.clone()),
                );
                replace(
                    &mut l.conditions,
                    cond::not_programmed(generation, "Invalid", msg),
                );
            }
            let any_programmed = status.listeners.iter().flatten().any(|l| {
                l.conditions
                    .iter()
                    .any(|c| c.type_ == "Programmed" && c.status == "True")
            });
            if !any_programmed && let Some(conds) = status.conditions.as_mut() {
                replace(
                    conds,
                    cond::not_programmed(
                        generation,
                        "Invalid",
                        "no listener of this Gateway could be bound",
                    ),
                );
            }
        }
    }
}

impl Statuses {
    /// A bind failure on ListenerSet listeners (sections `namespace/set/listener`).
    fn mark_set_bind_failures(&mut self, sections: &[std::sync::Arc<str>], f: &BindFailure) {
        for section in sections {
            let mut parts = section.splitn(3, '/');
            let (Some(ns), Some(set), Some(name)) = (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let Some(ls) = self.listener_sets.get_mut(&ObjectKey::new(ns, set)) else {
                continue;
            };
            let generation = ls.generation;
            let msg = format!("cannot bind {}: {}", f.addr, f.reason);
            let status = Arc::make_mut(&mut ls.status);
            for l in status
                .listeners
                .iter_mut()
                .flatten()
                .filter(|l| l.name == name)
            {
                replace(
                    &mut l.conditions,
                    cond::not_accepted(generation, "PortUnavailable", msg.clone()),
                );
                replace(
                    &mut l.conditions,
                    cond::not_programmed(generation, "Invalid", msg.clone()),
                );
            }
            let any_programmed = status.listeners.iter().flatten().any(|l| {
                l.conditions
                    .iter()
                    .any(|c| c.type_ == "Programmed" && c.status == "True")
            });
            if !any_programmed && let Some(conds) = status.conditions.as_mut() {
                replace(
                    conds,
                    cond::not_programmed(
                        generation,
                        "ListenersNotValid",
                        "no listener of this ListenerSet could be bound",
                    ),
                );
            }
        }
    }
}

/// Stamps each status of `current` against its previously published version, or takes
/// that version whole when the status is the one it was stamped from. The three maps are
/// walked together in key order: no lookup per entry.
fn carry<K: Ord, S: Clone>(
    current: &mut BTreeMap<K, ObjectStatus<S>>,
    previous_input: &BTreeMap<K, ObjectStatus<S>>,
    previous: &BTreeMap<K, ObjectStatus<S>>,
    mut stamp_one: impl FnMut(&mut S, Option<&S>),
) {
    let mut inputs = previous_input.iter().peekable();
    let mut published = previous.iter().peekable();
    for (key, s) in current.iter_mut() {
        let input = seek(&mut inputs, key);
        let prev = seek(&mut published, key);
        if let (Some(input), Some(prev)) = (input, prev)
            && Arc::ptr_eq(&input.status, &s.status)
            && input.generation == s.generation
        {
            s.status = Arc::clone(&prev.status);
            continue;
        }
        stamp_one(Arc::make_mut(&mut s.status), prev.map(|p| &*p.status));
    }
}

/// [`carry`] for persistent maps, at the cost of what changed: `previous` (the stamped
/// `previous_input`, key for key) patched with the entries that differ between
/// `previous_input` and `current`, found by a diff that skips the subtrees they share.
fn carry_changes<K: Ord + Clone, S: Clone + PartialEq>(
    current: &mut OrdMap<K, ObjectStatus<S>>,
    previous_input: &OrdMap<K, ObjectStatus<S>>,
    previous: &OrdMap<K, ObjectStatus<S>>,
    mut stamp_one: impl FnMut(&mut S, Option<&S>),
) {
    let mut out = previous.clone();
    let before = out.len();
    // A stamp depends only on the status and the one published before it: entries
    // sharing both (the reconciler shares equal statuses) share the stamped copy too.
    // Keyed by address: every status named here is held by the maps until the end.
    let mut stamped: HashMap<(*const S, *const S), Arc<S>> = HashMap::new();
    for change in previous_input.diff(current) {
        let (key, s) = match change {
            DiffItem::Remove(key, _) => {
                out.remove(key);
                continue;
            }
            DiffItem::Add(key, s) | DiffItem::Update { new: (key, s), .. } => (key, s),
        };
        let prev = previous.get(key).map(|p| &p.status);
        let from = (
            Arc::as_ptr(&s.status),
            prev.map_or(std::ptr::null(), Arc::as_ptr),
        );
        let status = stamped.entry(from).or_insert_with(|| {
            let mut status = S::clone(&s.status);
            stamp_one(&mut status, prev.map(|p| &**p));
            Arc::new(status)
        });
        let s = ObjectStatus {
            generation: s.generation,
            status: Arc::clone(status),
        };
        out.insert(key.clone(), s);
    }
    crate::store::repack_grown(&mut out, before);
    *current = out;
}

/// The value at `key` in a key-ordered walk, skipping the smaller keys; called with
/// ascending keys.
fn seek<'a, K: Ord + 'a, V: 'a>(
    walk: &mut std::iter::Peekable<impl Iterator<Item = (&'a K, &'a V)>>,
    key: &K,
) -> Option<&'a V> {
    while walk.next_if(|(k, _)| *k < key).is_some() {}
    walk.next_if(|(k, _)| *k == key).map(|(_, v)| v)
}

fn replace(conditions: &mut Vec<Condition>, c: Condition) {
    match conditions.iter_mut().find(|x| x.type_ == c.type_) {
        Some(slot) => *slot = c,
        None => conditions.push(c),
    }
}

fn stamp<'a>(
    conditions: impl Iterator<Item = &'a mut Condition>,
    previous: &[Condition],
    now: Timestamp,
) {
    for c in conditions {
        c.last_transition_time = match previous.iter().find(|p| p.type_ == c.type_) {
            Some(p) if p.status == c.status => p.last_transition_time.clone(),
            _ => Time(now),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(accepted: bool) -> ObjectStatus<GatewayClassStatus> {
        ObjectStatus::new(
            1,
            GatewayClassStatus {
                conditions: Some(vec![cond::condition(
                    "Accepted", accepted, "Accepted", "", 1,
                )]),
                supported_features: None,
            },
        )
    }

    fn times(s: &Statuses) -> Vec<(String, Timestamp)> {
        s.gateway_classes
            .iter()
            .map(|(k, s)| {
                let c = &s.status.conditions.as_deref().unwrap_or_default()[0];
                (k.clone(), c.last_transition_time.0)
            })
            .collect()
    }

    /// The walk in key order must pair each status with its own previous version while
    /// objects come and go on both sides of it.
    #[test]
    fn transition_times_follow_each_object_across_adds_and_removes() {
        let t0 = Timestamp::from_second(1_000).unwrap();
        let t1 = Timestamp::from_second(2_000).unwrap();
        let mut first = Statuses::default();
        for name in ["b", "d", "f"] {
            first.gateway_classes.insert(name.to_owned(), class(true));
        }
        let input = first.clone();
        first.carry_transition_times(&Statuses::default(), &Statuses::default(), t0);
        let published = first;

        // "a" and "e" are new, "b" went, "d" is handed out again unchanged, "f" flipped.
        let mut next = Statuses::default();
        next.gateway_classes.insert("a".to_owned(), class(true));
        next.gateway_classes
            .insert("d".to_owned(), input.gateway_classes["d"].clone());
        next.gateway_classes.insert("e".to_owned(), class(true));
        next.gateway_classes.insert("f".to_owned(), class(false));
        next.carry_transition_times(&input, &published, t1);

        assert_eq!(
            times(&next),
            [
                ("a".to_owned(), t1),
                ("d".to_owned(), t0),
                ("e".to_owned(), t1),
                ("f".to_owned(), t1),
            ]
        );
        // Unchanged and handed out again: the very status published before.
        assert!(Arc::ptr_eq(
            &next.gateway_classes["d"].status,
            &published.gateway_classes["d"].status
        ));
    }

    fn route(accepted: bool) -> ObjectStatus<HttpRouteStatus> {
        use gateway_api::httproutes::{HttpRouteStatusParents, HttpRouteStatusParentsParentRef};
        ObjectStatus::new(
            1,
            HttpRouteStatus {
                parents: vec![HttpRouteStatusParents {
                    conditions: vec![cond::condition("Accepted", accepted, "Accepted", "", 1)],
                    controller_name: "aether.io/edge".to_owned(),
                    parent_ref: HttpRouteStatusParentsParentRef {
                        name: "gw".to_owned(),
                        ..Default::default()
                    },
                }],
            },
        )
    }

    fn route_times(s: &Statuses) -> Vec<(String, Timestamp)> {
        s.http_routes
            .iter()
            .map(|(k, s)| {
                let c = &s.status.parents[0].conditions[0];
                (k.name().to_string(), c.last_transition_time.0)
            })
            .collect()
    }

    /// Route statuses are carried by a diff of persistent maps: an entry the diff skips
    /// must come out exactly as published, one it reports stamped afresh.
    #[test]
    fn route_transition_times_follow_only_what_changed() {
        let t0 = Timestamp::from_second(1_000).unwrap();
        let t1 = Timestamp::from_second(2_000).unwrap();
        let key = |n: &str| ObjectKey::new("default", n);
        let mut first = Statuses::default();
        for name in ["b", "d", "f", "g"] {
            first.http_routes.insert(key(name), route(true));
        }
        let input = first.clone();
        first.carry_transition_times(&Statuses::default(), &Statuses::default(), t0);
        let published = first;
        assert_eq!(route_times(&published).len(), 4);

        // From the last input: "a" added, "b" removed, "f" flipped, "g" replaced by an
        // equal status (a new allocation), "d" untouched.
        let mut next = input.clone();
        next.http_routes.insert(key("a"), route(true));
        next.http_routes.remove(&key("b"));
        next.http_routes.insert(key("f"), route(false));
        next.http_routes.insert(key("g"), route(true));
        next.carry_transition_times(&input, &published, t1);

        let name = |n: &str| n.to_owned();
        assert_eq!(
            route_times(&next),
            [
                (name("a"), t1),
                (name("d"), t0),
                (name("f"), t1),
                (name("g"), t0)
            ]
        );
        for n in ["d", "g"] {
            assert!(Arc::ptr_eq(
                &next.http_routes[&key(n)].status,
                &published.http_routes[&key(n)].status
            ));
        }
    }

    /// Entries handed the same status (the reconciler shares equal ones) come out
    /// sharing one stamped copy; an equal status of its own is stamped on its own.
    #[test]
    fn alike_routes_share_one_stamped_status() {
        let t0 = Timestamp::from_second(1_000).unwrap();
        let key = |n: &str| ObjectKey::new("default", n);
        let shared = route(true);
        let mut s = Statuses::default();
        for name in ["a", "b", "c"] {
            s.http_routes.insert(key(name), shared.clone());
        }
        s.http_routes.insert(key("d"), route(true));
        s.carry_transition_times(&Statuses::default(), &Statuses::default(), t0);
        let stamped = |n: &str| &s.http_routes[&key(n)].status;
        assert!(Arc::ptr_eq(stamped("a"), stamped("c")));
        assert!(!Arc::ptr_eq(stamped("a"), &shared.status));
        assert!(!Arc::ptr_eq(stamped("a"), stamped("d")));
        assert!(route_times(&s).iter().all(|(_, t)| *t == t0));
    }
}
