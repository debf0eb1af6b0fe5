//! Header rules at the proxy boundary: hop-by-hop headers never cross, and the
//! forwarding headers say who the client was.

use http::header::{
    CONNECTION, HeaderMap, HeaderName, HeaderValue, TE, TRANSFER_ENCODING, UPGRADE,
};

pub const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
pub const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
/// Set only by whoever terminates mTLS (the mesh's inbound listener); a client's own
/// would let it claim a mesh identity, so it never crosses the edge.
pub const X_FORWARDED_CLIENT_CERT: HeaderName = HeaderName::from_static("x-forwarded-client-cert");
/// Where an Envoy with an ORIGINAL_DST cluster sends the request (mesh mode sets it);
/// a client's own would pick the destination behind any such Envoy.
pub const X_ENVOY_ORIGINAL_DST_HOST: HeaderName =
    HeaderName::from_static("x-envoy-original-dst-host");
const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
const PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");
const PROXY_AUTHENTICATE: HeaderName = HeaderName::from_static("proxy-authenticate");
const PROXY_AUTHORIZATION: HeaderName = HeaderName::from_static("proxy-authorization");
const TRAILER: HeaderName = HeaderName::from_static("trailer");

const HOP_BY_HOP: [HeaderName; 9] = [
    CONNECTION,
    KEEP_ALIVE,
    PROXY_CONNECTION,
    PROXY_AUTHENTICATE,
    PROXY_AUTHORIZATION,
    TE,
    TRAILER,
    TRANSFER_ENCODING,
    UPGRADE,
];

/// Removes RFC 9110 §7.6.1 connection-specific headers, including any header the
/// `Connection` header itself names.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Most messages carry none or only `Connection`: one pass comparing the few names
    // present is cheaper than nine hashed lookups, and the usual case stops here.
    if !headers.keys().any(|name| HOP_BY_HOP.contains(name)) {
        return;
    }
    if headers.contains_key(CONNECTION) {
        // Nearly always `keep-alive` or `close` (every answer of an nginx backend
        // says `keep-alive`): tokens that name no header or one removed below anyway
        // make no `HeaderName` (an allocation for a name outside the standard set)
        // and leave the list empty (no allocation either).
        let named: Vec<HeaderName> = headers
            .get_all(CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|t| {
                !t.eq_ignore_ascii_case("close")
                    && !HOP_BY_HOP
                        .iter()
                        .any(|h| t.eq_ignore_ascii_case(h.as_str()))
            })
            .filter_map(|t| HeaderName::from_bytes(t.as_bytes()).ok())
            .collect();
        for name in named {
            headers.remove(name);
        }
    }
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
}

/// Sets `x-forwarded-for` and `x-forwarded-proto` for the upstream, and drops a
/// client-supplied `x-forwarded-client-cert` (only a mesh peer may vouch for one) and
/// `x-envoy-original-dst-host` (the mesh's routing header is the edge's to set).
///
/// Only the last `trusted_hops` entries of the client's `x-forwarded-for` survive:
/// those were appended by proxies in front of the edge that the operator vouches for
/// (a cloud load balancer is one hop). Anything to their left came from the client
/// and could say anything, so it is dropped, and the connection's peer is appended.
/// With no trusted hops (the default: the edge faces clients directly) the upstream
/// sees exactly one address, the peer's. `x-forwarded-proto` is kept from a trusted
/// hop that set it to `http` or `https`, else it says how the client reached us.
pub fn add_forwarded(
    headers: &mut HeaderMap,
    client_ip: &HeaderValue,
    proto: &'static str,
    trusted_hops: usize,
) {
    // Clients rarely send either: a pass over the names present is cheaper than two
    // hashed removals.
    if headers
        .keys()
        .any(|n| n == X_FORWARDED_CLIENT_CERT || n == X_ENVOY_ORIGINAL_DST_HOST)
    {
        headers.remove(X_FORWARDED_CLIENT_CERT);
        headers.remove(X_ENVOY_ORIGINAL_DST_HOST);
    }
    let kept = if trusted_hops == 0 {
        None
    } else {
        trusted_tail(headers, trusted_hops)
    };
    let value = match kept {
        Some(tail) if !tail.is_empty() => {
            let mut v = Vec::with_capacity(tail.len() + 2 + client_ip.len());
            v.extend_from_slice(tail.as_bytes());
            v.extend_from_slice(b", ");
            v.extend_from_slice(client_ip.as_bytes());
            HeaderValue::from_bytes(&v).ok()
        }
        _ => None,
    };
    headers.insert(X_FORWARDED_FOR, value.unwrap_or_else(|| client_ip.clone()));
    let trusted_proto = trusted_hops > 0
        && headers
            .get(&X_FORWARDED_PROTO)
            .is_some_and(|p| p == "https" || p == "http");
    if !trusted_proto {
        headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static(proto));
    }
}

/// The last `n` comma-separated entries of all `x-forwarded-for` values, joined.
fn trusted_tail(headers: &HeaderMap, n: usize) -> Option<String> {
    let entries: Vec<&str> = headers
        .get_all(&X_FORWARDED_FOR)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .collect();
    let start = entries.len().saturating_sub(n);
    Some(entries.get(start..)?.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_tokens_in_any_case_take_their_headers() {
        let mut h = HeaderMap::new();
        h.insert(
            CONNECTION,
            HeaderValue::from_static("Keep-Alive, CLOSE, X-Gone"),
        );
        h.insert(KEEP_ALIVE, HeaderValue::from_static("timeout=5"));
        h.insert("x-gone", HeaderValue::from_static("1"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-kept"));
    }

    #[test]
    fn connection_named_and_static_hop_by_hop_headers_go() {
        let mut h = HeaderMap::new();
        h.insert(CONNECTION, HeaderValue::from_static("keep-alive, x-secret"));
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert(KEEP_ALIVE, HeaderValue::from_static("timeout=5"));
        h.insert(TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        h.insert("x-keep", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-keep"));
    }

    #[test]
    fn forwarded_for_keeps_only_trusted_hops() {
        let ip = HeaderValue::from_static("127.0.0.9");
        let spoofed = || {
            let mut h = HeaderMap::new();
            h.append(
                X_FORWARDED_FOR,
                HeaderValue::from_static("6.6.6.6, 10.0.0.1"),
            );
            h.append(X_FORWARDED_FOR, HeaderValue::from_static("10.0.0.2"));
            h.insert(X_FORWARDED_PROTO, HeaderValue::from_static("https"));
            h
        };
        let mut h = spoofed();
        add_forwarded(&mut h, &ip, "http", 0);
        assert_eq!(h[&X_FORWARDED_FOR], "127.0.0.9");
        assert_eq!(h[&X_FORWARDED_PROTO], "http");
        let mut h = spoofed();
        add_forwarded(&mut h, &ip, "http", 2);
        assert_eq!(h[&X_FORWARDED_FOR], "10.0.0.1, 10.0.0.2, 127.0.0.9");
        assert_eq!(h[&X_FORWARDED_PROTO], "https");
        let mut h = spoofed();
        add_forwarded(&mut h, &ip, "http", 9);
        assert_eq!(
            h[&X_FORWARDED_FOR],
            "6.6.6.6, 10.0.0.1, 10.0.0.2, 127.0.0.9"
        );
        let mut h = HeaderMap::new();
        add_forwarded(&mut h, &ip, "https", 1);
        assert_eq!(h[&X_FORWARDED_FOR], "127.0.0.9");
        assert_eq!(h[&X_FORWARDED_PROTO], "https");
    }

    #[test]
    fn client_supplied_xfcc_and_original_dst_are_dropped() {
        let mut h = HeaderMap::new();
        h.insert(
            X_ENVOY_ORIGINAL_DST_HOST,
            HeaderValue::from_static("10.0.0.1:22"),
        );
        h.insert(
            X_FORWARDED_CLIENT_CERT,
            HeaderValue::from_static("URI=spiffe://td/ns/x/sa/admin"),
        );
        add_forwarded(&mut h, &HeaderValue::from_static("127.0.0.9"), "https", 0);
        assert!(!h.contains_key(X_FORWARDED_CLIENT_CERT));
        assert!(!h.contains_key(X_ENVOY_ORIGINAL_DST_HOST));
    }
}
