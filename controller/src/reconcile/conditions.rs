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
    Decided::accepted(generation, what).build()
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
    Decided::resolved_refs(generation).build()
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
    Decided::partially_invalid(generation, why).build()
}

/// A condition as decided, its strings borrowed: it can be compared with a condition
/// already built without building its own (routes attached alike share one status,
/// and building each route's only to find it equal to a shared one allocated a dozen
/// strings per route). `lastTransitionTime` is the epoch, as everywhere here.
#[derive(Debug)]
pub struct Decided<'a> {
    type_: &'static str,
    ok: bool,
    reason: &'a str,
    message: Message<'a>,
    generation: i64,
}

/// A decided condition's message.
#[derive(Debug)]
pub enum Message<'a> {
    Text(&'a str),
    Owned(String),
    /// The two joined.
    Joined(&'a str, &'a str),
}

impl Message<'_> {
    fn is(&self, m: &str) -> bool {
        match self {
            Message::Text(t) => *t == m,
            Message::Owned(t) => t == m,
            Message::Joined(a, b) => {
                m.len() == a.len() + b.len() && m.starts_with(a) && m.ends_with(b)
            }
        }
    }

    fn build(&self) -> String {
        match self {
            Message::Text(t) => (*t).to_owned(),
            Message::Owned(t) => t.clone(),
            Message::Joined(a, b) => [*a, *b].concat(),
        }
    }
}

impl<'a> Decided<'a> {
    pub fn accepted(generation: i64, what: &'a str) -> Self {
        Self::new(
            "Accepted",
            true,
            "Accepted",
            Message::Joined(what, " is accepted"),
            generation,
        )
    }

    pub fn not_accepted(generation: i64, reason: &'a str, message: Message<'a>) -> Self {
        Self::new("Accepted", false, reason, message, generation)
    }

    pub fn resolved_refs(generation: i64) -> Self {
        let message = Message::Text("all references are resolved");
        Self::new("ResolvedRefs", true, "ResolvedRefs", message, generation)
    }

    pub fn unresolved_refs(generation: i64, reason: &'a str, message: &'a str) -> Self {
        Self::new(
            "ResolvedRefs",
            false,
            reason,
            Message::Text(message),
            generation,
        )
    }

    pub fn partially_invalid(generation: i64, why: &'a str) -> Self {
        let message = Message::Joined("some rules are not served and answer 500: ", why);
        Self::new(
            "PartiallyInvalid",
            true,
            "UnsupportedValue",
            message,
            generation,
        )
    }

    fn new(
        type_: &'static str,
        ok: bool,
        reason: &'a str,
        message: Message<'a>,
        generation: i64,
    ) -> Self {
        Self {
            type_,
            ok,
            reason,
            message,
            generation,
        }
    }

    pub fn build(&self) -> Condition {
        Condition {
            type_: self.type_.to_owned(),
            status: self.status().to_owned(),
            reason: self.reason.to_owned(),
            message: self.message.build(),
            observed_generation: Some(self.generation),
            last_transition_time: Time(Timestamp::UNIX_EPOCH),
        }
    }

    /// Is `c` what [`Decided::build`] would build? Destructured, so a field the type
    /// gains fails to compile here rather than compare as equal.
    pub fn is(&self, c: &Condition) -> bool {
        let Condition {
            type_,
            status,
            reason,
            message,
            observed_generation,
            last_transition_time,
        } = c;
        type_ == self.type_
            && status == self.status()
            && reason == self.reason
            && self.message.is(message)
            && *observed_generation == Some(self.generation)
            && last_transition_time.0 == Timestamp::UNIX_EPOCH
    }

    fn status(&self) -> &'static str {
        if self.ok { "True" } else { "False" }
    }
}
