//! HTTP/2 from clients (h2c and ALPN `h2`), served with the h2 crate directly: each
//! stream's request goes to [`handle`] on a task of its own and its answer back onto
//! the stream. hyper's server layer did the same with more between: a body wrapper per
//! request, a future per stream spawned through its executor, a pipe future per
//! answer. Measured on a bare server, that layer cost about 0.5 µs of each h2c request
//! (benches/RESULTS.md, issue 19, session 34).

use std::future::{Future, poll_fn};
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Buf, Bytes};
use h2::server::SendResponse;
use h2::{Ping, Reason, SendStream};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response};
use hyper::body::Body;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::access_log::LoggedBody;
use crate::drain::Signal;
use crate::http::{ClientBody, ConnInfo, H2Body, handle};
use crate::state::ProxyState;

/// How connections are set up: the limits, and the keep-alive ping's interval (a
/// client that does not answer a ping by the next one is gone, and its connection is
/// closed).
#[derive(Clone)]
pub struct Settings {
    pub builder: h2::server::Builder,
    pub keepalive: Option<Duration>,
}

/// Serves one HTTP/2 connection until the client closes it, or it has drained after
/// `draining` fired (GOAWAY, then the streams in flight finish).
pub async fn serve<I>(
    io: I,
    state: &Arc<ProxyState>,
    info: Arc<ConnInfo>,
    settings: &Settings,
    draining: &Signal,
) -> Result<(), h2::Error>
where
    I: AsyncRead + AsyncWrite + Unpin,
{
    let mut conn = settings.builder.handshake::<_, Bytes>(io).await?;
    let mut pings = conn.ping_pong();
    let mut ping_sent = false;
    let mut keepalive = settings
        .keepalive
        .map(|every| tokio::time::interval_at(tokio::time::Instant::now() + every, every));
    let mut drain = pin!(draining.fired());
    let mut shutting_down = false;
    loop {
        tokio::select! {
            biased;
            () = &mut drain, if !shutting_down => {
                shutting_down = true;
                conn.graceful_shutdown();
            }
            accepted = conn.accept() => match accepted {
                Some(Ok((req, respond))) => {
                    tokio::spawn(stream(Arc::clone(state), Arc::clone(&info), req, respond));
                }
                Some(Err(e)) => return Err(e),
                None => return Ok(()),
            },
            _ = tick(keepalive.as_mut()) => {
                let Some(p) = pings.as_mut() else { continue };
                if ping_sent {
                    // No pong since the last tick: the client is gone.
                    conn.abrupt_shutdown(Reason::NO_ERROR);
                    continue;
                }
                ping_sent = p.send_ping(Ping::opaque()).is_ok();
            }
            pong = poll_fn(|cx| pong(pings.as_mut(), cx)), if ping_sent => {
                ping_sent = false;
                pong?;
            }
        }
    }
}

async fn tick(interval: Option<&mut tokio::time::Interval>) {
    match interval {
        Some(i) => {
            i.tick().await;
        }
        None => std::future::pending().await,
    }
}

fn pong(pings: Option<&mut h2::PingPong>, cx: &mut Context<'_>) -> Poll<Result<(), h2::Error>> {
    match pings {
        Some(p) => p.poll_pong(cx).map_ok(drop),
        None => Poll::Pending,
    }
}

/// One stream: the request handled, and its answer sent, unless the client resets
/// the stream first (which drops the handler and what it had in flight upstream).
async fn stream(
    state: Arc<ProxyState>,
    info: Arc<ConnInfo>,
    req: Request<h2::RecvStream>,
    mut respond: SendResponse<Bytes>,
) {
    let (parts, body) = req.into_parts();
    let body = ClientBody::H2(H2Body::new(body, &parts.headers));
    let answer = {
        let mut handled = pin!(handle(state, info, Request::from_parts(parts, body)));
        poll_fn(|cx| match handled.as_mut().poll(cx) {
            Poll::Ready(Ok(resp)) => Poll::Ready(Some(resp)),
            Poll::Ready(Err(never)) => match never {},
            Poll::Pending => respond.poll_reset(cx).map(|_| None),
        })
        .await
    };
    if let Some(resp) = answer {
        send(resp, respond).await;
    }
}

/// Sends an answer's head, then its body as DATA frames and trailers.
async fn send(resp: Response<LoggedBody>, mut respond: SendResponse<Bytes>) {
    let (mut parts, mut body) = resp.into_parts();
    strip_connection_headers(&mut parts.headers);
    if !parts.headers.contains_key(header::DATE) {
        parts.headers.insert(header::DATE, date());
    }
    let end = body.is_end_stream();
    if !end && let Some(len) = body.size_hint().exact() {
        parts
            .headers
            .entry(header::CONTENT_LENGTH)
            .or_insert_with(|| HeaderValue::from(len));
    }
    let head = Response::from_parts(parts, ());
    let Ok(mut out) = respond.send_response(head, end) else {
        return;
    };
    if end {
        return;
    }
    let mut waiting: Option<(Bytes, bool)> = None;
    if let Err(reason) = poll_fn(|cx| pipe(cx, &mut body, &mut out, &mut waiting)).await {
        out.send_reset(reason);
    }
}

/// Moves the body onto the stream as the client's window allows: a chunk in hand waits
/// for capacity before the next is read, so a slow client holds back the upstream.
fn pipe(
    cx: &mut Context<'_>,
    body: &mut LoggedBody,
    out: &mut SendStream<Bytes>,
    waiting: &mut Option<(Bytes, bool)>,
) -> Poll<Result<(), Reason>> {
    loop {
        if let Poll::Ready(reset) = out.poll_reset(cx) {
            return Poll::Ready(reset.map(|_| ()).map_err(|_| Reason::CANCEL));
        }
        if let Some((data, end)) = waiting.take() {
            if out.capacity() == 0 {
                match out.poll_capacity(cx) {
                    Poll::Ready(Some(Ok(_))) => {}
                    Poll::Ready(_) => return Poll::Ready(Err(Reason::CANCEL)),
                    Poll::Pending => {
                        *waiting = Some((data, end));
                        return Poll::Pending;
                    }
                }
                if out.capacity() == 0 {
                    *waiting = Some((data, end));
                    continue;
                }
            }
            if out.send_data(data, end).is_err() {
                return Poll::Ready(Err(Reason::CANCEL));
            }
            if end {
                return Poll::Ready(Ok(()));
            }
            continue;
        }
        match ready!(std::pin::Pin::new(&mut *body).poll_frame(cx)) {
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => {
                    let end = body.is_end_stream();
                    if data.remaining() == 0 {
                        if out.send_data(data, end).is_err() {
                            return Poll::Ready(Err(Reason::CANCEL));
                        }
                        if end {
                            return Poll::Ready(Ok(()));
                        }
                        continue;
                    }
                    // A claim of one byte, as hyper makes: h2 raises it to the
                    // chunk's length as it sends, and a claim of the whole chunk would
                    // hold connection window a body might never use.
                    out.reserve_capacity(1);
                    *waiting = Some((data, end));
                }
                Err(frame) => {
                    if let Ok(trailers) = frame.into_trailers() {
                        out.reserve_capacity(0);
                        return Poll::Ready(
                            out.send_trailers(trailers).map_err(|_| Reason::CANCEL),
                        );
                    }
                }
            },
            Some(Err(_)) => return Poll::Ready(Err(Reason::INTERNAL_ERROR)),
            None => {
                return Poll::Ready(
                    out.send_data(Bytes::new(), true)
                        .map_err(|_| Reason::CANCEL),
                );
            }
        }
    }
}

/// Headers that belong to one HTTP/1.1 connection and are malformed in HTTP/2 (RFC
/// 9113 section 8.2.2), as hyper strips them from an answer.
fn strip_connection_headers(headers: &mut HeaderMap) {
    const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
    const PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");
    for name in [
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        header::TE,
        KEEP_ALIVE,
        PROXY_CONNECTION,
    ] {
        headers.remove(name);
    }
    if let Some(connection) = headers.remove(header::CONNECTION)
        && let Ok(names) = connection.to_str()
    {
        for name in names.split(',') {
            headers.remove(name.trim());
        }
    }
}

/// The `Date` of an answer that has none (one the edge made itself): formatted once a
/// second per thread.
fn date() -> HeaderValue {
    use std::cell::RefCell;
    use std::time::{SystemTime, UNIX_EPOCH};
    thread_local! {
        static CACHED: RefCell<Option<(u64, HeaderValue)>> = const { RefCell::new(None) };
    }
    let now = SystemTime::now();
    let second = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let make = || {
        HeaderValue::from_str(&httpdate::fmt_http_date(now))
            .unwrap_or_else(|_| HeaderValue::from_static("Thu, 01 Jan 1970 00:00:00 GMT"))
    };
    CACHED
        .try_with(|c| {
            let mut c = c.borrow_mut();
            match &*c {
                Some((s, v)) if *s == second => v.clone(),
                _ => {
                    let v = make();
                    *c = Some((second, v.clone()));
                    v
                }
            }
        })
        .unwrap_or_else(|_| make())
}
