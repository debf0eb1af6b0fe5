//! Turns the downstream request into the upstream one: filters, target URI, Host or
//! `:authority`, hop-by-hop headers out, forwarding headers in.

use http::request::Parts as RequestParts;
use http::uri::{Parts, PathAndQuery, Scheme};
use http::{HeaderValue, Uri, Version, header};

use super::{ProxyError, Routed, headers, upgrade};
use crate::backend::{Endpoint, UpstreamProtocol};
use crate::filters::Filters;

/// What shapes the upstream request besides the downstream one.
pub struct Context<'a> {
    pub routed: &'a Routed,
    pub backend_filters: &'a Filters,
    pub client_ip: &'a HeaderValue,
    /// Proxies in front of the edge whose `x-forwarded-for` entries are kept.
    pub trusted_hops: usize,
}

/// Applies the filters and header rules; returns the path and query to send. The URI is
/// left for [`target`], so that mirrors can take a copy first.
pub fn prepare(parts: &mut RequestParts, t: &Context<'_>) -> Result<PathAndQuery, ProxyError> {
    // HTTP/2 carries the host in :authority; make it the Host header so filters and
    // HTTP/1.1 upstreams see one place.
    if !parts.headers.contains_key(header::HOST)
        && let Some(authority) = parts.uri.authority()
    {
        let host = HeaderValue::from_str(authority.as_str())
            .map_err(|_| ProxyError::BadRequest("invalid authority\n"))?;
        parts.headers.insert(header::HOST, host);
    }
    let mut path_and_query = parts
        .uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    for filters in [&t.routed.action.filters, t.backend_filters] {
        if let Some(m) = &filters.request_headers {
            m.apply(&mut parts.headers);
        }
        if let Some(rw) = &filters.rewrite {
            if let Some(host) = &rw.hostname {
                parts.headers.insert(header::HOST, host.clone());
            }
            if let Some(pq) = rw.path_and_query(&path_and_query, t.routed.matched_prefix) {
                path_and_query = pq;
            }
        }
    }
    headers::strip_hop_by_hop(&mut parts.headers);
    headers::add_forwarded(
        &mut parts.headers,
        t.client_ip,
        t.routed.scheme,
        t.trusted_hops,
    );
    Ok(path_and_query)
}

/// Points the request at `endpoint` over `protocol`. `upgrade` is the client's
/// `Upgrade` token, kept only where the protocol can carry it.
pub fn target(
    parts: &mut RequestParts,
    path_and_query: PathAndQuery,
    protocol: UpstreamProtocol,
    endpoint: &Endpoint,
    upgrade: Option<&HeaderValue>,
) -> Result<(), ProxyError> {
    let mut uri = Parts::default();
    uri.path_and_query = Some(path_and_query);
    match protocol {
        UpstreamProtocol::Http1 | UpstreamProtocol::Tls => {
            // Origin-form, as it goes on the wire (the pool is keyed by the endpoint);
            // Host stays as sent.
            parts.version = Version::HTTP_11;
            if let Some(proto) = upgrade {
                upgrade::restore_headers(&mut parts.headers, proto.clone());
            }
        }
        UpstreamProtocol::H2c | UpstreamProtocol::H2Tls | UpstreamProtocol::Mesh => {
            uri.scheme = Some(Scheme::HTTP);
            // The pool is keyed by endpoint elsewhere, so :authority can carry the
            // client's host, and Host must not be sent alongside it.
            let host = parts
                .headers
                .remove(header::HOST)
                .and_then(|h| h.to_str().ok().and_then(|h| h.parse().ok()));
            uri.authority = Some(host.unwrap_or_else(|| endpoint.authority.clone()));
            parts.version = Version::HTTP_2;
            if upgrade.is_some_and(upgrade::is_websocket) {
                upgrade::to_extended_connect(parts);
            }
            if protocol == UpstreamProtocol::Mesh {
                // The inbound listener is at another port than the workload; this
                // names the workload's (see crate::mesh).
                let dst = HeaderValue::from_str(endpoint.authority.as_str())
                    .map_err(|_| ProxyError::BadRequest("invalid endpoint\n"))?;
                parts.headers.insert(crate::mesh::ORIGINAL_DST_HEADER, dst);
                // Mesh traffic must be https at the pod: scheme follows the transport.
                uri.scheme = Some(Scheme::HTTPS);
            } else if protocol == UpstreamProtocol::H2Tls {
                uri.scheme = Some(Scheme::HTTPS);
            }
        }
    }
    parts.uri =
        Uri::from_parts(uri).map_err(|_| ProxyError::BadRequest("invalid request target\n"))?;
    Ok(())
}
