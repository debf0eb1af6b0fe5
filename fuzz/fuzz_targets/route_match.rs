//! Route lookup against a brute-force reference: the same virtual host, and the same
//! winning entry, for arbitrary small route sets and requests.

#![no_main]

use std::sync::Arc;

use aether_proxy::backend::BackendSet;
use aether_proxy::filters::Filters;
use aether_proxy::routing::{
    PathMatch, RequestMatch, RouteEntry, RouteKind, RouteOrder, RouteTable, RuleAction,
    RuleExtras,
};
use aether_proxy::telemetry::RouteStats;
use arbitrary::Arbitrary;
use http::{HeaderMap, Method};
use libfuzzer_sys::fuzz_target;

/// Small alphabets so that collisions (the interesting cases) are common.
const LABELS: [&str; 4] = ["a", "b", "ex", "com"];
const SEGMENTS: [&str; 4] = ["", "x", "xy", "api"];

#[derive(Debug, Arbitrary)]
struct Input {
    routes: Vec<(Option<Host>, bool, Vec<u8>, i8)>,
    request_host: Vec<u8>,
    request_path: Vec<u8>,
}

#[derive(Debug, Arbitrary)]
struct Host {
    wildcard: bool,
    labels: Vec<u8>,
}

fn host(labels: &[u8]) -> String {
    let parts: Vec<&str> = labels
        .iter()
        .take(4)
        .map(|b| LABELS[usize::from(*b) % 4])
        .collect();
    if parts.is_empty() {
        "ex".into()
    } else {
        parts.join(".")
    }
}

fn path(segs: &[u8]) -> String {
    let s: String = segs
        .iter()
        .take(4)
        .map(|b| format!("/{}", SEGMENTS[usize::from(*b) % 4]))
        .collect();
    if s.is_empty() { "/".into() } else { s }
}

/// The spec's host choice, written the slow and obvious way.
fn reference_bucket(hosts: &[Option<String>], request: &str) -> Option<Option<String>> {
    if hosts.iter().flatten().any(|h| h == request) {
        return Some(Some(request.to_owned()));
    }
    let best_wild = hosts
        .iter()
        .flatten()
        .filter_map(|h| h.strip_prefix('*').map(|s| (h, s)))
        .filter(|(_, suffix)| request.len() > suffix.len() && request.ends_with(suffix))
        .max_by_key(|(_, suffix)| suffix.len())
        .map(|(h, _)| h.clone());
    if let Some(w) = best_wild {
        return Some(Some(w));
    }
    hosts.iter().any(Option::is_none).then_some(None)
}

/// A route as the reference matcher sees it, independent of the proxy's types.
struct Spec {
    host: Option<String>,
    exact: bool,
    path: String,
    created: i64,
    name: String,
}

impl Spec {
    fn prefix(&self) -> &str {
        self.path.trim_end_matches('/')
    }

    fn matches(&self, path: &str) -> bool {
        if self.exact {
            return path == self.path;
        }
        let p = self.prefix();
        path == p || path.starts_with(&format!("{p}/"))
    }

    /// Lower wins: exact before prefix, longer before shorter, older, then by name.
    fn rank(&self) -> (u8, std::cmp::Reverse<usize>, i64, String) {
        let len = if self.exact {
            self.path.len()
        } else {
            self.prefix().len()
        };
        (
            u8::from(!self.exact),
            std::cmp::Reverse(len),
            self.created,
            self.name.clone(),
        )
    }
}

fuzz_target!(|input: Input| {
    let mut builder = RouteTable::builder();
    let mut entries: Vec<(Option<String>, RouteEntry)> = Vec::new();
    let mut specs: Vec<Spec> = Vec::new();
    for (i, (h, exact, segs, created)) in input.routes.iter().take(12).enumerate() {
        let hostname = h.as_ref().map(|h| {
            let base = host(&h.labels);
            if h.wildcard {
                format!("*.{base}")
            } else {
                base
            }
        });
        let p = path(segs);
        let matcher = RequestMatch::path(if *exact {
            PathMatch::Exact(p.as_str().into())
        } else {
            PathMatch::prefix(&p)
        });
        let name: Arc<str> = format!("r{i}").into();
        let entry = RouteEntry {
            matcher,
            order: RouteOrder {
                created: i64::from(*created),
                route: Arc::clone(&name),
                rule: 0,
                index: 0,
            },
            action: Arc::new(RuleAction::new(
                RouteKind::Http,
                Filters::default(),
                BackendSet::default(),
                RuleExtras::default(),
                RouteStats::new("fuzz", "HTTPRoute", name),
            )),
        };
        builder.add(hostname.as_deref(), entry.clone());
        specs.push(Spec {
            host: hostname.clone(),
            exact: *exact,
            path: p,
            created: i64::from(*created),
            name: format!("r{i}"),
        });
        entries.push((hostname, entry));
    }
    let table = builder.build();
    let req_host = host(&input.request_host);
    let req_path = path(&input.request_path);
    let headers = HeaderMap::new();

    let got = table
        .virtual_host(&req_host)
        .and_then(|vh| vh.find(&Method::GET, &req_path, None, &headers))
        .map(|e| e.action.route().to_string());

    let hosts: Vec<Option<String>> = entries.iter().map(|(h, _)| h.clone()).collect();
    let want = reference_bucket(&hosts, &req_host).and_then(|bucket| {
        specs
            .iter()
            .filter(|spec| spec.host == bucket && spec.matches(&req_path))
            .min_by_key(|spec| spec.rank())
            .map(|spec| spec.name.clone())
    });
    assert_eq!(got, want, "host {req_host} path {req_path}");
});
