//! HTTP/1.1 `Upgrade` (WebSocket and friends): the request and its `101` answer cross
//! the proxy with their upgrade headers, then bytes are copied both ways.

use http::header::{CONNECTION, HeaderMap, HeaderValue, UPGRADE};
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
