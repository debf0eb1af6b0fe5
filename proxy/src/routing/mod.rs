//! A listener's route table: virtual hosts by hostname, each an ordered list of matches.
//!
//! Lookup is allocation-free: the Host is normalised into a stack buffer, an exact
//! hostname is one hash lookup, and wildcards are tried from the longest suffix down,
//! one hash lookup per label.

mod matcher;

use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::Arc;

use http::{HeaderMap, Method};
use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

pub use matcher::{HeaderMatch, PathMatch, QueryMatch, RequestMatch, ValueMatch};

use crate::backend::BackendSet;
use crate::filters::Filters;
use crate::hostmap::HostMap;
use crate::telemetry::RouteStats;

/// What a matched rule does with the request. One per rule, thousands in a large
/// Snapshot: what few rules set is boxed apart (one pointer when none does), and the
/// route's name is the one its counters keep, so an action is 96 bytes, not 160.
#[derive(Debug)]
pub struct RuleAction {
    pub filters: Filters,
    pub backends: BackendSet,
    /// The route's counters, and its `namespace/name` for metrics and logs.
    pub stats: RouteStats,
    pub kind: RouteKind,
    extras: Option<Box<RuleExtras>>,
}

/// What a rule sets only sometimes.
#[derive(Debug, Default)]
pub struct RuleExtras {
    /// The rule's `name`, for access logs and traces.
    pub rule: Option<Arc<str>>,
    /// Deadline for the upstream response headers (the rule's `timeouts`); the upstream
    /// request is cancelled and the client gets 504 when it passes.
    pub timeout: Option<std::time::Duration>,
    /// The rule's `retry`; `None` leaves only the retry of a failed connect.
    pub retry: Option<Box<crate::retry::RetryPolicy>>,
    /// The certificate the Gateway presents to backends it reaches over TLS
    /// (`spec.tls.backend`). Here, not on the listener: Gateways sharing a socket (a
    /// shared address) may each present their own.
    pub backend_client_cert: Option<Arc<crate::backend_client_cert::ClientCertificate>>,
}

impl RuleExtras {
    fn is_empty(&self) -> bool {
        self.rule.is_none()
            && self.timeout.is_none()
            && self.retry.is_none()
            && self.backend_client_cert.is_none()
    }
}

/// The kind of route a rule belongs to, for access logs, traces and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteKind {
    Http,
    Grpc,
}

impl RouteKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Http => "HTTPRoute",
            Self::Grpc => "GRPCRoute",
        }
    }
}

impl RuleAction {
    pub fn new(
        kind: RouteKind,
        filters: Filters,
        backends: BackendSet,
        extras: RuleExtras,
        stats: RouteStats,
    ) -> Self {
        Self {
            filters,
            backends,
            stats,
            kind,
            extras: (!extras.is_empty()).then(|| Box::new(extras)),
        }
    }

    /// `namespace/name` of the route.
    pub fn route(&self) -> &Arc<str> {
        self.stats.route()
    }

    pub fn rule(&self) -> Option<&Arc<str>> {
        self.extras.as_ref()?.rule.as_ref()
    }

    pub fn timeout(&self) -> Option<std::time::Duration> {
        self.extras.as_ref()?.timeout
    }

    pub fn retry(&self) -> Option<&crate::retry::RetryPolicy> {
        self.extras.as_ref()?.retry.as_deref()
    }

    pub fn backend_client_cert(
        &self,
    ) -> Option<&Arc<crate::backend_client_cert::ClientCertificate>> {
        self.extras.as_ref()?.backend_client_cert.as_ref()
    }
}

/// The Snapshot dump's form, as when every field was the action's own.
impl Serialize for RuleAction {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("route", &**self.route())?;
        if !self.filters.is_empty() {
            m.serialize_entry("filters", &self.filters)?;
        }
        m.serialize_entry("backends", &self.backends)?;
        m.serialize_entry("timeout", &self.timeout())?;
        if let Some(retry) = self.retry() {
            m.serialize_entry("retry", retry)?;
        }
        if let Some(cert) = self.backend_client_cert() {
            m.serialize_entry("backend_client_cert", cert)?;
        }
        m.end()
    }
}

/// Tie-breaks between matches of equal precedence, as the spec orders them: the
/// oldest route first, then by `namespace/name`, then rule and match order.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct RouteOrder {
    pub created: i64,
    pub route: Arc<str>,
    pub rule: u32,
    pub index: u32,
}

#[derive(Debug, Clone, Serialize)]
pub struct RouteEntry {
    #[serde(rename = "match")]
    pub matcher: RequestMatch,
    pub order: RouteOrder,
    pub action: Arc<RuleAction>,
}

impl RouteEntry {
    fn cmp_precedence(&self, other: &Self) -> Ordering {
        self.matcher
            .precedence(&other.matcher)
            .then_with(|| self.order.cmp(&other.order))
    }
}

/// The entries for one hostname, in precedence order: the first that matches wins.
#[derive(Debug, Default, Serialize)]
#[serde(transparent)]
pub struct VirtualHost {
    entries: Vec<RouteEntry>,
}

impl VirtualHost {
    /// A virtual host of `entries`, put in precedence order.
    pub fn new(mut entries: Vec<RouteEntry>) -> Self {
        entries.sort_by(RouteEntry::cmp_precedence);
        Self { entries }
    }

    pub fn find(
        &self,
        method: &Method,
        path: &str,
        query: Option<&str>,
        headers: &HeaderMap,
    ) -> Option<&RouteEntry> {
        self.entries
            .iter()
            .find(|e| e.matcher.matches(method, path, query, headers))
    }

    /// [`Self::find`] with headers read through `header` (see
    /// [`RequestMatch::matches_with`]).
    pub fn find_with<'h>(
        &self,
        method: &Method,
        path: &str,
        query: Option<&str>,
        header: impl Fn(&http::HeaderName) -> Option<&'h [u8]> + Copy,
    ) -> Option<&RouteEntry> {
        self.entries
            .iter()
            .find(|e| e.matcher.matches_with(method, path, query, header))
    }

    pub fn entries(&self) -> &[RouteEntry] {
        &self.entries
    }
}

/// Hostnames are at most 253 bytes; anything longer cannot match a route.
const MAX_HOST: usize = 253;

/// Virtual hosts are shared by `Arc`: a new table for a change to one hostname reuses
/// every other hostname's virtual host from the table it replaces.
#[derive(Debug, Default)]
pub struct RouteTable {
    hosts: HostMap<Arc<VirtualHost>>,
}

impl RouteTable {
    pub fn builder() -> RouteTableBuilder {
        RouteTableBuilder::default()
    }

    /// The virtual host for a request's Host (or :authority): port stripped, compared
    /// case-insensitively, exact names before wildcards, longer wildcards first.
    pub fn virtual_host(&self, authority: &str) -> Option<&VirtualHost> {
        let mut buf = [0u8; MAX_HOST];
        self.hosts
            .get(normalise_host(authority, &mut buf))
            .map(Arc::as_ref)
    }

    /// A table of ready virtual hosts (`None`: any host; `*.x`: a wildcard); the first
    /// given for a hostname is kept.
    pub fn from_hosts<'h>(
        hosts: impl IntoIterator<Item = (Option<&'h str>, Arc<VirtualHost>)>,
    ) -> Self {
        let hosts = hosts.into_iter();
        let mut table = RouteTable::default();
        table.hosts.reserve(hosts.size_hint().0);
        for (host, vhost) in hosts {
            table.hosts.insert_first(host, vhost);
        }
        table
    }

    /// This table with each given hostname's virtual host replaced (`None`: removed).
    /// Copying a table costs a count per hostname; a change to a few routes patches a
    /// copy rather than build a table of thousands of names again.
    pub fn patched<'h>(
        &self,
        changes: impl IntoIterator<Item = (Option<&'h str>, Option<Arc<VirtualHost>>)>,
    ) -> Self {
        let mut hosts = self.hosts.clone();
        for (host, vhost) in changes {
            hosts.set(host, vhost);
        }
        Self { hosts }
    }

    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty()
    }
}

/// Lower-cases `authority` into `buf` without its port. `None` for hosts that can't be
/// a DNS name here (too long, not UTF-8 after folding).
fn normalise_host<'b>(authority: &str, buf: &'b mut [u8; MAX_HOST]) -> Option<&'b str> {
    let host = if authority.starts_with('[') {
        // IPv6 literal: keep the brackets, drop what follows them.
        authority.find(']').map_or(authority, |i| &authority[..=i])
    } else {
        authority.rsplit_once(':').map_or(authority, |(h, _)| h)
    };
    let host = host.strip_suffix('.').unwrap_or(host);
    let out = buf.get_mut(..host.len())?;
    for (o, b) in out.iter_mut().zip(host.bytes()) {
        *o = b.to_ascii_lowercase();
    }
    std::str::from_utf8(out).ok()
}

/// Collects entries per hostname, then sorts each virtual host once.
#[derive(Debug, Default)]
pub struct RouteTableBuilder {
    hosts: HashMap<Option<Box<str>>, Vec<RouteEntry>>,
}

impl RouteTableBuilder {
    /// Adds an entry under `hostname` (`None` for any host; `*.x` for a wildcard).
    pub fn add(&mut self, hostname: Option<&str>, entry: RouteEntry) {
        let key = hostname.map(|h| h.to_ascii_lowercase().into_boxed_str());
        self.hosts.entry(key).or_default().push(entry);
    }

    pub fn build(self) -> RouteTable {
        let mut table = RouteTable::default();
        for (host, entries) in self.hosts {
            table
                .hosts
                .insert_first(host.as_deref(), Arc::new(VirtualHost::new(entries)));
        }
        table
    }
}

impl Serialize for RouteTable {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // Sorted so that dumps of the same config are byte-identical.
        let named = self.hosts.named();
        let any = self.hosts.any();
        let mut m = s.serialize_map(Some(named.len() + usize::from(any.is_some())))?;
        for (h, v) in named {
            m.serialize_entry(&h, v)?;
        }
        if let Some(any) = any {
            m.serialize_entry("*", any)?;
        }
        m.end()
    }
}

#[cfg(test)]
mod tests;
