//! What a route's parentRef names (any route kind): a Gateway, whose own listeners it
//! selects, or a ListenerSet (GEP-1713), whose listeners it selects on the parent
//! Gateway.

use std::collections::BTreeMap;

use gateway_api::httproutes::HttpRouteParentRefs;

use super::gateway::{GATEWAY_GROUP, GatewayModel, ListenerModel};
use super::listenerset::ListenerSets;
use crate::store::{KeyParts, ObjectKey};

/// What a parentRef names: a Gateway, or a ListenerSet of one of our Gateways.
pub(super) struct ParentTarget {
    pub gateway: ObjectKey,
    /// The ListenerSet named; its listeners are the only ones selected. A Gateway
    /// parentRef selects only the Gateway's own listeners (GEP-1713: attaching to a
    /// Gateway does not attach to its ListenerSets).
    pub set: Option<ObjectKey>,
}

impl ParentTarget {
    /// Is this listener one of the target's?
    pub fn has(&self, l: &ListenerModel<'_>) -> bool {
        l.set == self.set
    }

    /// Does `parent` (naming this target) select listener `l`: one of the target's,
    /// and the one its sectionName names if it names one? (Its port is each route
    /// kind's own question: L4 routes may name one port of a pool.)
    pub fn selects(&self, parent: &HttpRouteParentRefs, l: &ListenerModel<'_>) -> bool {
        self.has(l)
            && parent
                .section_name
                .as_ref()
                .is_none_or(|s| *s == l.spec.name)
    }

    /// The parent a status entry names: the ListenerSet if one was named, else the
    /// Gateway.
    pub fn reported(&self) -> (&'static str, &ObjectKey) {
        match &self.set {
            Some(set) => ("ListenerSet", set),
            None => ("Gateway", &self.gateway),
        }
    }

    /// Why a parentRef selects no listener: its sectionName or port, or a ListenerSet
    /// its Gateway did not take.
    pub fn no_listener_message(&self, gateway: &GatewayModel<'_>) -> String {
        match &self.set {
            Some(set) if !gateway.listeners.iter().any(|l| self.has(l)) => format!(
                "ListenerSet {set} is not attached to Gateway {}; see its status",
                self.gateway
            ),
            _ => "no listener matches the parentRef's sectionName and port".to_owned(),
        }
    }
}

/// The Gateway or ListenerSet a parentRef names, or None for parents of other kinds,
/// ListenerSets of Gateways not ours (which other controllers may own), and Gateways
/// not in `gateways`. The same for every route kind. Its keys are clones of the keys
/// found (shared strings): nothing is allocated per parentRef.
pub(super) fn parent_target<V>(
    sets: &ListenerSets,
    parent: &HttpRouteParentRefs,
    route_ns: &str,
    gateways: &BTreeMap<ObjectKey, V>,
) -> Option<ParentTarget> {
    let group = parent.group.as_deref().unwrap_or(GATEWAY_GROUP);
    let kind = parent.kind.as_deref().unwrap_or("Gateway");
    let named = (
        parent.namespace.as_deref().unwrap_or(route_ns),
        parent.name.as_str(),
    );
    let named: &dyn KeyParts = &named;
    let (gateway, set) = match (group == GATEWAY_GROUP, kind) {
        (true, "Gateway") => (named, None),
        (true, "ListenerSet") => {
            let (set, gateway) = sets.parent_of(named)?;
            (gateway as &dyn KeyParts, Some(set.clone()))
        }
        _ => return None,
    };
    let (gateway, _) = gateways.get_key_value(gateway)?;
    Some(ParentTarget {
        gateway: gateway.clone(),
        set,
    })
}
