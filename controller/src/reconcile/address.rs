//! Standalone-mode address allocation: each Gateway gets its own local address.
//!
//! Deterministic by construction: requested addresses are claimed first, in Gateway
//! order (oldest first, then by namespace/name); every other Gateway then starts at a
//! pool slot derived from a stable hash of its `namespace/name` and takes the first
//! free slot from there. The same manifests give the same addresses on every start and
//! reload, and a Gateway keeps its address when unrelated Gateways come and go (unless
//! they collide on its slot).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;

use crate::store::ObjectKey;

/// What a Gateway asked for in `spec.addresses`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddressRequest {
    /// No usable request: take one from the pool.
    Pool,
    Ip(IpAddr),
    /// A type or value this implementation can't serve.
    Unsupported(String),
    /// Well-formed, but not servable here (more than one address, say).
    NotUsable(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddressError {
    Unsupported(String),
    /// Accepted, but not programmed: the address can't be served on this host.
    NotUsable(String),
    InUse {
        address: IpAddr,
        by: ObjectKey,
    },
    PoolExhausted,
}

/// Whether `ip` is an address this host can listen on: binding a UDP socket to it (port
/// 0, closed at once, no packet sent) is the kernel's own answer, and the same one the
/// listeners would get later.
pub fn is_local(ip: IpAddr) -> bool {
    std::net::UdpSocket::bind((ip, 0)).is_ok()
}

/// Allocates addresses for `gateways`, given in precedence order.
pub fn allocate(
    pool: &IpNet,
    gateways: &[(ObjectKey, AddressRequest)],
) -> BTreeMap<ObjectKey, Result<IpAddr, AddressError>> {
    let mut out = BTreeMap::new();
    let mut taken: BTreeMap<IpAddr, ObjectKey> = BTreeMap::new();
    for (key, req) in gateways {
        match req {
            AddressRequest::Ip(ip) => {
                let result = match taken.get(ip) {
                    Some(owner) => Err(AddressError::InUse {
                        address: *ip,
                        by: owner.clone(),
                    }),
                    None if !is_local(*ip) => Err(AddressError::NotUsable(format!(
                        "{ip} is not an address of this host"
                    ))),
                    None => {
                        taken.insert(*ip, key.clone());
                        Ok(*ip)
                    }
                };
                out.insert(key.clone(), result);
            }
            AddressRequest::Unsupported(why) => {
                out.insert(key.clone(), Err(AddressError::Unsupported(why.clone())));
            }
            AddressRequest::NotUsable(why) => {
                out.insert(key.clone(), Err(AddressError::NotUsable(why.clone())));
            }
            AddressRequest::Pool => {}
        }
    }
    let slots = PoolSlots::new(pool);
    let used: BTreeSet<IpAddr> = taken.keys().copied().collect();
    let mut used = used;
    for (key, req) in gateways {
        if *req != AddressRequest::Pool {
            continue;
        }
        let start = stable_hash(&key.to_string()) % slots.len.max(1);
        let found = (0..slots.len)
            .map(|i| slots.nth((start + i) % slots.len))
            .find(|ip| !used.contains(ip));
        let result = match found {
            Some(ip) => {
                used.insert(ip);
                Ok(ip)
            }
            None => Err(AddressError::PoolExhausted),
        };
        out.insert(key.clone(), result);
    }
    out
}

/// The usable host addresses of a pool, addressed by index without materialising them.
struct PoolSlots {
    first: u128,
    len: u128,
    v4: bool,
}

impl PoolSlots {
    fn new(pool: &IpNet) -> Self {
        let (net, bcast, v4) = match pool {
            IpNet::V4(n) => (
                u128::from(u32::from(n.network())),
                u128::from(u32::from(n.broadcast())),
                true,
            ),
            IpNet::V6(n) => (u128::from(n.network()), u128::from(n.broadcast()), false),
        };
        // Skip the network and broadcast addresses when the pool is big enough to have them.
        let (first, last) = if v4 && bcast - net >= 2 {
            (net + 1, bcast - 1)
        } else {
            (net, bcast)
        };
        Self {
            first,
            len: last - first + 1,
            v4,
        }
    }

    fn nth(&self, i: u128) -> IpAddr {
        let n = self.first + i;
        if self.v4 {
            IpAddr::from(u32::try_from(n).unwrap_or(u32::MAX).to_be_bytes())
        } else {
            IpAddr::from(n.to_be_bytes())
        }
    }
}

/// FNV-1a: stable across Rust releases and platforms, unlike std's `DefaultHasher`.
fn stable_hash(s: &str) -> u128 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    u128::from(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool() -> IpNet {
        "127.0.1.0/24".parse().unwrap()
    }

    #[test]
    fn same_input_same_addresses_and_requests_win() {
        let a = ObjectKey::new("ns", "a");
        let b = ObjectKey::new("ns", "b");
        let c = ObjectKey::new("ns", "c");
        let fixed: IpAddr = "127.0.0.7".parse().unwrap();
        let input = vec![
            (a.clone(), AddressRequest::Pool),
            (b.clone(), AddressRequest::Ip(fixed)),
            (c.clone(), AddressRequest::Ip(fixed)),
        ];
        let first = allocate(&pool(), &input);
        assert_eq!(first, allocate(&pool(), &input));
        assert_eq!(first[&b], Ok(fixed));
        assert!(matches!(first[&c], Err(AddressError::InUse { ref by, .. }) if *by == b));
        let IpAddr::V4(got) = first[&a].clone().unwrap() else {
            panic!("v4 pool gave v6")
        };
        assert_eq!(got.octets()[..3], [127, 0, 1]);
        assert!(got.octets()[3] != 0 && got.octets()[3] != 255);
    }

    #[test]
    fn an_address_this_host_lacks_is_not_usable() {
        let here = ObjectKey::new("ns", "here");
        let away = ObjectKey::new("ns", "away");
        // TEST-NET-3: never assigned to a host, so binding it fails (nothing is sent).
        let foreign: IpAddr = "203.0.113.10".parse().unwrap();
        let got = allocate(
            &pool(),
            &[
                (
                    here.clone(),
                    AddressRequest::Ip("127.0.0.9".parse().unwrap()),
                ),
                (away.clone(), AddressRequest::Ip(foreign)),
            ],
        );
        assert!(got[&here].is_ok(), "{:?}", got[&here]);
        assert!(
            matches!(&got[&away], Err(AddressError::NotUsable(why)) if why.contains("203.0.113.10")),
            "{:?}",
            got[&away]
        );
    }

    #[test]
    fn a_gateway_keeps_its_address_when_another_goes() {
        let keys: Vec<ObjectKey> = (0..20)
            .map(|i| ObjectKey::new("ns", format!("g{i}")))
            .collect();
        let all: Vec<_> = keys
            .iter()
            .map(|k| (k.clone(), AddressRequest::Pool))
            .collect();
        let before = allocate(&pool(), &all);
        let fewer: Vec<_> = all.iter().skip(1).cloned().collect();
        let after = allocate(&pool(), &fewer);
        let kept = keys[1..].iter().filter(|k| before[*k] == after[*k]).count();
        assert!(kept >= 18, "only {kept} of 19 kept their address");
    }

    #[test]
    fn a_full_pool_says_so() {
        let tiny: IpNet = "127.0.1.1/32".parse().unwrap();
        let input = vec![
            (ObjectKey::new("ns", "a"), AddressRequest::Pool),
            (ObjectKey::new("ns", "b"), AddressRequest::Pool),
        ];
        let out = allocate(&tiny, &input);
        assert_eq!(out.values().filter(|r| r.is_err()).count(), 1);
    }
}
