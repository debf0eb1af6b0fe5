//! The support crate's own contracts.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::json;

use crate::manifest::{Backend, Gateway, HttpRoute, Manifest};
use crate::*;

#[test]
fn networks_and_ports_are_handed_out_once() {
    let nets: BTreeSet<(u8, u8)> = (0..20)
        .map(|_| Net::allocate())
        .map(|n| (n.b, n.k))
        .collect();
    assert_eq!(nets.len(), 20);
    assert!(
        nets.iter()
            .all(|(b, k)| *b == NET_B && *k >= 1 && *k <= 254)
    );
    let ports: BTreeSet<u16> = (0..50).map(|_| free_port()).collect();
    assert_eq!(ports.len(), 50);
    assert!(ports.iter().all(|p| FREE_PORTS.contains(p)));
}

#[tokio::test]
async fn eventually_returns_the_value_or_names_what_and_the_last_error() {
    let mut n = 0;
    let v = eventually("three tries", Duration::from_secs(5), || {
        n += 1;
        let n = n;
        async move {
            ensure!(n >= 3, "try {n}");
            Ok(n)
        }
    })
    .await
    .unwrap();
    assert_eq!(v, 3);

    let e = eventually("never", Duration::from_millis(120), || async {
        Err::<(), _>(err("still no"))
    })
    .await
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("waiting for: never") && e.ends_with("last error: still no"),
        "{e}"
    );

    let e = eventually_some("nothing", Duration::from_millis(120), || async {
        None::<u8>
    })
    .await
    .unwrap_err()
    .to_string();
    assert!(e.contains("waiting for: nothing"), "{e}");
}

#[test]
fn builders_write_what_the_api_expects() {
    let gw = Gateway::test("edge")
        .namespace("infra")
        .address("127.77.1.5")
        .http("http", 8080)
        .https("https", 8443, "cert")
        .json();
    assert_eq!(gw["spec"]["gatewayClassName"], "aether");
    assert_eq!(
        gw["spec"]["addresses"],
        json!([{"type": "IPAddress", "value": "127.77.1.5"}])
    );
    assert_eq!(
        gw["spec"]["listeners"][1]["tls"]["certificateRefs"][0]["name"],
        "cert"
    );

    let r = HttpRoute::test("r")
        .parent("edge")
        .path_prefix("/a")
        .backend("svc", 80)
        .exact("/b")
        .backend("svc-b", 80)
        .backend("svc-c", 80)
        .json();
    let rules = &r["spec"]["rules"];
    assert_eq!(
        rules[0]["matches"][0]["path"],
        json!({"type": "PathPrefix", "value": "/a"})
    );
    assert_eq!(rules[1]["backendRefs"].as_array().map(Vec::len), Some(2));

    // A route with no match: one rule, for everything.
    let r = HttpRoute::test("all")
        .parent("edge")
        .backend("svc", 80)
        .json();
    assert_eq!(
        r["spec"]["rules"],
        json!([{"backendRefs": [{"name": "svc", "port": 80}]}])
    );

    let b = Backend::test("svc")
        .port("first-port", 8080, 3000)
        .endpoint("127.77.1.251:9000".parse().unwrap(), true);
    assert_eq!(
        b.slice()["ports"],
        json!([{"name": "first-port", "port": 9000}])
    );
    assert_eq!(b.service()["spec"]["ports"][0]["targetPort"], 3000);
    assert_eq!(b.yaml().matches("---\n").count(), 2);
}

#[test]
fn metric_sums_take_every_series_of_the_exact_name() {
    let text = "# TYPE x counter\nx{a=\"1\"} 2\nx{a=\"2\"} 3\nx_total 7\nx 1\n";
    assert_eq!(metric_sum(text, "x"), 6.0);
    assert_eq!(metric_sum_where(text, "x", "a=\"2\""), 3.0);
    assert_eq!(metric_sum(text, "missing"), 0.0);
}
