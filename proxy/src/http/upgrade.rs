//! HTTP/1.1 `Upgrade` (WebSocket and friends): the request and its `101` answer cross
//! the proxy with their upgrade headers, then bytes are copied both ways.
//!
//! An upstream reached over HTTP/2 (h2c, a BackendTLSPolicy with h2, mesh mode) has no
//! `Upgrade`: a WebSocket goes there as RFC 8441's extended CONNECT (`:protocol
//! websocket`), whose `200` the client gets as the `101` of its own handshake, with the
//! `Sec-WebSocket-Accept` its key asks for (RFC 8441 section 5: the key and accept stay
//! on the HTTP/1.1 side). A peer that did not enable extended CONNECT fails the request
//! (502) rather than answer a plain GET the client would take for a refusal.

use http::header::{
    CONNECTION, HeaderMap, HeaderValue, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_KEY, UPGRADE,
};
use http::{Request, Response, Version};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;

/// Does this request ask to switch protocols?
pub fn requested<B>(req: &Request<B>) -> bool {
    req.version() == Version::HTTP_11
        && req.headers().contains_key(UPGRADE)
        && req
            .headers()
            .get_all(CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

/// The `Upgrade` token of a WebSocket opening handshake.
pub const WEBSOCKET: &str = "websocket";

/// Is this upgrade a WebSocket one (the only one HTTP/2 can carry, RFC 8441)?
pub fn is_websocket(upgrade: &HeaderValue) -> bool {
    upgrade
        .as_bytes()
        .eq_ignore_ascii_case(WEBSOCKET.as_bytes())
}

/// Makes an upgrade request's head an extended CONNECT for an HTTP/2 upstream.
pub fn to_extended_connect(parts: &mut http::request::Parts) {
    parts.method = http::Method::CONNECT;
    parts
        .extensions
        .insert(hyper::ext::Protocol::from_static(WEBSOCKET));
    parts.headers.remove(SEC_WEBSOCKET_KEY);
}

/// Makes an HTTP/2 upstream's `200` to an extended CONNECT the `101` the HTTP/1.1
/// client's handshake expects (`key`: its `Sec-WebSocket-Key`).
pub fn to_switching<B>(resp: &mut Response<B>, key: Option<&HeaderValue>) {
    *resp.status_mut() = http::StatusCode::SWITCHING_PROTOCOLS;
    let h = resp.headers_mut();
    h.insert(UPGRADE, HeaderValue::from_static(WEBSOCKET));
    if let Some(accept) = key.map(|k| websocket_accept(k.as_bytes())) {
        h.insert(SEC_WEBSOCKET_ACCEPT, accept);
    }
}

/// RFC 6455 section 4.2.2: SHA-1 of the key and the protocol's GUID, in base64; a
/// client checks it to know the server read its handshake (not a security measure).
pub fn websocket_accept(key: &[u8]) -> HeaderValue {
    use base64::Engine as _;
    const GUID: &[u8] = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY);
    ctx.update(key);
    ctx.update(GUID);
    let encoded = base64::engine::general_purpose::STANDARD.encode(ctx.finish());
    // Base64 is always a valid header value.
    HeaderValue::try_from(encoded).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// Puts back the headers an upgrade needs after hop-by-hop stripping removed them.
pub fn restore_headers(headers: &mut HeaderMap, upgrade: HeaderValue) {
    headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(UPGRADE, upgrade);
}

/// Joins the two upgraded connections once both sides have switched.
pub fn tunnel<B>(downstream: OnUpgrade, upstream: &mut Response<B>) {
    let upstream = hyper::upgrade::on(upstream);
    tokio::spawn(async move {
        let (down, up) = match tokio::try_join!(downstream, upstream) {
            Ok(pair) => pair,
            Err(e) => {
                tracing::debug!(error = %e, "upgrade did not complete");
                return;
            }
        };
        let mut down = TokioIo::new(down);
        let mut up = TokioIo::new(up);
        match tokio::io::copy_bidirectional(&mut down, &mut up).await {
            Ok((sent, received)) => tracing::debug!(sent, received, "upgraded connection closed"),
            Err(e) => tracing::debug!(error = %e, "upgraded connection failed"),
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn websocket_accept_is_rfc_6455s_example() {
        // RFC 6455 section 1.3.
        let got = websocket_accept(b"dGhlIHNhbXBsZSBub25jZQ==");
        assert_eq!(got, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    }
}
