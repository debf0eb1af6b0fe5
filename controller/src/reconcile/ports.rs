//! Kubernetes-mode internal ports: every (Gateway, listener port) gets a port of its own
//! from a bounded range, which the proxy binds on `0.0.0.0` and the Gateway's Service
//! targets. kube-proxy rewrites the destination address, so the port a connection lands
//! on is the only thing that tells Gateways apart inside the pod.
//!
//! Deterministic, with no coordination between replicas: the ports a Gateway's Service
//! already targets are kept (so a Gateway keeps its ports when others come and go, and
//! across restarts), then every other port starts at a stable hash of
//! `namespace/name:port` and probes linearly to the first free one, Gateways in
//! precedence order (oldest first). Listeners that share a port share a socket, so the
//! unit of allocation is the Gateway's listener *port*, not the listener.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use crate::store::ObjectKey;

/// An inclusive port range, `FIRST-LAST`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRange {
    pub first: u16,
    pub last: u16,
}

impl PortRange {
    pub fn len(&self) -> usize {
        usize::from(self.last - self.first) + 1
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    pub fn contains(&self, port: u16) -> bool {
        (self.first..=self.last).contains(&port)
    }

    fn nth(&self, i: usize) -> u16 {
        self.first
            .saturating_add(u16::try_from(i).unwrap_or(u16::MAX))
            .min(self.last)
    }
}

impl Default for PortRange {
    fn default() -> Self {
        Self {
            first: 20000,
            last: 29999,
        }
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

impl FromStr for PortRange {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (a, b) = s
            .split_once('-')
            .ok_or_else(|| format!("{s:?} is not FIRST-LAST"))?;
        let first: u16 = a.trim().parse().map_err(|e| format!("{a:?}: {e}"))?;
        let last: u16 = b.trim().parse().map_err(|e| format!("{b:?}: {e}"))?;
        if first == 0 || first > last {
            return Err(format!(
                "{s:?} is not a range of ports (1-65535, FIRST <= LAST)"
            ));
        }
        Ok(Self { first, last })
    }
}

/// One Gateway's ask: its distinct listener ports, and the internal ports its existing
/// Service targets (listener port -> internal port).
#[derive(Debug, Clone)]
pub struct PortRequest {
    pub key: ObjectKey,
    pub ports: BTreeSet<u16>,
    pub previous: BTreeMap<u16, u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortError {
    /// The Gateway alone needs more ports than the range holds.
    TooMany { needed: usize, range: PortRange },
    /// Other Gateways hold the rest of the range.
    Exhausted { needed: usize, range: PortRange },
}

impl fmt::Display for PortError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PortError::TooMany { needed, range } => write!(
                f,
                "the Gateway needs {needed} internal ports (one per distinct listener port) but the internal port range {range} holds {}",
                range.len()
            ),
            PortError::Exhausted { needed, range } => write!(
                f,
                "the internal port range {range} has fewer than {needed} free ports left; other Gateways hold the rest"
            ),
        }
    }
}

pub type Allocation = BTreeMap<ObjectKey, Result<BTreeMap<u16, u16>, PortError>>;

/// Allocates internal ports for `requests`, given in precedence order.
pub fn allocate(range: PortRange, requests: &[PortRequest]) -> Allocation {
    let mut used: BTreeSet<u16> = BTreeSet::new();
    let mut got: BTreeMap<&ObjectKey, BTreeMap<u16, u16>> = BTreeMap::new();
    let mut out = Allocation::new();
    for r in requests {
        if r.ports.len() > range.len() {
            out.insert(
                r.key.clone(),
                Err(PortError::TooMany {
                    needed: r.ports.len(),
                    range,
                }),
            );
            continue;
        }
        let mine = got.entry(&r.key).or_default();
        for (port, internal) in &r.previous {
            if r.ports.contains(port) && range.contains(*internal) && used.insert(*internal) {
                mine.insert(*port, *internal);
            }
        }
    }
    for r in requests {
        let Some(mine) = got.get_mut(&r.key) else {
            continue;
        };
        let mut failed = false;
        for port in &r.ports {
            if mine.contains_key(port) {
                continue;
            }
            let start = stable_hash(&format!("{}:{port}", r.key)) % range.len();
            let free = (0..range.len())
                .map(|i| range.nth((start + i) % range.len()))
                .find(|p| !used.contains(p));
            match free {
                Some(p) => {
                    used.insert(p);
                    mine.insert(*port, p);
                }
                None => {
                    failed = true;
                    break;
                }
            }
        }
        if failed {
            // All or nothing: a Gateway half-served on ports it may lose is worse than
            // a clear condition.
            for p in mine.values() {
                used.remove(p);
            }
            mine.clear();
            out.insert(
                r.key.clone(),
                Err(PortError::Exhausted {
                    needed: r.ports.len(),
                    range,
                }),
            );
        }
    }
    for (key, ports) in got {
        out.entry(key.clone()).or_insert(Ok(ports));
    }
    out
}

/// FNV-1a: stable across Rust releases and platforms, unlike std's `DefaultHasher`.
pub(crate) fn stable_hash(s: &str) -> usize {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    usize::try_from(h % (1 << 31)).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(name: &str, ports: &[u16]) -> PortRequest {
        PortRequest {
            key: ObjectKey::new("ns", name),
            ports: ports.iter().copied().collect(),
            previous: BTreeMap::new(),
        }
    }

    fn ok(a: &Allocation, name: &str) -> BTreeMap<u16, u16> {
        match &a[&ObjectKey::new("ns", name)] {
            Ok(p) => p.clone(),
            Err(e) => panic!("{name}: {e}"),
        }
    }

    #[test]
    fn parses_ranges() {
        assert_eq!("20000-29999".parse::<PortRange>(), Ok(PortRange::default()));
        assert!("5-4".parse::<PortRange>().is_err());
        assert!("0-4".parse::<PortRange>().is_err());
        assert!("x".parse::<PortRange>().is_err());
    }

    #[test]
    fn deterministic_distinct_and_in_range() {
        let range = PortRange::default();
        let input = vec![req("a", &[80, 443]), req("b", &[80]), req("c", &[8080, 80])];
        let first = allocate(range, &input);
        assert_eq!(first, allocate(range, &input));
        let all: Vec<u16> = ["a", "b", "c"]
            .iter()
            .flat_map(|n| ok(&first, n).into_values())
            .collect();
        let distinct: BTreeSet<u16> = all.iter().copied().collect();
        assert_eq!(all.len(), 5);
        assert_eq!(distinct.len(), 5);
        assert!(all.iter().all(|p| range.contains(*p)));
    }

    #[test]
    fn previous_ports_are_kept_when_others_go() {
        // A tiny range forces collisions, so probing order matters.
        let range = PortRange {
            first: 30000,
            last: 30003,
        };
        let all = vec![req("a", &[80]), req("b", &[80]), req("c", &[80])];
        let before = allocate(range, &all);
        // The Services now record `before`; drop `a` and re-allocate from them.
        let rest: Vec<PortRequest> = ["b", "c"]
            .iter()
            .map(|n| PortRequest {
                previous: ok(&before, n),
                ..req(n, &[80])
            })
            .collect();
        let after = allocate(range, &rest);
        assert_eq!(ok(&after, "b"), ok(&before, "b"));
        assert_eq!(ok(&after, "c"), ok(&before, "c"));
    }

    #[test]
    fn too_many_and_exhausted_say_so() {
        let range = PortRange {
            first: 30000,
            last: 30001,
        };
        let out = allocate(
            range,
            &[req("big", &[1, 2, 3]), req("a", &[1, 2]), req("b", &[1])],
        );
        assert!(matches!(
            out[&ObjectKey::new("ns", "big")],
            Err(PortError::TooMany { needed: 3, .. })
        ));
        assert_eq!(ok(&out, "a").len(), 2);
        assert!(matches!(
            out[&ObjectKey::new("ns", "b")],
            Err(PortError::Exhausted { .. })
        ));
    }
}
