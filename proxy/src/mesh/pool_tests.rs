//! The mesh pool against a real hyper HTTP/2 server on loopback (plain TCP: the pool
//! does not care what the transport is).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Either, Full};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

use super::pool::{Pool, PoolSettings};
use crate::upstream::UpstreamError;

struct Server {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    /// Notified to make every open connection send GOAWAY (graceful shutdown).
    goaway: Arc<Notify>,
}

/// Answers after `x-delay-ms`, with the number of the connection that carried it.
async fn server(max_streams: u32) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let goaway = Arc::new(Notify::new());
    let (acc, ga) = (Arc::clone(&accepted), Arc::clone(&goaway));
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let n = acc.fetch_add(1, Ordering::SeqCst) + 1;
            let ga = Arc::clone(&ga);
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<hyper::body::Incoming>| async move {
                    let ms: u64 = req
                        .headers()
                        .get("x-delay-ms")
                        .and_then(|v| v.to_str().ok()?.parse().ok())
                        .unwrap_or(0);
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(n.to_string()))))
                });
                let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .timer(TokioTimer::new())
                    .max_concurrent_streams(max_streams)
                    .serve_connection(TokioIo::new(tcp), svc);
                tokio::pin!(conn);
                tokio::select! {
                    _ = conn.as_mut() => return,
                    _ = ga.notified() => conn.as_mut().graceful_shutdown(),
                }
                let _ = conn.await;
            });
        }
    });
    Server {
        addr,
        accepted,
        goaway,
    }
}

fn pool(max_streams: usize) -> Arc<Pool<SocketAddr>> {
    Arc::new(Pool::new(PoolSettings {
        max_streams,
        ..PoolSettings::default()
    }))
}

/// Sends one request; returns the server's connection number.
async fn get(pool: &Pool<SocketAddr>, addr: SocketAddr, generation: u64, delay_ms: u64) -> usize {
    let req = Request::builder()
        .uri(format!("http://{addr}/"))
        .header("x-delay-ms", delay_ms)
        .body(Either::Right(Full::new(Bytes::new())))
        .unwrap();
    let dial = || async move {
        TcpStream::connect(addr)
            .await
            .map_err(|e| UpstreamError::Connect(e.into()))
    };
    let resp = pool.send(&addr, generation, dial, req).await.unwrap();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    std::str::from_utf8(&body).unwrap().parse().unwrap()
}

async fn concurrent(
    pool: &Arc<Pool<SocketAddr>>,
    addr: SocketAddr,
    n: usize,
    delay_ms: u64,
) -> Vec<usize> {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let pool = Arc::clone(pool);
            tokio::spawn(async move { get(&pool, addr, 1, delay_ms).await })
        })
        .collect();
    let mut conns = Vec::new();
    for t in tasks {
        conns.push(t.await.unwrap());
    }
    conns
}

#[tokio::test]
async fn the_peers_stream_limit_opens_more_connections_and_no_more() {
    let s = server(2).await;
    let p = pool(100);
    let conns = concurrent(&p, s.addr, 6, 300).await;
    assert_eq!(s.accepted.load(Ordering::SeqCst), 3, "{conns:?}");
    for c in 1..=3 {
        assert_eq!(conns.iter().filter(|&&x| x == c).count(), 2, "{conns:?}");
    }
    // Sequential requests reuse the first connection.
    for _ in 0..5 {
        assert_eq!(get(&p, s.addr, 1, 0).await, 1);
    }
    assert_eq!(s.accepted.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn the_local_cap_applies_when_the_peer_allows_more() {
    let s = server(1000).await;
    let p = pool(10);
    concurrent(&p, s.addr, 40, 300).await;
    assert_eq!(s.accepted.load(Ordering::SeqCst), 4);
    assert_eq!(p.connections(&s.addr), 4);
}

#[tokio::test]
async fn goaway_retires_a_connection_and_its_in_flight_stream_finishes() {
    let s = server(100).await;
    let p = pool(100);
    assert_eq!(get(&p, s.addr, 1, 0).await, 1);
    let slow = {
        let p = Arc::clone(&p);
        let addr = s.addr;
        tokio::spawn(async move { get(&p, addr, 1, 500).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    s.goaway.notify_waiters();
    tokio::time::sleep(Duration::from_millis(100)).await;
    // A new request goes to a new connection; the one in flight completes on the old.
    assert_eq!(get(&p, s.addr, 1, 0).await, 2);
    assert_eq!(slow.await.unwrap(), 1);
}

#[tokio::test]
async fn a_new_generation_gets_new_connections_while_old_streams_finish() {
    let s = server(100).await;
    let p = pool(100);
    let slow = {
        let p = Arc::clone(&p);
        let addr = s.addr;
        tokio::spawn(async move { get(&p, addr, 1, 500).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(get(&p, s.addr, 2, 0).await, 2);
    assert_eq!(get(&p, s.addr, 2, 0).await, 2);
    assert_eq!(slow.await.unwrap(), 1);
    assert_eq!(p.connections(&s.addr), 1);
}

#[tokio::test]
async fn a_failed_dial_is_reported_and_the_next_request_dials_again() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let p = pool(100);
    let req = || {
        Request::builder()
            .uri(format!("http://{addr}/"))
            .body(Either::Right(Full::new(Bytes::new())))
            .unwrap()
    };
    let dial = || async move {
        TcpStream::connect(addr)
            .await
            .map_err(|e| UpstreamError::Connect(e.into()))
    };
    for _ in 0..2 {
        let r = p.send(&addr, 1, dial, req()).await;
        assert!(matches!(r, Err(UpstreamError::Connect(_))));
    }
}

#[tokio::test]
async fn idle_connections_are_reaped_and_busy_ones_kept() {
    let s = server(100).await;
    let p = Arc::new(Pool::new(PoolSettings {
        idle_timeout: Duration::from_millis(200),
        ..PoolSettings::default()
    }));
    assert_eq!(get(&p, s.addr, 1, 0).await, 1);
    let slow = {
        let p = Arc::clone(&p);
        let addr = s.addr;
        tokio::spawn(async move { get(&p, addr, 1, 600).await })
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    // Busy: its stream is still waiting for the response head.
    p.reap_idle();
    assert_eq!(p.connections(&s.addr), 1);
    assert_eq!(slow.await.unwrap(), 1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    p.reap_idle();
    assert_eq!(p.connections(&s.addr), 0);
    assert_eq!(get(&p, s.addr, 1, 0).await, 2);
}

#[tokio::test]
async fn a_peer_allowing_few_streams_gets_a_bounded_number_of_connections() {
    let s = server(1).await;
    let p = Arc::new(Pool::new(PoolSettings {
        max_connections: 2,
        ..PoolSettings::default()
    }));
    let slow: Vec<_> = (0..2)
        .map(|_| {
            let p = Arc::clone(&p);
            let addr = s.addr;
            tokio::spawn(async move { get(&p, addr, 1, 400).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let req = Request::builder()
        .uri(format!("http://{}/", s.addr))
        .body(Either::Right(Full::new(Bytes::new())))
        .unwrap();
    let addr = s.addr;
    let dial = || async move {
        TcpStream::connect(addr)
            .await
            .map_err(|e| UpstreamError::Connect(e.into()))
    };
    assert!(matches!(
        p.send(&addr, 1, dial, req).await,
        Err(UpstreamError::Connect(_))
    ));
    for t in slow {
        t.await.unwrap();
    }
    assert_eq!(s.accepted.load(Ordering::SeqCst), 2);
}
