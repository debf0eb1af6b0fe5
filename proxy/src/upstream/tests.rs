//! The HTTP/1.1 pool against a real backend on loopback: reuse, idle expiry, and what
//! happens to connections whose exchange did not finish cleanly.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Either, Full};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::UpstreamSettings;
use super::h1::H1Pool;
use crate::http::Body;

/// Connections a backend accepted, and how many of them have ended.
#[derive(Default)]
struct Seen {
    accepted: AtomicUsize,
    closed: AtomicUsize,
}

/// A hyper HTTP/1.1 backend: `/big` streams 64 chunks of 16 KiB (chunked), anything
/// else answers its path with a Content-Length.
async fn backend() -> (SocketAddr, Arc<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Seen::default());
    let counts = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            counts.accepted.fetch_add(1, Ordering::SeqCst);
            let counts = Arc::clone(&counts);
            tokio::spawn(async move {
                let svc = service_fn(|req: Request<Incoming>| async move {
                    let path = req.uri().path().to_owned();
                    // Drain the request body before answering (but `/noread`, which
                    // answers a request whose body it never reads, as many servers do).
                    if path != "/noread" {
                        let _ = req.into_body().collect().await;
                    }
                    let body = if path == "/big" {
                        Either::Right(Chunks(64))
                    } else {
                        Either::Left(Full::new(Bytes::from(path)))
                    };
                    Ok::<_, Infallible>(Response::new(body))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
                counts.closed.fetch_add(1, Ordering::SeqCst);
            });
        }
    });
    (addr, seen)
}

/// 64 data frames of 16 KiB: a chunked answer several reads long.
struct Chunks(usize);

impl hyper::body::Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.0 == 0 {
            return std::task::Poll::Ready(None);
        }
        self.0 -= 1;
        std::task::Poll::Ready(Some(Ok(Frame::data(Bytes::from(vec![b'x'; 16 * 1024])))))
    }
}

fn settings(idle: Duration) -> UpstreamSettings {
    UpstreamSettings {
        idle_timeout: idle,
        ..UpstreamSettings::default()
    }
}

fn get(path: &str) -> Request<Body> {
    Request::builder()
        .uri(path)
        .header("host", "test")
        .body(Either::Right(Full::new(Bytes::new())))
        .unwrap()
}

/// Waits (bounded) until `cond` holds.
async fn eventually(what: &str, cond: impl Fn() -> bool) {
    for _ in 0..300 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("not within 3 s: {what}");
}

#[tokio::test]
async fn sequential_requests_share_one_kept_alive_connection() {
    let (addr, seen) = backend().await;
    let pool = H1Pool::new(&settings(Duration::from_secs(60)), None);
    for i in 0..5 {
        let path = format!("/r{i}");
        let resp = pool.send(addr, get(&path)).await.unwrap();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, path.as_bytes());
        assert_eq!(pool.shared().idle_count(addr), 1, "request {i}");
    }
    // A chunked body read to its end gives the connection back too.
    let resp = pool.send(addr, get("/big")).await.unwrap();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body.len(), 64 * 16 * 1024);
    assert_eq!(pool.shared().idle_count(addr), 1);
    assert_eq!(seen.accepted.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn concurrent_requests_each_get_a_connection_and_all_return_to_the_pool() {
    let (addr, seen) = backend().await;
    let pool = Arc::new(H1Pool::new(&settings(Duration::from_secs(60)), None));
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let pool = Arc::clone(&pool);
            tokio::spawn(async move {
                let resp = pool.send(addr, get(&format!("/c{i}"))).await.unwrap();
                resp.into_body().collect().await.unwrap().to_bytes()
            })
        })
        .collect();
    for (i, t) in tasks.into_iter().enumerate() {
        assert_eq!(t.await.unwrap(), format!("/c{i}").as_bytes());
    }
    let accepted = seen.accepted.load(Ordering::SeqCst);
    assert!((1..=8).contains(&accepted), "{accepted}");
    assert_eq!(pool.shared().idle_count(addr), accepted);
}

#[tokio::test]
async fn idle_connections_are_closed_after_the_idle_timeout() {
    let (addr, seen) = backend().await;
    let pool = H1Pool::new(&settings(Duration::from_millis(200)), None);
    let resp = pool.send(addr, get("/a")).await.unwrap();
    resp.into_body().collect().await.unwrap();
    assert_eq!(pool.shared().idle_count(addr), 1);
    // The reaper closes it with no request coming: the backend sees the socket end.
    eventually("the backend saw the idle connection close", || {
        seen.closed.load(Ordering::SeqCst) == 1
    })
    .await;
    assert_eq!(pool.shared().idle_count(addr), 0);
    // The next request dials afresh.
    let resp = pool.send(addr, get("/b")).await.unwrap();
    resp.into_body().collect().await.unwrap();
    assert_eq!(seen.accepted.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_body_dropped_before_its_end_closes_its_connection() {
    let (addr, seen) = backend().await;
    let pool = H1Pool::new(&settings(Duration::from_secs(60)), None);
    let resp = pool.send(addr, get("/big")).await.unwrap();
    let mut body = resp.into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert!(first.is_data());
    drop(body);
    assert_eq!(pool.shared().idle_count(addr), 0);
    eventually("the backend saw the connection close", || {
        seen.closed.load(Ordering::SeqCst) == 1
    })
    .await;
    let resp = pool.send(addr, get("/next")).await.unwrap();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "/next".as_bytes());
    assert_eq!(seen.accepted.load(Ordering::SeqCst), 2);
}

/// A backend that answers one request per connection with keep-alive headers, then
/// closes: the pooled connection is dead by the time the next request takes it.
#[tokio::test]
async fn a_pooled_connection_the_backend_closed_is_replaced_without_an_error() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&accepted);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                // Requests here have no body: the head is all there is to drain.
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = stream
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                    .await;
                let _ = stream.shutdown().await;
            });
        }
    });
    let pool = H1Pool::new(&settings(Duration::from_secs(60)), None);
    for i in 0..3 {
        let resp = pool.send(addr, get("/")).await.unwrap();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "ok".as_bytes(), "request {i}");
        // Let the backend's close reach us before the next checkout, some of the time.
        if i == 1 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_refused_connect_is_a_connect_error() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let pool = H1Pool::new(&settings(Duration::from_secs(60)), None);
    let err = pool.send(addr, get("/")).await.unwrap_err();
    assert!(matches!(err, super::UpstreamError::Connect(_)), "{err:?}");
}

/// A small body the backend never reads is still all in its buffer: the connection
/// stays usable, and each answer comes back whole.
#[tokio::test]
async fn requests_whose_body_the_backend_does_not_read_all_succeed() {
    let (addr, _seen) = backend().await;
    let pool = H1Pool::new(&settings(Duration::from_secs(60)), None);
    for i in 0..20 {
        let body: Body = Either::Right(Full::new(Bytes::from(vec![b'y'; 4096])));
        let req = Request::builder()
            .method("POST")
            .uri("/noread")
            .header("host", "test")
            .body(body)
            .unwrap();
        let resp = pool
            .send(addr, req)
            .await
            .unwrap_or_else(|e| panic!("request {i}: {e}"));
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "/noread".as_bytes());
    }
}

/// Servers (hyper's included) stop reading a body once it says it has ended, and
/// drop it without a last poll: the connection must go back to the pool all the same.
#[tokio::test]
async fn a_body_dropped_once_it_reports_its_end_returns_the_connection() {
    let (addr, seen) = backend().await;
    let pool = H1Pool::new(&settings(Duration::from_secs(60)), None);
    for i in 0..3 {
        let resp = pool.send(addr, get("/sized")).await.unwrap();
        let mut body = resp.into_body();
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "/sized".as_bytes());
        assert!(hyper::body::Body::is_end_stream(&body), "request {i}");
        drop(body);
        assert_eq!(pool.shared().idle_count(addr), 1, "request {i}");
    }
    assert_eq!(seen.accepted.load(Ordering::SeqCst), 1);
}
