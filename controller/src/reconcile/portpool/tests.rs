use std::collections::BTreeMap;

use super::*;

/// xorshift64*: a small deterministic generator, so a failure replays exactly.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % n as u64).unwrap_or(0)
    }
}

const RANGE: PortRange = PortRange {
    first: 30000,
    last: 30015,
};

/// Route `i` of a universe: a stable identity, an age, and for some a port request.
fn candidate(i: usize, previous: Option<u16>) -> Candidate {
    let requested = (i % 7 == 3).then(|| RANGE.first + u16::try_from(i % 16).unwrap_or(0));
    Candidate {
        route: i,
        order: (
            i64::try_from(i * 37 % 11).unwrap_or(0),
            if i.is_multiple_of(2) {
                L4Kind::Tcp
            } else {
                L4Kind::Udp
            },
            ObjectKey::new("ns", format!("r{i}")),
        ),
        requested,
        previous,
    }
}

#[test]
fn random_additions_and_removals_never_share_or_move_a_port() {
    for seed in 1..=200u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let mut present: Vec<usize> = Vec::new();
        let mut held: BTreeMap<usize, u16> = BTreeMap::new();
        for step in 0..60 {
            if present.is_empty() || rng.below(3) != 0 {
                let i = rng.below(40);
                if !present.contains(&i) {
                    present.push(i);
                }
            } else {
                let gone = present.swap_remove(rng.below(present.len()));
                held.remove(&gone);
            }
            let candidates: Vec<Candidate> = present
                .iter()
                .map(|&i| candidate(i, held.get(&i).copied()))
                .collect();
            let out = assign(RANGE, &candidates);
            let mut seen: BTreeMap<u16, usize> = BTreeMap::new();
            for (&route, result) in &out {
                let Ok(port) = result else {
                    assert!(
                        !held.contains_key(&route),
                        "seed {seed} step {step}: r{route} lost its port {:?}",
                        held.get(&route)
                    );
                    continue;
                };
                assert!(
                    RANGE.contains(*port),
                    "seed {seed}: {port} outside the range"
                );
                if let Some(other) = seen.insert(*port, route) {
                    panic!("seed {seed} step {step}: r{route} and r{other} share port {port}");
                }
                if let Some(before) = held.get(&route) {
                    assert_eq!(before, port, "seed {seed} step {step}: r{route} moved");
                }
            }
            held = out
                .into_iter()
                .filter_map(|(r, p)| Some((r, p.ok()?)))
                .collect();
        }
    }
}

#[test]
fn without_history_the_same_set_gets_the_same_ports_in_any_order() {
    let mut rng = Rng(42);
    for _ in 0..100 {
        let mut set: Vec<Candidate> = (0..rng.below(20) + 1)
            .map(|_| candidate(rng.below(40), None))
            .collect();
        set.sort_by_key(|c| c.route);
        set.dedup_by_key(|c| c.route);
        let a = assign(RANGE, &set);
        set.reverse();
        let b = assign(RANGE, &set);
        assert_eq!(a, b);
    }
}

#[test]
fn requests_full_pools_and_ranges_give_clear_reasons() {
    let range = PortRange {
        first: 40000,
        last: 40001,
    };
    let mk = |i: usize, requested: Option<u16>, previous: Option<u16>| Candidate {
        route: i,
        order: (
            i64::try_from(i).unwrap_or(0),
            L4Kind::Tcp,
            ObjectKey::new("ns", format!("r{i}")),
        ),
        requested,
        previous,
    };
    let out = assign(
        range,
        &[
            mk(0, None, Some(40001)),
            mk(1, Some(40001), None),
            mk(2, Some(50000), None),
            mk(3, None, None),
            mk(4, None, None),
        ],
    );
    assert_eq!(out[&0], Ok(40001), "a held port is kept");
    let reason = |r: &Result<u16, PoolProblem>| r.as_ref().err().map(|e| e.1.clone());
    assert!(
        reason(&out[&1]).is_some_and(|m| m.contains("already assigned to TCPRoute ns/r0")),
        "{:?}",
        out[&1]
    );
    assert!(
        reason(&out[&2]).is_some_and(|m| m.contains("outside")),
        "{:?}",
        out[&2]
    );
    assert_eq!(out[&3], Ok(40000));
    assert!(
        reason(&out[&4]).is_some_and(|m| m.contains("every port")),
        "{:?}",
        out[&4]
    );
}

/// Bad pools get listener conditions; the rest of the Gateway serves.
#[test]
fn invalid_pools_are_listener_conditions() {
    let yaml = r#"apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: aether}
spec: {controllerName: aether.io/edge}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: gw
  namespace: ns
  annotations:
    aether.io/port-range.good: "30000-30009"
    aether.io/port-range.reversed: "30100-30000"
    aether.io/port-range.huge: "40000-50000"
    aether.io/port-range.outside: "31000-31009"
    aether.io/port-range.http: "32000-32009"
    aether.io/port-range.overlap: "30005-30020"
spec:
  gatewayClassName: aether
  listeners:
  - {name: good, port: 30000, protocol: TCP}
  - {name: reversed, port: 30100, protocol: TCP}
  - {name: huge, port: 40000, protocol: UDP}
  - {name: outside, port: 30500, protocol: TCP}
  - {name: http, port: 32000, protocol: HTTP}
  - {name: overlap, port: 30010, protocol: TCP}
  - {name: plain, port: 8080, protocol: HTTP}
"#;
    let out = crate::testing::outcome(yaml);
    let gw = &out.statuses.gateways[&ObjectKey::new("ns", "gw")];
    let listeners = gw.status.listeners.as_deref().unwrap_or_default();
    let accepted = |name: &str| {
        let l = listeners
            .iter()
            .find(|l| l.name == name)
            .unwrap_or_else(|| panic!("no listener {name}"));
        let c = l
            .conditions
            .iter()
            .find(|c| c.type_ == "Accepted")
            .unwrap_or_else(|| panic!("no Accepted on {name}"));
        (c.status.clone(), c.reason.clone())
    };
    let ok = ("True".to_owned(), "Accepted".to_owned());
    let bad = |reason: &str| ("False".to_owned(), reason.to_owned());
    assert_eq!(accepted("good"), ok);
    assert_eq!(accepted("plain"), ok);
    assert_eq!(accepted("reversed"), bad("UnsupportedValue"));
    assert_eq!(accepted("huge"), bad("UnsupportedValue"));
    assert_eq!(accepted("outside"), bad("UnsupportedValue"));
    assert_eq!(accepted("http"), bad("UnsupportedValue"));
    assert_eq!(accepted("overlap"), bad("PortUnavailable"));
}

/// A refused request's status echoes the port it asked for; that is not a held port.
#[test]
fn only_accepted_parents_hold_a_port() {
    let route = |accepted: &str| -> L4Route {
        let yaml = format!(
            r#"kind: TCPRoute
metadata: {{name: r, namespace: ns}}
spec:
  parentRefs: [{{name: gw, sectionName: pool, port: 30001}}]
status:
  parents:
  - parentRef: {{name: gw, namespace: ns, sectionName: pool, port: 30001}}
    controllerName: aether.io/edge
    conditions:
    - {{type: Accepted, status: "{accepted}", reason: X, message: "", lastTransitionTime: "2026-01-01T00:00:00Z"}}
"#
        );
        serde_saphyr::from_str(&yaml).unwrap()
    };
    let gw = ObjectKey::new("ns", "gw");
    assert_eq!(
        previous_port(&route("True"), &gw, "pool", RANGE),
        Some(30001)
    );
    assert_eq!(previous_port(&route("False"), &gw, "pool", RANGE), None);
}
