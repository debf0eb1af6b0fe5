//! Data-plane routing over HTTP/1.1 and h2c: hosts, paths, matches, forwarding headers,
//! local error answers.

use http::StatusCode;

use crate::common::*;

/// Routes shared by the host-routing tests:
/// - `route-foo`: foo.example.com, PathPrefix / -> svc-a (echo "a")
/// - `route-bar`: bar.example.com, PathPrefix /app -> svc-b (echo "b")
/// - `route-missing`: missing.example.com, PathPrefix / -> svc-nope (no such Service)
fn host_routes() -> String {
    let mut s = route(
        "default",
        "route-foo",
        "edge",
        &["foo.example.com"],
        &[("PathPrefix", "/", "svc-a")],
    );
    s.push_str(&route(
        "default",
        "route-bar",
        "edge",
        &["bar.example.com"],
        &[("PathPrefix", "/app", "svc-b")],
    ));
    s.push_str(&route(
        "default",
        "route-missing",
        "edge",
        &["missing.example.com"],
        &[("PathPrefix", "/", "svc-nope")],
    ));
    s
}

fn check_forwarded(e: &Echo, env: &TestEnv, host: &str, path: &str) -> TestResult {
    ensure!(e.name() == "a", "expected backend a, got {}", e.0);
    ensure!(
        e.host() == host,
        "backend saw host {:?}, expected {host:?}: {}",
        e.host(),
        e.0
    );
    ensure!(
        e.path() == path,
        "backend saw path {:?}, expected {path:?}: {}",
        e.path(),
        e.0
    );
    ensure!(e.method() == "GET", "backend saw method {:?}", e.method());
    let client = env.net.client_ip().to_string();
    ensure!(
        e.header("x-forwarded-for") == Some(client.as_str()),
        "backend saw x-forwarded-for {:?}, expected {client:?}: {}",
        e.header("x-forwarded-for"),
        e.0
    );
    ensure!(
        e.header("x-forwarded-proto") == Some("http"),
        "backend saw x-forwarded-proto {:?}, expected \"http\": {}",
        e.header("x-forwarded-proto"),
        e.0
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn routing_http1_hosts_paths_and_forwarding_headers() -> TestResult {
    let env = TestEnv::new()?;
    let gw = env.net.gw();
    env.write_manifest("infra.yaml", &standard_infra(env.net))?;
    env.write_manifest("routes.yaml", &host_routes())?;
    let _echoes = env.spawn_echoes().await?;
    let _edge = env.spawn_edge("edge").await?;
    env.wait_listener(gw).await?;

    // The listener answers its own readiness probe, whatever the Host.
    let r = env.h1(gw, "nothing.example.net", "/aether/readyz").await?;
    ensure!(r.status == StatusCode::OK, "/aether/readyz: {}", r.status);

    let e = env.h1(gw, "foo.example.com", "/a/b?x=1").await?.echo()?;
    check_forwarded(&e, &env, "foo.example.com", "/a/b?x=1")?;

    // Host matching ignores the port and case; the Host header is passed on unchanged.
    let e = env.h1(gw, "FOO.Example.COM:8080", "/c").await?.echo()?;
    ensure!(e.name() == "a", "mixed-case host with port went to {}", e.0);
    ensure!(
        e.host() == "FOO.Example.COM:8080",
        "Host was not preserved: {}",
        e.0
    );

    // A different hostname goes to a different backend.
    let e = env.h1(gw, "bar.example.com", "/app/x").await?.echo()?;
    ensure!(e.name() == "b", "bar.example.com/app/x went to {}", e.0);
    ensure!(
        e.host() == "bar.example.com",
        "bar host not preserved: {}",
        e.0
    );

    // Unmatched path on a known host, and an unknown host: 404.
    let r = env.h1(gw, "bar.example.com", "/other").await?;
    ensure!(
        r.status == StatusCode::NOT_FOUND,
        "unmatched path: {} {:?}",
        r.status,
        r.text()
    );
    let r = env.h1(gw, "baz.example.com", "/app/x").await?;
    ensure!(
        r.status == StatusCode::NOT_FOUND,
        "unmatched host: {} {:?}",
        r.status,
        r.text()
    );

    // A backendRef naming a Service that does not exist: 500.
    let r = env.h1(gw, "missing.example.com", "/").await?;
    ensure!(
        r.status == StatusCode::INTERNAL_SERVER_ERROR,
        "missing Service: {} {:?}",
        r.status,
        r.text()
    );

    // Hop-by-hop headers (static ones and those named by Connection) are dropped; an
    // incoming x-forwarded-for chain is not trusted by default (forwarded.rs covers
    // trusted hops): the backend sees the client address alone.
    let mut c = H1Conn::connect(env.net.client_ip(), gw).await?;
    let r = c
        .send(
            "GET",
            "foo.example.com",
            "/hop",
            &[
                ("connection", "x-hop-secret"),
                ("x-hop-secret", "1"),
                ("keep-alive", "timeout=5"),
                ("proxy-connection", "keep-alive"),
                ("x-keep", "yes"),
                ("x-forwarded-for", "10.1.2.3"),
            ],
        )
        .await?;
    let e = r.echo()?;
    ensure!(
        e.header("x-keep") == Some("yes"),
        "end-to-end header lost: {}",
        e.0
    );
    for h in ["x-hop-secret", "keep-alive", "proxy-connection"] {
        ensure!(
            e.header(h).is_none(),
            "hop-by-hop header {h} reached the backend: {}",
            e.0
        );
    }
    let chain = env.net.client_ip().to_string();
    ensure!(
        e.header("x-forwarded-for") == Some(chain.as_str()),
        "x-forwarded-for chain: got {:?}, expected {chain:?}",
        e.header("x-forwarded-for")
    );
    // The same keep-alive connection keeps working.
    let e = c.get("bar.example.com", "/app").await?.echo()?;
    ensure!(
        e.name() == "b",
        "second request on a keep-alive connection went to {}",
        e.0
    );

    env.pass()
}

#[tokio::test(flavor = "multi_thread")]
async fn routing_h2c_hosts_paths_and_forwarding_headers() -> TestResult {
    let env = TestEnv::new()?;
    let gw = env.net.gw();
    env.write_manifest("infra.yaml", &standard_infra(env.net))?;
    env.write_manifest("routes.yaml", &host_routes())?;
    let _echoes = env.spawn_echoes().await?;
    let _edge = env.spawn_edge("edge").await?;
    env.wait_listener(gw).await?;

    let mut c = H2Conn::connect(env.net.client_ip(), gw).await?;
    let r = c.get("nothing.example.net", "/aether/readyz").await?;
    ensure!(
        r.status == StatusCode::OK,
        "h2c /aether/readyz: {}",
        r.status
    );

    let e = c.get("foo.example.com", "/a/b?x=1").await?.echo()?;
    check_forwarded(&e, &env, "foo.example.com", "/a/b?x=1")?;

    let e = c.get("FOO.example.com:8080", "/c").await?.echo()?;
    ensure!(
        e.name() == "a",
        "h2c mixed-case host with port went to {}",
        e.0
    );

    let e = c.get("bar.example.com", "/app/x").await?.echo()?;
    ensure!(e.name() == "b", "h2c bar.example.com/app/x went to {}", e.0);
    ensure!(
        e.host() == "bar.example.com",
        "h2c :authority not passed as host: {}",
        e.0
    );

    let r = c.get("bar.example.com", "/other").await?;
    ensure!(
        r.status == StatusCode::NOT_FOUND,
        "h2c unmatched path: {}",
        r.status
    );
    let r = c.get("baz.example.com", "/app/x").await?;
    ensure!(
        r.status == StatusCode::NOT_FOUND,
        "h2c unmatched host: {}",
        r.status
    );
    let r = c.get("missing.example.com", "/").await?;
    ensure!(
        r.status == StatusCode::INTERNAL_SERVER_ERROR,
        "h2c missing Service: {}",
        r.status
    );

    // Concurrent streams on one connection each reach the right backend.
    let mut tasks = Vec::new();
    for i in 0..20 {
        let mut c = c.clone();
        tasks.push(tokio::spawn(async move {
            let (host, want) = if i % 2 == 0 {
                ("foo.example.com", "a")
            } else {
                ("bar.example.com", "b")
            };
            let path = format!("/app/{i}");
            let e = c.get(host, &path).await?.echo()?;
            ensure!(
                e.name() == want && e.path() == path,
                "stream {i} got {}",
                e.0
            );
            Ok::<(), BoxError>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    env.pass()
}

#[tokio::test(flavor = "multi_thread")]
async fn routing_path_prefix_vs_exact_precedence() -> TestResult {
    let env = TestEnv::new()?;
    let gw = env.net.gw();
    env.write_manifest("infra.yaml", &standard_infra(env.net))?;
    let mut routes = route(
        "default",
        "route-prefix",
        "edge",
        &["p.example.com"],
        &[
            ("PathPrefix", "/api", "svc-a"),
            ("PathPrefix", "/api/v2", "svc-b"),
        ],
    );
    // The Exact rule lives in another route for the same hostname.
    routes.push_str(&route(
        "default",
        "route-exact",
        "edge",
        &["p.example.com"],
        &[("Exact", "/api/exact", "svc-b")],
    ));
    env.write_manifest("routes.yaml", &routes)?;
    let _echoes = env.spawn_echoes().await?;
    let _edge = env.spawn_edge("edge").await?;
    env.wait_listener(gw).await?;

    let cases: &[(&str, Option<&str>)] = &[
        ("/api/exact", Some("b")),
        ("/api/exact?q=1", Some("b")),
        ("/api/exact/more", Some("a")),
        ("/api/exact/", Some("a")),
        ("/api", Some("a")),
        ("/api/", Some("a")),
        ("/api/other", Some("a")),
        ("/api/v2", Some("b")),
        ("/api/v2/", Some("b")),
        ("/api/v2/x", Some("b")),
        ("/api/v20", Some("a")),
        ("/apix", None),
        ("/", None),
        ("/other/api", None),
    ];
    let mut h2 = H2Conn::connect(env.net.client_ip(), gw).await?;
    for (path, want) in cases {
        let r1 = env.h1(gw, "p.example.com", path).await?;
        let r2 = h2.get("p.example.com", path).await?;
        for (proto, r) in [("HTTP/1.1", r1), ("h2c", r2)] {
            match want {
                Some(name) => {
                    let e = r.echo().map_err(|e| err(format!("{proto} {path}: {e}")))?;
                    ensure!(
                        e.name() == *name,
                        "{proto} {path}: expected backend {name}, got {}",
                        e.0
                    );
                    ensure!(
                        e.path() == *path,
                        "{proto} {path}: backend saw path {}",
                        e.path()
                    );
                }
                None => ensure!(
                    r.status == StatusCode::NOT_FOUND,
                    "{proto} {path}: expected 404, got {} {:?}",
                    r.status,
                    r.text()
                ),
            }
        }
    }
    env.pass()
}

#[tokio::test(flavor = "multi_thread")]
async fn routing_header_query_and_method_matches() -> TestResult {
    let env = TestEnv::new()?;
    let gw = env.net.gw();
    env.write_manifest("infra.yaml", &standard_infra(env.net))?;
    let routes = "---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: route-header
  namespace: default
spec:
  parentRefs:
  - name: edge
  hostnames: [\"h.example.com\"]
  rules:
  - matches:
    - headers:
      - name: X-Tier
        value: gold
    backendRefs:
    - name: svc-b
      port: 80
  - backendRefs:
    - name: svc-a
      port: 80
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: route-regex
  namespace: default
spec:
  parentRefs:
  - name: edge
  hostnames: [\"r.example.com\"]
  rules:
  - matches:
    - headers:
      - name: x-id
        type: RegularExpression
        value: \"^user-[0-9]+$\"
    backendRefs:
    - name: svc-b
      port: 80
  - backendRefs:
    - name: svc-a
      port: 80
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: route-query
  namespace: default
spec:
  parentRefs:
  - name: edge
  hostnames: [\"q.example.com\"]
  rules:
  - matches:
    - queryParams:
      - name: v
        value: \"2\"
    backendRefs:
    - name: svc-b
      port: 80
  - backendRefs:
    - name: svc-a
      port: 80
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: route-method
  namespace: default
spec:
  parentRefs:
  - name: edge
  hostnames: [\"m.example.com\"]
  rules:
  - matches:
    - method: POST
    backendRefs:
    - name: svc-b
      port: 80
  - backendRefs:
    - name: svc-a
      port: 80
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: route-precedence
  namespace: default
spec:
  parentRefs:
  - name: edge
  hostnames: [\"pr.example.com\"]
  rules:
  - matches:
    - path:
        type: PathPrefix
        value: /x
      headers:
      - name: x-tier
        value: gold
    backendRefs:
    - name: svc-b
      port: 80
  - matches:
    - path:
        type: PathPrefix
        value: /x/y
    backendRefs:
    - name: svc-a
      port: 80
";
    env.write_manifest("routes.yaml", routes)?;
    let _echoes = env.spawn_echoes().await?;
    let _edge = env.spawn_edge("edge").await?;
    env.wait_listener(gw).await?;

    type Case<'a> = (
        &'a str,
        &'a str,
        &'a str,
        &'a [(&'a str, &'a str)],
        Option<&'a str>,
    );
    let cases: &[Case] = &[
        (
            "GET",
            "h.example.com",
            "/",
            &[("x-tier", "gold")],
            Some("b"),
        ),
        (
            "GET",
            "h.example.com",
            "/",
            &[("x-tier", "silver")],
            Some("a"),
        ),
        ("GET", "h.example.com", "/", &[], Some("a")),
        (
            "GET",
            "r.example.com",
            "/",
            &[("x-id", "user-42")],
            Some("b"),
        ),
        (
            "GET",
            "r.example.com",
            "/",
            &[("x-id", "user-x")],
            Some("a"),
        ),
        ("GET", "q.example.com", "/p?v=2", &[], Some("b")),
        ("GET", "q.example.com", "/p?w=1&v=2", &[], Some("b")),
        ("GET", "q.example.com", "/p?v=3", &[], Some("a")),
        ("GET", "q.example.com", "/p", &[], Some("a")),
        ("POST", "m.example.com", "/", &[], Some("b")),
        ("GET", "m.example.com", "/", &[], Some("a")),
        // A longer path prefix beats a header match.
        (
            "GET",
            "pr.example.com",
            "/x/y",
            &[("x-tier", "gold")],
            Some("a"),
        ),
        (
            "GET",
            "pr.example.com",
            "/x/z",
            &[("x-tier", "gold")],
            Some("b"),
        ),
        ("GET", "pr.example.com", "/x/z", &[], None),
    ];
    let mut h1 = H1Conn::connect(env.net.client_ip(), gw).await?;
    let mut h2 = H2Conn::connect(env.net.client_ip(), gw).await?;
    for (method, host, path, headers, want) in cases {
        let r1 = h1.send(method, host, path, headers).await?;
        let r2 = h2.send(method, host, path, headers).await?;
        for (proto, r) in [("HTTP/1.1", r1), ("h2c", r2)] {
            let what = format!("{proto} {method} {host}{path} {headers:?}");
            match want {
                Some(name) => {
                    let e = r.echo().map_err(|e| err(format!("{what}: {e}")))?;
                    ensure!(
                        e.name() == *name,
                        "{what}: expected backend {name}, got {}",
                        e.0
                    );
                    ensure!(
                        e.method() == *method,
                        "{what}: backend saw method {}",
                        e.method()
                    );
                }
                None => ensure!(
                    r.status == StatusCode::NOT_FOUND,
                    "{what}: expected 404, got {}",
                    r.status
                ),
            }
        }
    }
    env.pass()
}

#[tokio::test(flavor = "multi_thread")]
async fn backend_errors_and_listener_readyz() -> TestResult {
    let env = TestEnv::new()?;
    let gw = env.net.gw();
    let mut infra = standard_infra(env.net);
    // svc-down: an EndpointSlice whose only endpoint is not ready.
    infra.push_str(&backend("default", "svc-down", env.net.echo_a(), false));
    // svc-empty: a Service without any EndpointSlice.
    infra.push_str(
        "---
apiVersion: v1
kind: Service
metadata:
  name: svc-empty
  namespace: default
spec:
  ports:
  - name: http
    port: 80
    targetPort: 9000
",
    );
    env.write_manifest("infra.yaml", &infra)?;
    let mut routes = route(
        "default",
        "route-ok",
        "edge",
        &["ok.example.com"],
        &[("PathPrefix", "/", "svc-a")],
    );
    routes.push_str(&route(
        "default",
        "route-missing",
        "edge",
        &["missing.example.com"],
        &[("PathPrefix", "/", "svc-nope")],
    ));
    routes.push_str(&route(
        "default",
        "route-down",
        "edge",
        &["down.example.com"],
        &[("PathPrefix", "/", "svc-down")],
    ));
    routes.push_str(&route(
        "default",
        "route-empty",
        "edge",
        &["empty.example.com"],
        &[("PathPrefix", "/", "svc-empty")],
    ));
    env.write_manifest("routes.yaml", &routes)?;
    let _echoes = env.spawn_echoes().await?;
    let _edge = env.spawn_edge("edge").await?;
    env.wait_listener(gw).await?;

    let e = env.h1(gw, "ok.example.com", "/").await?.echo()?;
    ensure!(e.name() == "a", "ok route went to {}", e.0);

    // /aether/readyz is answered by the listener before routing, even on a routed host.
    for host in ["ok.example.com", "unknown.example.org"] {
        let r = env.h1(gw, host, "/aether/readyz").await?;
        ensure!(
            r.status == StatusCode::OK,
            "HTTP/1.1 /aether/readyz for {host}: {}",
            r.status
        );
        ensure!(
            r.json().is_err(),
            "/aether/readyz for {host} was proxied to the echo backend: {}",
            r.text()
        );
        let r = env.h2(gw, host, "/aether/readyz").await?;
        ensure!(
            r.status == StatusCode::OK,
            "h2c /aether/readyz for {host}: {}",
            r.status
        );
        ensure!(
            r.json().is_err(),
            "h2c /aether/readyz for {host} was proxied: {}",
            r.text()
        );
    }

    for (host, want) in [
        ("missing.example.com", StatusCode::INTERNAL_SERVER_ERROR),
        ("down.example.com", StatusCode::SERVICE_UNAVAILABLE),
        ("empty.example.com", StatusCode::SERVICE_UNAVAILABLE),
        ("nope.example.com", StatusCode::NOT_FOUND),
    ] {
        let r = env.h1(gw, host, "/x").await?;
        ensure!(
            r.status == want,
            "HTTP/1.1 {host}: expected {want}, got {} {:?}",
            r.status,
            r.text()
        );
        let r = env.h2(gw, host, "/x").await?;
        ensure!(
            r.status == want,
            "h2c {host}: expected {want}, got {} {:?}",
            r.status,
            r.text()
        );
    }
    env.pass()
}

#[tokio::test(flavor = "multi_thread")]
async fn foreign_gateway_class_is_not_served() -> TestResult {
    let env = TestEnv::new()?;
    let gw = env.net.gw();
    let mut infra = standard_infra(env.net);
    infra.push_str(&gateway_class("foreign", "example.com/other-controller"));
    infra.push_str(
        &Gateway::test("foreign-gw")
            .class("foreign")
            .address(&env.net.ip_str(7))
            .http("http", LISTENER_PORT)
            .yaml(),
    );
    env.write_manifest("infra.yaml", &infra)?;
    let mut routes = route(
        "default",
        "route-ok",
        "edge",
        &["ok.example.com"],
        &[("PathPrefix", "/", "svc-a")],
    );
    routes.push_str(&route(
        "default",
        "route-foreign",
        "foreign-gw",
        &["ok.example.com"],
        &[("PathPrefix", "/", "svc-b")],
    ));
    env.write_manifest("routes.yaml", &routes)?;
    let _echoes = env.spawn_echoes().await?;
    let _edge = env.spawn_edge("edge").await?;
    env.wait_listener(gw).await?;

    let e = env.h1(gw, "ok.example.com", "/").await?.echo()?;
    ensure!(e.name() == "a", "own route went to {}", e.0);
    // Our Gateway is served (the config is loaded), so the foreign one must not be.
    let foreign = env.net.addr(7, LISTENER_PORT);
    match env.h1(foreign, "ok.example.com", "/").await {
        Err(_) => {}
        Ok(r) => {
            return Err(err(format!(
                "Gateway of a foreign class answered at {foreign}: {} {:?}",
                r.status,
                r.text()
            )));
        }
    }
    env.pass()
}

/// The echo backend itself (the test tool): both protocols, path and query, delay.
#[tokio::test(flavor = "multi_thread")]
async fn echo_backend_speaks_http1_and_h2c() -> TestResult {
    let env = TestEnv::new()?;
    let echo = env.net.echo_a();
    let _echo = env.spawn_echo(echo, "solo").await?;
    let e = env
        .h1(echo, "direct.example.com", "/a/b?x=1")
        .await?
        .echo()?;
    ensure!(e.name() == "solo", "echo name: {}", e.0);
    ensure!(
        e.protocol() == "HTTP/1.1",
        "echo protocol over HTTP/1.1: {}",
        e.0
    );
    ensure!(
        e.path() == "/a/b?x=1" && e.host() == "direct.example.com",
        "echo saw {}",
        e.0
    );
    let e = env.h2(echo, "direct.example.com", "/c?y=2").await?.echo()?;
    ensure!(
        e.protocol() == "HTTP/2.0",
        "echo protocol over h2c: {}",
        e.0
    );
    ensure!(
        e.path() == "/c?y=2" && e.host() == "direct.example.com",
        "echo saw over h2c {}",
        e.0
    );
    let mut c = H1Conn::connect(env.net.client_ip(), echo).await?;
    let started = std::time::Instant::now();
    let e = c
        .send(
            "GET",
            "direct.example.com",
            "/slow",
            &[("x-echo-delay-ms", "200"), ("x-multi", "1")],
        )
        .await?
        .echo()?;
    ensure!(
        started.elapsed() >= std::time::Duration::from_millis(200),
        "x-echo-delay-ms was not honoured"
    );
    ensure!(e.header("x-multi") == Some("1"), "echo headers: {}", e.0);
    env.pass()
}
