//! Named constructors for every condition the reconciler writes.
//!
//! `lastTransitionTime` is left at the epoch here: reconcile is pure. The caller stamps
//! real times with [`crate::status::carry_transition_times`], keeping the previous time
//! when a condition's status did not change.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

pub fn condition(
    type_: &str,
    ok: bool,
    reason: &str,
    message: impl Into<String>,
    generation: i64,
) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: if ok { "True" } else { "False" }.to_owned(),
        reason: reason.to_owned(),
        message: message.into(),
        observed_generation: Some(generation),
        last_transition_time: Time(Timestamp::UNIX_EPOCH),
    }
}

pub fn class_accepted(generation: i64) -> Condition {
    condition(
        "Accepted",
        true,
        "Accepted",
        "GatewayClass is accepted by aether-edge",
        generation,
    )
}

pub fn accepted(generation: i64, what: &str) -> Condition {
    condition(
        "Accepted",
        true,
        "Accepted",
        format!("{what} is accepted"),
        generation,
    )
}

pub fn not_accepted(generation: i64, reason: &str, message: impl Into<String>) -> Condition {
    condition("Accepted", false, reason, message, generation)
}

pub fn programmed(generation: i64, what: &str) -> Condition {
    condition(
        "Programmed",
        true,
        "Programmed",
        format!("{what} is programmed"),
        generation,
    )
}

pub fn not_programmed(generation: i64, reason: &str, message: impl Into<String>) -> Condition {
    condition("Programmed", false, reason, message, generation)
}

pub fn resolved_refs(generation: i64) -> Condition {
    condition(
        "ResolvedRefs",
        true,
        "ResolvedRefs",
        "all references are resolved",
        generation,
    )
}

pub fn unresolved_refs(generation: i64, reason: &str, message: impl Into<String>) -> Condition {
    condition("ResolvedRefs", false, reason, message, generation)
}

pub fn no_conflicts(generation: i64) -> Condition {
    condition(
        "Conflicted",
        false,
        "NoConflicts",
        "listener has no conflicts",
        generation,
    )
}

pub fn conflicted(generation: i64, reason: &str, message: impl Into<String>) -> Condition {
    condition("Conflicted", true, reason, message, generation)
}

/// Some rules of a route can't be served; the others are.
pub fn partially_invalid(generation: i64, why: &str) -> Condition {
    condition(
        "PartiallyInvalid",
        true,
        "UnsupportedValue",
        format!("some rules are not served and answer 500: {why}"),
        generation,
    )
}
