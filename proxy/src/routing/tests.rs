use std::sync::Arc;

use http::{HeaderMap, Method};

use super::*;
use crate::backend::BackendSet;

fn entry(route: &str, path: PathMatch, created: i64) -> RouteEntry {
    RouteEntry {
        matcher: RequestMatch::path(path),
        order: RouteOrder {
            created,
            route: route.into(),
            rule: 0,
            index: 0,
        },
        action: Arc::new(RuleAction::new(
            RouteKind::Http,
            crate::filters::Filters::default(),
            BackendSet::default(),
            RuleExtras::default(),
            crate::telemetry::RouteStats::new("gw", "HTTPRoute", route),
        )),
    }
}

fn find<'a>(t: &'a RouteTable, host: &str, path: &str) -> Option<&'a str> {
    t.virtual_host(host)?
        .find(&Method::GET, path, None, &HeaderMap::new())
        .map(|e| &**e.action.route())
}

#[test]
fn exact_host_beats_wildcard_and_longer_wildcard_beats_shorter() {
    let mut b = RouteTable::builder();
    b.add(
        Some("foo.example.com"),
        entry("exact", PathMatch::prefix("/"), 0),
    );
    b.add(
        Some("*.example.com"),
        entry("wild", PathMatch::prefix("/"), 0),
    );
    b.add(
        Some("*.b.example.com"),
        entry("longer-wild", PathMatch::prefix("/"), 0),
    );
    b.add(None, entry("any", PathMatch::prefix("/"), 0));
    let t = b.build();
    assert_eq!(find(&t, "FOO.example.com:8080", "/"), Some("exact"));
    assert_eq!(find(&t, "bar.example.com", "/"), Some("wild"));
    assert_eq!(find(&t, "a.bar.example.com", "/"), Some("wild"));
    assert_eq!(find(&t, "a.b.example.com", "/"), Some("longer-wild"));
    assert_eq!(find(&t, "example.com", "/"), Some("any"));
    assert_eq!(find(&t, "other.org", "/x"), Some("any"));
}

#[test]
fn unknown_host_without_catch_all_finds_nothing() {
    let mut b = RouteTable::builder();
    b.add(Some("a.example.com"), entry("a", PathMatch::prefix("/"), 0));
    let t = b.build();
    assert!(t.virtual_host("b.example.com").is_none());
    assert!(t.virtual_host("[::1]:80").is_none());
    assert!(t.virtual_host(&"x".repeat(400)).is_none());
}

/// A patched copy replaces, adds and removes exact, wildcard and any-host entries,
/// and leaves the table it was copied from as it was (a live Snapshot holds it).
#[test]
fn patched_table_changes_only_the_names_given() {
    let vhost = |route: &str| {
        Arc::new(VirtualHost::new(vec![entry(
            route,
            PathMatch::prefix("/"),
            0,
        )]))
    };
    let t = RouteTable::from_hosts([
        (Some("a.example.com"), vhost("a")),
        (Some("b.example.com"), vhost("b")),
        (Some("*.example.com"), vhost("wild")),
        (None, vhost("any")),
    ]);
    let p = t.patched([
        (Some("A.example.com"), Some(vhost("a2"))),
        (Some("b.example.com"), None),
        (Some("c.example.com"), Some(vhost("c"))),
        (Some("*.example.com"), None),
        (None, None),
    ]);
    assert_eq!(find(&p, "a.example.com", "/"), Some("a2"));
    assert_eq!(find(&p, "b.example.com", "/"), None);
    assert_eq!(find(&p, "c.example.com", "/"), Some("c"));
    assert_eq!(find(&p, "x.example.com", "/"), None);
    assert_eq!(find(&p, "other.org", "/"), None);
    assert_eq!(find(&t, "a.example.com", "/"), Some("a"));
    assert_eq!(find(&t, "b.example.com", "/"), Some("b"));
    assert_eq!(find(&t, "x.example.com", "/"), Some("wild"));
    assert_eq!(find(&t, "other.org", "/"), Some("any"));
}

#[test]
fn precedence_across_routes_then_age_then_name() {
    let mut b = RouteTable::builder();
    b.add(None, entry("newer-prefix", PathMatch::prefix("/api"), 20));
    b.add(None, entry("older-prefix", PathMatch::prefix("/api"), 10));
    b.add(None, entry("exact", PathMatch::Exact("/api/v1".into()), 30));
    b.add(None, entry("longer", PathMatch::prefix("/api/v1"), 30));
    let t = b.build();
    assert_eq!(find(&t, "h", "/api/v1"), Some("exact"));
    assert_eq!(find(&t, "h", "/api/v1/x"), Some("longer"));
    assert_eq!(find(&t, "h", "/api/v2"), Some("older-prefix"));
    assert_eq!(find(&t, "h", "/apix"), None);
}

/// One per rule in every Snapshot: 5,000 routes held 0.8 MiB of actions at 160 bytes.
#[test]
fn a_rule_action_stays_small() {
    assert!(std::mem::size_of::<RuleAction>() <= 96);
}
