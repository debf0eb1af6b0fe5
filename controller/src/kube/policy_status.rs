//! BackendTLSPolicy status rows for the status writer: `status.ancestors` is a list
//! shared with other controllers (each entry names its controllerName), so ours are
//! merged with theirs as the server holds them, like routes' `status.parents`.

use gateway_api::backendtlspolicies::{BackendTlsPolicyStatus, BackendTlsPolicyStatusAncestors};
use serde_json::{Value, json};

use super::status::{carry, rv, to_value};
use crate::Statuses;
use crate::store::{ObjectKey, Store};

/// The spec caps `status.ancestors` at 16 entries.
const MAX_ANCESTORS: usize = 16;

/// One policy's write candidate: key, server resourceVersion, our ancestors, our
/// ancestors as the server holds them, and the full status to apply.
pub(super) struct PolicyRow {
    pub key: ObjectKey,
    pub server_rv: Option<u64>,
    pub ours: Value,
    pub mine: Value,
    pub status: Value,
}

pub(super) fn rows(desired: &Statuses, store: &Store, controller_name: &str) -> Vec<PolicyRow> {
    desired
        .backend_tls_policies
        .iter()
        .filter_map(|(key, s)| {
            let obj = store.backend_tls_policies.get(key)?;
            let server: &[BackendTlsPolicyStatusAncestors] = obj
                .status
                .as_ref()
                .map_or(&[], |x: &BackendTlsPolicyStatus| x.ancestors.as_slice());
            let (mine, others): (Vec<_>, Vec<_>) = server
                .iter()
                .partition(|a| a.controller_name == controller_name);
            let mut ours = s.status.ancestors.clone();
            for a in &mut ours {
                let prev = mine.iter().find(|x| x.ancestor_ref == a.ancestor_ref);
                carry(
                    a.conditions.iter_mut(),
                    prev.map(|x| x.conditions.as_slice()),
                );
            }
            let mut ancestors: Vec<Value> = others.iter().map(to_value).collect();
            ancestors.extend(ours.iter().map(to_value));
            ancestors.truncate(MAX_ANCESTORS);
            Some(PolicyRow {
                key: key.clone(),
                server_rv: rv(&obj.metadata),
                ours: to_value(&ours),
                mine: to_value(&mine),
                status: json!({ "ancestors": ancestors }),
            })
        })
        .collect()
}
