//! ListenerSets (GEP-1713): which ListenerSets a Gateway takes (`allowedListeners`),
//! their listeners in the spec's precedence order, and the status of each ListenerSet.
//!
//! A taken ListenerSet's listeners become listeners of the parent Gateway (same
//! address, same conflict rules) tagged with the set they come from, so everything
//! downstream (attachment, snapshot, Kubernetes Services) handles them unchanged.

use std::collections::BTreeMap;

use gateway_api::gateways::{
    Gateway, GatewayAllowedListenersNamespacesFrom, GatewayListeners,
    GatewayListenersAllowedRoutesNamespacesSelector,
};
use gateway_api::listenersets::{
    ListenerSet, ListenerSetStatus, ListenerSetStatusListeners,
    ListenerSetStatusListenersSupportedKinds,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use super::address::AddressError;
use super::conditions as cond;
use super::gateway::{GATEWAY_GROUP, GatewayModel, ListenerModel, selector_matches};
use crate::status::ObjectStatus;
use crate::store::{KeyParts, ObjectKey, Store};

/// A ListenerSet a Gateway takes, with its listeners in the Gateway's listener type
/// (the two share one schema).
pub struct AttachedSet {
    pub key: ObjectKey,
    pub listeners: Vec<GatewayListeners>,
}

/// Why a ListenerSet whose parent is one of our Gateways is not taken.
enum Refusal {
    NotAllowed(String),
    Invalid(String),
}

struct Judged {
    gateway: ObjectKey,
    generation: i64,
    verdict: Result<(), Refusal>,
}

#[derive(Default)]
pub struct ListenerSets {
    /// Per Gateway, the ListenerSets it takes, in precedence order (oldest first, then
    /// `namespace/name`).
    attached: BTreeMap<ObjectKey, Vec<AttachedSet>>,
    /// Every ListenerSet naming one of our Gateways, by its key.
    judged: BTreeMap<ObjectKey, Judged>,
}

impl ListenerSets {
    pub fn for_gateway(&self, gateway: &ObjectKey) -> &[AttachedSet] {
        self.attached.get(gateway).map_or(&[], Vec::as_slice)
    }

    /// The Gateway a ListenerSet parentRef resolves to, if the set exists and names
    /// one of our Gateways (taken or not).
    /// Returns the set's key as stored (to clone its shared strings) and the Gateway's.
    pub fn parent_of(&self, set: &dyn KeyParts) -> Option<(&ObjectKey, &ObjectKey)> {
        self.judged.get_key_value(set).map(|(k, j)| (k, &j.gateway))
    }
}

/// Judges every ListenerSet whose parentRef names one of `gateways` (ours).
pub fn collect(store: &Store, gateways: &[(&ObjectKey, &Gateway)]) -> ListenerSets {
    let mut out = ListenerSets::default();
    let mut taken: Vec<(i64, ObjectKey, AttachedSet)> = Vec::new();
    let ours: BTreeMap<&ObjectKey, &Gateway> = gateways.iter().copied().collect();
    for (key, ls) in &store.listener_sets {
        let Some(gw_key) = parent_key(key, ls) else {
            continue;
        };
        let Some(gw) = ours.get(&gw_key) else {
            continue;
        };
        let verdict = allowed(store, gw, &gw_key, key.namespace()).and_then(|()| {
            // Same schema, different generated types: a round trip converts them.
            serde_json::to_value(&ls.spec.listeners)
                .and_then(serde_json::from_value::<Vec<GatewayListeners>>)
                .map_err(|e| Refusal::Invalid(format!("listeners can't be read: {e}")))
        });
        let verdict = verdict.map(|listeners| {
            let created = ls
                .metadata
                .creation_timestamp
                .as_ref()
                .map_or(0, |t| t.0.as_second());
            taken.push((
                created,
                gw_key.clone(),
                AttachedSet {
                    key: key.clone(),
                    listeners,
                },
            ));
        });
        out.judged.insert(
            key.clone(),
            Judged {
                gateway: gw_key,
                generation: ls.metadata.generation.unwrap_or(1),
                verdict,
            },
        );
    }
    taken.sort_by(|a, b| (a.0, &a.2.key).cmp(&(b.0, &b.2.key)));
    for (_, gw, set) in taken {
        out.attached.entry(gw).or_default().push(set);
    }
    out
}

fn parent_key(key: &ObjectKey, ls: &ListenerSet) -> Option<ObjectKey> {
    let p = &ls.spec.parent_ref;
    let group = p.group.as_deref().unwrap_or(GATEWAY_GROUP);
    let kind = p.kind.as_deref().unwrap_or("Gateway");
    (group == GATEWAY_GROUP && kind == "Gateway").then(|| {
        ObjectKey::new(
            p.namespace.as_deref().unwrap_or(key.namespace()),
            p.name.as_str(),
        )
    })
}

/// Does the Gateway's `allowedListeners` admit ListenerSets from `namespace`? The
/// default is None: a Gateway takes no ListenerSet unless it says so.
fn allowed(
    store: &Store,
    gw: &Gateway,
    gw_key: &ObjectKey,
    namespace: &str,
) -> Result<(), Refusal> {
    let ns = gw
        .spec
        .allowed_listeners
        .as_ref()
        .and_then(|a| a.namespaces.as_ref());
    let ok = match ns.and_then(|n| n.from.as_ref()) {
        None | Some(GatewayAllowedListenersNamespacesFrom::None) => false,
        Some(GatewayAllowedListenersNamespacesFrom::Same) => namespace == gw_key.namespace(),
        Some(GatewayAllowedListenersNamespacesFrom::All) => true,
        Some(GatewayAllowedListenersNamespacesFrom::Selector) => ns
            .and_then(|n| n.selector.as_ref())
            .and_then(|s| {
                serde_json::to_value(s)
                    .and_then(
                        serde_json::from_value::<GatewayListenersAllowedRoutesNamespacesSelector>,
                    )
                    .ok()
            })
            .is_some_and(|sel| selector_matches(&sel, &store.namespace_labels(namespace))),
    };
    if ok {
        Ok(())
    } else {
        Err(Refusal::NotAllowed(format!(
            "Gateway {gw_key}'s allowedListeners does not admit ListenerSets from namespace {namespace}"
        )))
    }
}

/// Would the parent Gateway be Accepted (see `gateway_status`)? Only its own listeners
/// count: a Gateway whose own listeners are all invalid is not accepted, and then
/// neither are the ListenerSets hanging off it.
pub fn parent_accepted(m: &GatewayModel<'_>) -> bool {
    let own: Vec<_> = m.listeners.iter().filter(|l| l.set.is_none()).collect();
    !matches!(m.address, Err(AddressError::Unsupported(_)))
        && (own.is_empty() || own.iter().any(|l| l.usable()))
}

/// Takes the ListenerSet listeners of a Gateway that is not accepted out of service,
/// before routes attach, so that status and traffic agree.
pub fn gate_on_parent(models: &mut BTreeMap<ObjectKey, GatewayModel<'_>>) {
    for m in models.values_mut() {
        if parent_accepted(m) {
            continue;
        }
        for l in m.listeners.iter_mut().filter(|l| l.set.is_some()) {
            if l.accepted.is_ok() {
                l.accepted = Err((
                    "ParentNotAccepted",
                    format!("the parent Gateway {} is not accepted", m.key),
                ));
            }
        }
    }
}

/// What the ListenerSets naming one Gateway came to.
#[derive(Debug, Default, Clone, Copy)]
pub struct SetCounts {
    /// Accepted: at least one valid listener.
    pub attached: i32,
    /// Refused by the Gateway's `allowedListeners`.
    pub not_allowed: i32,
}

/// A Gateway's `status.attachedListenerSets` and its `AttachedListenerSets`
/// condition. Both appear once the Gateway admits ListenerSets or one names it, so
/// Gateways that have nothing to do with ListenerSets keep their status unchanged.
pub fn gateway_fields(
    gw: &Gateway,
    generation: i64,
    counts: Option<SetCounts>,
) -> Option<(i32, Condition)> {
    let admits = gw
        .spec
        .allowed_listeners
        .as_ref()
        .and_then(|a| a.namespaces.as_ref())
        .and_then(|n| n.from.as_ref())
        .is_some_and(|f| *f != GatewayAllowedListenersNamespacesFrom::None);
    if !admits && counts.is_none() {
        return None;
    }
    let c = counts.unwrap_or_default();
    let condition = if c.attached > 0 {
        cond::condition(
            "AttachedListenerSets",
            true,
            "ListenerSetsAttached",
            format!("{} ListenerSet(s) attached", c.attached),
            generation,
        )
    } else if c.not_allowed > 0 {
        cond::condition(
            "AttachedListenerSets",
            false,
            "ListenerSetsNotAllowed",
            "ListenerSets name this Gateway, but its allowedListeners does not admit them",
            generation,
        )
    } else {
        cond::condition(
            "AttachedListenerSets",
            false,
            "NoListenerSetsAttached",
            "no ListenerSet is attached",
            generation,
        )
    };
    Some((c.attached, condition))
}

/// The status of every judged ListenerSet, and per Gateway how many are attached
/// (`status.attachedListenerSets`: those Accepted).
pub fn statuses(
    sets: &ListenerSets,
    models: &BTreeMap<ObjectKey, GatewayModel<'_>>,
) -> (
    BTreeMap<ObjectKey, ObjectStatus<ListenerSetStatus>>,
    BTreeMap<ObjectKey, SetCounts>,
) {
    let mut out = BTreeMap::new();
    let mut counts: BTreeMap<ObjectKey, SetCounts> = BTreeMap::new();
    for (key, j) in &sets.judged {
        let Some(m) = models.get(&j.gateway) else {
            continue;
        };
        let g = j.generation;
        let count = counts.entry(j.gateway.clone()).or_default();
        let mut listeners = Vec::new();
        let (accepted, programmed) = match &j.verdict {
            Err(Refusal::NotAllowed(why)) => {
                count.not_allowed += 1;
                (
                    cond::not_accepted(g, "NotAllowed", why.clone()),
                    cond::not_programmed(g, "NotAllowed", why.clone()),
                )
            }
            Err(Refusal::Invalid(why)) => (
                cond::not_accepted(g, "ListenersNotValid", why.clone()),
                cond::not_programmed(g, "ListenersNotValid", why.clone()),
            ),
            Ok(()) if !parent_accepted(m) => {
                let why = format!("the parent Gateway {} is not accepted", j.gateway);
                (
                    cond::not_accepted(g, "ParentNotAccepted", why.clone()),
                    cond::not_programmed(g, "ParentNotProgrammed", why),
                )
            }
            Ok(()) => {
                let own: Vec<&ListenerModel<'_>> = m
                    .listeners
                    .iter()
                    .filter(|l| l.set.as_ref() == Some(key))
                    .collect();
                listeners = own
                    .iter()
                    .map(|l| listener_status(g, l, m.address.is_ok()))
                    .collect();
                if own.iter().any(|l| l.usable()) {
                    count.attached += 1;
                    let programmed = if m.address.is_ok() {
                        cond::programmed(g, "ListenerSet")
                    } else {
                        cond::not_programmed(
                            g,
                            "ParentNotProgrammed",
                            format!("the parent Gateway {} has no address", j.gateway),
                        )
                    };
                    // Like a Gateway's: accepted while any listener is valid, saying so
                    // when some are not.
                    let accepted = if own.iter().all(|l| l.usable()) {
                        cond::accepted(g, "ListenerSet")
                    } else {
                        cond::condition(
                            "Accepted",
                            true,
                            "ListenersNotValid",
                            "some listeners are not valid; the others are served",
                            g,
                        )
                    };
                    (accepted, programmed)
                } else {
                    let why = "no listener of this ListenerSet is valid; see their conditions";
                    (
                        cond::not_accepted(g, "ListenersNotValid", why),
                        cond::not_programmed(g, "ListenersNotValid", why),
                    )
                }
            }
        };
        out.insert(
            key.clone(),
            ObjectStatus::new(
                g,
                ListenerSetStatus {
                    conditions: Some(vec![accepted, programmed]),
                    listeners: (!listeners.is_empty()).then_some(listeners),
                },
            ),
        );
    }
    (out, counts)
}

/// A ListenerSet listener's status. A conflicted listener is neither Accepted nor
/// Programmed, with the conflict as the reason of both.
fn listener_status(g: i64, l: &ListenerModel<'_>, addressed: bool) -> ListenerSetStatusListeners {
    // The spec asks not to leak the parent's or siblings' details to a ListenerSet's
    // owner: a conflict says what lost, not which listener of which object won.
    let conflict = l.conflict.as_ref().map(|(reason, _)| {
        let port = l.spec.port;
        let msg = if *reason == "ProtocolConflict" {
            format!("port {port} is already served with another protocol by a listener of the Gateway or of an older ListenerSet")
        } else {
            format!("port {port} and this hostname are already served by a listener of the Gateway or of an older ListenerSet")
        };
        (*reason, msg)
    });
    let accepted = match (&conflict, &l.accepted) {
        (Some((reason, msg)), _) | (None, Err((reason, msg))) => {
            cond::not_accepted(g, reason, msg.clone())
        }
        (None, Ok(())) => cond::accepted(g, "Listener"),
    };
    let conflicted = match &conflict {
        None => cond::no_conflicts(g),
        Some((reason, msg)) => cond::conflicted(g, reason, msg.clone()),
    };
    let refs = match &l.refs {
        Ok(()) => cond::resolved_refs(g),
        Err((reason, msg)) => cond::unresolved_refs(g, reason, msg.clone()),
    };
    let programmed: Condition = match &conflict {
        Some((reason, msg)) => cond::not_programmed(g, reason, msg.clone()),
        None if l.usable() && addressed => cond::programmed(g, "Listener"),
        None => cond::not_programmed(
            g,
            "Invalid",
            "listener is not serving; see its other conditions",
        ),
    };
    ListenerSetStatusListeners {
        attached_routes: i32::try_from(l.attached_routes()).unwrap_or(i32::MAX),
        conditions: vec![accepted, conflicted, refs, programmed],
        name: l.spec.name.clone(),
        supported_kinds: Some(
            l.supported_kinds
                .iter()
                .map(|k| ListenerSetStatusListenersSupportedKinds {
                    group: k.group.clone(),
                    kind: k.kind.clone(),
                })
                .collect(),
        ),
    }
}

#[cfg(test)]
#[path = "listenerset_tests.rs"]
mod tests;
