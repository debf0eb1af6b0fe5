use super::*;

/// A render holds every live cell for a moment, so a test rendering in parallel could
/// keep another's dropped cell alive past its assertion: these tests take turns.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

fn rendered() -> String {
    let mut s = String::new();
    render(&mut s);
    s
}

#[test]
fn a_series_lives_as_long_as_its_holders() {
    let _turn = serial();
    let (gw, a) = (Arc::from("ns/series-gw"), Arc::from("ns/series-a"));
    let first = route(&gw, &a);
    first.answered(200);
    // A reload compiles the route again while the old Snapshot still serves.
    let second = route(&gw, &a);
    drop(first);
    second.answered(204);
    let line =
        "aether_requests_total{gateway=\"ns/series-gw\",route=\"ns/series-a\",code=\"2xx\"} 2";
    assert!(rendered().contains(line), "{}", rendered());
    assert!(!rendered().contains("code=\"5xx\"} 0"));
    drop(second);
    assert!(!rendered().contains("ns/series-a"), "{}", rendered());

    let b = backend(&Arc::from("ns/series-svc:80"));
    b.retried("status");
    b.connect_error();
    let text = rendered();
    assert!(
        text.contains(
            "aether_upstream_retries_total{backend=\"ns/series-svc:80\",reason=\"status\"} 1"
        ),
        "{text}"
    );
    assert!(
        text.contains("# HELP aether_upstream_connect_errors_total "),
        "{text}"
    );
    drop(b);
    assert!(!rendered().contains("ns/series-svc:80"));

    // L4 routes' series are there at 0 from the start, and go with the route.
    let l4 = l4_route(&gw, &Arc::from("ns/series-tcp"));
    let line = "aether_tcp_connections_total{gateway=\"ns/series-gw\",route=\"ns/series-tcp\"} 0";
    assert!(rendered().contains(line), "{}", rendered());
    drop(l4);
    assert!(!rendered().contains("ns/series-tcp"));
}

/// A Gateway's duration histogram and its listener's connection series go when the
/// last route, listener and connection holding them do.
#[test]
fn gateway_and_listener_series_leave_with_their_holders() {
    let _turn = serial();
    let gw: Arc<str> = Arc::from("ns/series-gw-2");
    let stats = crate::telemetry::RouteStats::unrouted(Arc::clone(&gw));
    stats.record(404, std::time::Duration::from_millis(3));
    let l = listener(&gw, &[Arc::from("http")], false);
    let conn = l.accepted();
    let text = rendered();
    for line in [
        "aether_request_duration_seconds_bucket{gateway=\"ns/series-gw-2\",le=\"0.0025\"} 0\n",
        "aether_request_duration_seconds_bucket{gateway=\"ns/series-gw-2\",le=\"0.005\"} 1\n",
        "aether_request_duration_seconds_bucket{gateway=\"ns/series-gw-2\",le=\"+Inf\"} 1\n",
        "aether_request_duration_seconds_sum{gateway=\"ns/series-gw-2\"} 0.003\n",
        "aether_request_duration_seconds_count{gateway=\"ns/series-gw-2\"} 1\n",
        "aether_downstream_connections_active{gateway=\"ns/series-gw-2\",listener=\"http\"} 1\n",
        "aether_downstream_connections_total{gateway=\"ns/series-gw-2\",listener=\"http\"} 1\n",
        "# TYPE aether_request_duration_seconds histogram\n",
        "# TYPE aether_downstream_connections_active gauge\n",
    ] {
        assert!(text.contains(line), "no {line:?} in\n{text}");
    }
    drop(stats);
    assert!(!rendered().contains("series-gw-2\"}"), "{}", rendered());
    // The Snapshot's listener is gone; the open connection still holds the series.
    drop(l);
    assert!(
        rendered().contains("listener=\"http\"} 1"),
        "{}",
        rendered()
    );
    drop(conn);
    assert!(!rendered().contains("series-gw-2"), "{}", rendered());

    let udp = listener(&gw, &[Arc::from("dns")], true);
    let flow = udp.flow();
    let line = "aether_udp_flows_active{gateway=\"ns/series-gw-2\",listener=\"dns\"} 1";
    assert!(rendered().contains(line), "{}", rendered());
    assert!(!rendered().contains(
        "aether_downstream_connections_total{gateway=\"ns/series-gw-2\",listener=\"dns\"}"
    ));
    drop((flow, udp));
    assert!(!rendered().contains("series-gw-2"), "{}", rendered());
}

/// With the switch on, a route's latency histogram is rendered once it recorded, and
/// goes with the route; unrouted requests have none.
#[test]
fn route_latency_is_opt_in_and_leaves_with_the_route() {
    let _turn = serial();
    let gw: Arc<str> = Arc::from("ns/series-gw-3");
    let off = crate::telemetry::RouteStats::new(Arc::clone(&gw), "HTTPRoute", "ns/series-off");
    enable_route_latency(true);
    let on = crate::telemetry::RouteStats::new(Arc::clone(&gw), "GRPCRoute", "ns/series-on");
    let none = crate::telemetry::RouteStats::unrouted(Arc::clone(&gw));
    enable_route_latency(false);
    for s in [&off, &on, &*none] {
        s.record(200, std::time::Duration::from_secs(2));
    }
    let text = rendered();
    let line = "aether_route_request_duration_seconds_count{gateway=\"ns/series-gw-3\",route_kind=\"GRPCRoute\",route=\"ns/series-on\"} 1\n";
    assert!(text.contains(line), "{text}");
    let family: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.starts_with("aether_route_request_duration_seconds") && l.contains("series-gw-3")
        })
        .collect();
    assert_eq!(family.len(), 20, "{family:?}");
    assert!(
        family.iter().all(|l| l.contains("route=\"ns/series-on\"")),
        "{family:?}"
    );
    // Buckets in `le` order, whatever their text sorts as.
    let les: Vec<&str> = family
        .iter()
        .filter_map(|l| l.split("le=\"").nth(1)?.split('"').next())
        .collect();
    assert_eq!(les.get(12..15), Some(&["1", "2.5", "5"][..]), "{les:?}");
    drop(on);
    assert!(!rendered().contains("ns/series-on"), "{}", rendered());
}

/// A route's counter cell is made by its first answer, and a route built again while
/// an older build still serves (a reload) counts into the same cell, whichever of the
/// two answered first.
#[test]
fn a_route_cell_is_made_by_its_first_answer_and_shared_across_reloads() {
    let _turn = serial();
    let gw: Arc<str> = Arc::from("ns/series-gw-4");
    let old = crate::telemetry::RouteStats::new(Arc::clone(&gw), "HTTPRoute", "ns/lazy");
    assert!(live_route(&gw, &Arc::from("ns/lazy")).is_none());
    assert!(!rendered().contains("ns/lazy"), "{}", rendered());
    // Built again before either answered: each finds the other's cell when it counts.
    let new = crate::telemetry::RouteStats::new(Arc::clone(&gw), "HTTPRoute", "ns/lazy");
    old.record(200, std::time::Duration::from_millis(1));
    new.record(201, std::time::Duration::from_millis(1));
    let line = "aether_requests_total{gateway=\"ns/series-gw-4\",route=\"ns/lazy\",code=\"2xx\"} 2";
    assert!(rendered().contains(line), "{}", rendered());
    // Built while the old one holds a cell: takes it at once, so dropping the old one
    // (the reload done) resets nothing.
    let newer = crate::telemetry::RouteStats::new(Arc::clone(&gw), "HTTPRoute", "ns/lazy");
    drop((old, new));
    assert!(rendered().contains(line), "{}", rendered());
    newer.record(500, std::time::Duration::from_millis(1));
    let text = rendered();
    assert!(text.contains(line), "{text}");
    assert!(text.contains("route=\"ns/lazy\",code=\"5xx\"} 1"), "{text}");
    drop(newer);
    assert!(!rendered().contains("ns/lazy"), "{}", rendered());
}
