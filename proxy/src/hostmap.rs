//! Values by hostname with the spec's precedence: an exact name, then the longest
//! wildcard (`*.example.com` matches one or more labels, never `example.com`), then the
//! entry for any host. Route tables and TLS certificates both pick this way.

use std::borrow::Cow;
use std::sync::Arc;

// foldhash rather than SipHash: every request looks its Host up here, and a route
// table with thousands of names is rebuilt on a change. The keys come from
// configuration, never from a peer, and the hasher is seeded per process; a request
// only looks up, so it cannot grow a chain.
use foldhash::HashMap;

/// Keys are shared strings so that a copy (a route table patched for a change) costs a
/// count per name rather than an allocation.
#[derive(Debug, Clone)]
pub struct HostMap<T> {
    exact: HashMap<Arc<str>, T>,
    /// Keyed by the suffix after `*`, dot included: `*.example.com` is `.example.com`.
    wildcard: HashMap<Arc<str>, T>,
    any: Option<T>,
}

impl<T> Default for HostMap<T> {
    fn default() -> Self {
        Self {
            exact: HashMap::default(),
            wildcard: HashMap::default(),
            any: None,
        }
    }
}

impl<T> HostMap<T> {
    /// Stores `value` under `hostname` (`None`: any host; `*.x`: a wildcard), compared
    /// case-insensitively. The first value stored for a name is kept.
    pub fn insert_first(&mut self, hostname: Option<&str>, value: T) {
        let Some(h) = hostname else {
            self.any.get_or_insert(value);
            return;
        };
        let h = folded(h);
        let (map, key) = self.map_for(&h);
        // The key is allocated only when it is new.
        if !map.contains_key(key) {
            map.insert(key.into(), value);
        }
    }

    /// Stores `value` under `hostname`, replacing what was there; `None` removes it.
    pub fn set(&mut self, hostname: Option<&str>, value: Option<T>) {
        let Some(h) = hostname else {
            self.any = value;
            return;
        };
        let h = folded(h);
        let (map, key) = self.map_for(&h);
        match (map.get_mut(key), value) {
            (Some(slot), Some(value)) => *slot = value,
            (None, Some(value)) => {
                map.insert(key.into(), value);
            }
            (_, None) => {
                map.remove(key);
            }
        }
    }

    /// The map a lower-case hostname belongs in, and its key there.
    fn map_for<'h>(&mut self, h: &'h str) -> (&mut HashMap<Arc<str>, T>, &'h str) {
        match h.strip_prefix('*') {
            Some(suffix) => (&mut self.wildcard, suffix),
            None => (&mut self.exact, h),
        }
    }

    /// Room for `additional` more exact names without growing.
    pub fn reserve(&mut self, additional: usize) {
        self.exact.reserve(additional);
    }

    /// The value for `host`, which must be lower-case and without a port; `None` (no
    /// usable name) gets the any-host entry.
    pub fn get(&self, host: Option<&str>) -> Option<&T> {
        if let Some(host) = host {
            if let Some(v) = self.exact.get(host) {
                return Some(v);
            }
            if !self.wildcard.is_empty() {
                // Each '.' starts a candidate suffix; the leftmost is the longest. The
                // first byte is skipped so `*.example.com` never matches `.example.com`.
                for (i, b) in host.bytes().enumerate().skip(1) {
                    if b == b'.'
                        && let Some(v) = self.wildcard.get(&host[i..])
                    {
                        return Some(v);
                    }
                }
            }
        }
        self.any.as_ref()
    }

    pub fn any(&self) -> Option<&T> {
        self.any.as_ref()
    }

    /// The named entries (`*.suffix` for wildcards), sorted, for stable dumps.
    pub fn named(&self) -> Vec<(String, &T)> {
        let mut v: Vec<(String, &T)> = self
            .exact
            .iter()
            .map(|(h, t)| (h.to_string(), t))
            .chain(self.wildcard.iter().map(|(h, t)| (format!("*{h}"), t)))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    pub fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.wildcard.is_empty() && self.any.is_none()
    }
}

/// `host` lower-cased. Names from the reconciler are lower-case already, so this
/// allocates only for the rare one that is not.
fn folded(host: &str) -> Cow<'_, str> {
    if host.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(host.to_ascii_lowercase())
    } else {
        Cow::Borrowed(host)
    }
}
