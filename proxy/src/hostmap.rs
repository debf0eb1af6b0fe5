//! Values by hostname with the spec's precedence: an exact name, then the longest
//! wildcard (`*.example.com` matches one or more labels, never `example.com`), then the
//! entry for any host. Route tables and TLS certificates both pick this way.

use std::collections::HashMap;

#[derive(Debug, Clone)]
pub struct HostMap<T> {
    exact: HashMap<Box<str>, T>,
    /// Keyed by the suffix after `*`, dot included: `*.example.com` is `.example.com`.
    wildcard: HashMap<Box<str>, T>,
    any: Option<T>,
}

impl<T> Default for HostMap<T> {
    fn default() -> Self {
        Self {
            exact: HashMap::new(),
            wildcard: HashMap::new(),
            any: None,
        }
    }
}

impl<T> HostMap<T> {
    /// Stores `value` under `hostname` (`None`: any host; `*.x`: a wildcard), compared
    /// case-insensitively. The first value stored for a name is kept.
    pub fn insert_first(&mut self, hostname: Option<&str>, value: T) {
        match hostname.map(str::to_ascii_lowercase) {
            None => {
                self.any.get_or_insert(value);
            }
            Some(h) => match h.strip_prefix('*') {
                Some(suffix) => {
                    self.wildcard.entry(suffix.into()).or_insert(value);
                }
                None => {
                    self.exact.entry(h.into()).or_insert(value);
                }
            },
        }
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
