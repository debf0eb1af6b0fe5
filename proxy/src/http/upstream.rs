//! The pooled upstream client: keep-alive HTTP/1.1 connections per endpoint.

use std::time::Duration;

use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};

/// Upstream connection settings.
#[derive(Debug, Clone)]
pub struct UpstreamSettings {
    pub connect_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_idle_per_endpoint: usize,
}

impl Default for UpstreamSettings {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(60),
            max_idle_per_endpoint: 256,
        }
    }
}

pub type UpstreamClient = Client<HttpConnector, Incoming>;

pub fn client(settings: &UpstreamSettings) -> UpstreamClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(settings.connect_timeout));
    connector.enforce_http(true);
    Client::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(settings.idle_timeout)
        .pool_max_idle_per_host(settings.max_idle_per_endpoint)
        // The downstream Host is forwarded as-is; the client must not invent one.
        .set_host(false)
        .build(connector)
}
