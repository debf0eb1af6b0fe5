//! The admin server: readiness, Prometheus metrics, the active Snapshot and the
//! computed status of every object.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use aether_controller::Statuses;
use aether_controller::manifest::ManifestError;
use aether_proxy::state::ProxyState;
use arc_swap::ArcSwap;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

pub struct AdminState {
    pub proxy: Arc<ProxyState>,
    pub prometheus: crate::metrics::Exporter,
    /// What `/status` shows, as last published; rendered only when asked for.
    pub status: ArcSwap<StatusDoc>,
    /// Has a configuration been applied (its listeners bound, or their failures
    /// reported)? The admin server answers long before: a `/readyz` 200 then sent a
    /// takeover's traffic to sockets that did not exist yet.
    pub applied: AtomicBool,
}

/// The statuses and input errors of the last publish, shared with the publisher (not
/// copied): rendering the JSON on every reconcile cost time and held a second copy
/// of every status in memory for a page that is rarely read.
#[derive(Default)]
pub struct StatusDoc {
    pub statuses: Arc<Statuses>,
    pub errors: Arc<Vec<ManifestError>>,
}

impl StatusDoc {
    fn render(&self) -> Bytes {
        let doc = serde_json::json!({
            "items": self.statuses.items(),
            "manifestErrors": *self.errors,
        });
        serde_json::to_vec_pretty(&doc).unwrap_or_default().into()
    }
}

pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

pub async fn serve(listener: TcpListener, state: Arc<AdminState>) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "admin accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let state = Arc::clone(&state);
        tokio::spawn(async move {
            let svc = service_fn(move |req| answer(Arc::clone(&state), req));
            if let Err(e) = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await
            {
                tracing::debug!(error = %e, "admin connection ended with error");
            }
        });
    }
}

async fn answer(
    state: Arc<AdminState>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.method() != Method::GET {
        return Ok(text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n"));
    }
    Ok(match req.uri().path() {
        "/readyz" if !state.applied.load(Ordering::Acquire) => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "no configuration applied yet\n",
        ),
        "/readyz" if state.proxy.not_ready().is_some() => text(
            StatusCode::SERVICE_UNAVAILABLE,
            state.proxy.not_ready().unwrap_or_default(),
        ),
        "/readyz" => text(StatusCode::OK, "ok\n"),
        // Liveness only says the process answers: a draining edge is alive, and a
        // restart then would cut the drain short.
        "/livez" => text(StatusCode::OK, "ok\n"),
        // The process metrics are read from /proc on every scrape: a few small reads.
        "/metrics" => body(
            StatusCode::OK,
            "text/plain; version=0.0.4",
            state.prometheus.render().into(),
        ),
        // Thousands of routes or objects take a while to render: not on an async worker.
        "/config_dump" => {
            let snapshot = state.proxy.snapshot.load_full();
            let rendered = tokio::task::spawn_blocking(move || {
                serde_json::to_vec_pretty(&*snapshot).map_err(|e| e.to_string())
            })
            .await
            .map_err(|e| e.to_string());
            match rendered {
                Ok(Ok(v)) => body(StatusCode::OK, "application/json", v.into()),
                Ok(Err(e)) | Err(e) => {
                    tracing::error!(error = %e, "cannot render config dump");
                    text(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "cannot render config dump\n",
                    )
                }
            }
        }
        "/status" => {
            let doc = state.status.load_full();
            match tokio::task::spawn_blocking(move || doc.render()).await {
                Ok(rendered) => body(StatusCode::OK, "application/json", rendered),
                Err(e) => {
                    tracing::error!(error = %e, "cannot render status");
                    text(StatusCode::INTERNAL_SERVER_ERROR, "cannot render status\n")
                }
            }
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    })
}

fn text(status: StatusCode, s: &'static str) -> Response<Full<Bytes>> {
    body(status, "text/plain", Bytes::from_static(s.as_bytes()))
}

fn body(status: StatusCode, content_type: &'static str, b: Bytes) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(b));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    resp
}
