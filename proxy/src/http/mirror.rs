//! RequestMirror: a copy of the request to another backend, fire-and-forget; its answer
//! is read and dropped, and it can never delay or fail the real request.
//!
//! Only requests without a body are mirrored: copying a streamed body would mean
//! buffering it or slowing the real upstream to the mirror's pace. Requests with a body
//! skip the mirror and are counted in `aether_mirror_skipped_total{reason="body"}`.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http::request::Parts as RequestParts;
use http::uri::PathAndQuery;
use http_body_util::{BodyExt, Either, Full};
use metrics::counter;

use super::outbound;
use crate::backend_client_cert::ClientCertificate;
use crate::filters::Mirror;
use crate::telemetry::MIRROR_SKIPPED_TOTAL;
use crate::upstream::Upstreams;

/// A mirror that hangs must not hold resources for long.
const MIRROR_TIMEOUT: Duration = Duration::from_secs(10);

pub fn send(
    upstreams: &Arc<Upstreams>,
    mirrors: &[Mirror],
    client_cert: Option<&Arc<ClientCertificate>>,
    parts: &RequestParts,
    path_and_query: &PathAndQuery,
    body_is_empty: bool,
) {
    for m in mirrors {
        if !m.sampled() {
            continue;
        }
        if !body_is_empty {
            counter!(MIRROR_SKIPPED_TOTAL, "reason" => "body").increment(1);
            continue;
        }
        let Some(endpoint) = m.backend.pick() else {
            counter!(MIRROR_SKIPPED_TOTAL, "reason" => "no_endpoints").increment(1);
            continue;
        };
        let mut req = Request::new(Either::Right(Full::new(Bytes::new())));
        *req.method_mut() = parts.method.clone();
        *req.headers_mut() = parts.headers.clone();
        let (mut p, body) = req.into_parts();
        let protocol = upstreams.protocol_for(&m.backend);
        if outbound::target(&mut p, path_and_query.clone(), protocol, endpoint, None).is_err() {
            continue;
        }
        let upstreams = Arc::clone(upstreams);
        let endpoint = endpoint.clone();
        let backend_ref = Arc::clone(&m.backend);
        let backend = Arc::clone(&m.backend.name);
        let client_cert = client_cert.cloned();
        tokio::spawn(async move {
            let sent = upstreams.send(
                protocol,
                (&backend_ref, client_cert.as_deref()),
                &endpoint,
                Request::from_parts(p, body),
            );
            let outcome = match tokio::time::timeout(MIRROR_TIMEOUT, sent).await {
                Ok(Ok(resp)) => {
                    // Drain so the connection can be reused.
                    let _ = resp.into_body().collect().await;
                    "ok"
                }
                Ok(Err(e)) => {
                    tracing::debug!(%backend, error = %e, "mirror request failed");
                    "error"
                }
                Err(_) => "timeout",
            };
            backend_ref.stats.mirrored(outcome);
        });
    }
}
