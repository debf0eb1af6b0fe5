//! The request heads the relay takes, and the upstream head it writes for one.
//!
//! Only heads whose meaning no other reader could take differently: HTTP/1.1, `GET`
//! or `HEAD` in origin form, one `Host`, no body (no `Transfer-Encoding`, no
//! `Content-Length` but `0`), no `Upgrade` or `Expect`, `Connection` naming only
//! `close` or `keep-alive`. Anything else is not refused but left to the full request
//! path ([`crate::http`]), which frames and checks every request.

use http::Method;

/// Connection-specific headers (RFC 9110 §7.6.1) and the forwarding headers the edge
/// sets itself (see `crate::http::headers`); never copied upstream.
const NOT_COPIED: [&str; 14] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "x-forwarded-for",
    "x-forwarded-proto",
    "x-forwarded-client-cert",
    "x-envoy-original-dst-host",
    "x-request-id",
];

/// What the relay needs of a request head it takes: `'b` borrows the read buffer,
/// `'h` the parsed header list (which need not outlive the routing).
pub(super) struct Head<'h, 'b> {
    pub method: Method,
    /// Path and query, as sent.
    pub target: &'b str,
    pub host: &'b str,
    /// The client asked to close after this answer.
    pub close: bool,
    /// The first `x-request-id`, when it is one the edge keeps.
    pub request_id: Option<&'b [u8]>,
    pub user_agent: Option<&'b [u8]>,
    pub traceparent: Option<&'b [u8]>,
    pub headers: &'h [httparse::Header<'b>],
}

impl Head<'_, '_> {
    /// The first value of header `name` (for route header matches).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value)
    }

    /// The head to send upstream: the request line and the client's headers as they
    /// came, less [`NOT_COPIED`], plus the forwarding headers and the request ID.
    pub fn write_upstream(
        &self,
        out: &mut Vec<u8>,
        client_ip: &[u8],
        scheme: &str,
        request_id: &[u8],
    ) {
        out.clear();
        out.extend_from_slice(self.method.as_str().as_bytes());
        out.push(b' ');
        out.extend_from_slice(self.target.as_bytes());
        out.extend_from_slice(b" HTTP/1.1\r\n");
        for h in self.headers {
            if skipped(h.name) {
                continue;
            }
            out.extend_from_slice(h.name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(h.value);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"x-forwarded-for: ");
        out.extend_from_slice(client_ip);
        out.extend_from_slice(b"\r\nx-forwarded-proto: ");
        out.extend_from_slice(scheme.as_bytes());
        out.extend_from_slice(b"\r\nx-request-id: ");
        out.extend_from_slice(request_id);
        out.extend_from_slice(b"\r\n\r\n");
    }
}

fn skipped(name: &str) -> bool {
    NOT_COPIED
        .iter()
        .any(|n| n.len() == name.len() && n.eq_ignore_ascii_case(name))
}

/// Reads a complete head. `None`: the relay does not take it (see the module docs).
pub(super) fn take<'h, 'b>(req: &'h httparse::Request<'_, 'b>) -> Option<Head<'h, 'b>> {
    if req.version != Some(1) {
        return None;
    }
    let method = match req.method? {
        "GET" => Method::GET,
        "HEAD" => Method::HEAD,
        _ => return None,
    };
    let target = req.path.filter(|p| p.starts_with('/'))?;
    let mut host = None;
    let mut close = false;
    let mut request_id = None;
    let mut user_agent = None;
    let mut traceparent = None;
    for h in req.headers.iter() {
        let name = h.name;
        if name.eq_ignore_ascii_case("host") {
            if host.is_some() {
                return None;
            }
            host = Some(std::str::from_utf8(h.value).ok()?);
        } else if name.eq_ignore_ascii_case("content-length") {
            if h.value != b"0" {
                return None;
            }
        } else if name.eq_ignore_ascii_case("transfer-encoding")
            || name.eq_ignore_ascii_case("upgrade")
            || name.eq_ignore_ascii_case("expect")
        {
            return None;
        } else if name.eq_ignore_ascii_case("connection") {
            for token in h.value.split(|&b| b == b',') {
                let token = token.trim_ascii();
                if token.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if !token.eq_ignore_ascii_case(b"keep-alive") && !token.is_empty() {
                    // It names other headers as hop-by-hop: the full path strips them.
                    return None;
                }
            }
        } else if name.eq_ignore_ascii_case("x-request-id") {
            if request_id.is_none() {
                request_id = Some(h.value);
            }
        } else if name.eq_ignore_ascii_case("user-agent") {
            user_agent.get_or_insert(h.value);
        } else if name.eq_ignore_ascii_case("traceparent") {
            traceparent.get_or_insert(h.value);
        }
    }
    Some(Head {
        method,
        target,
        host: host?,
        close,
        request_id: request_id.filter(|v| crate::trace::usable_request_id(v)),
        user_agent,
        traceparent,
        headers: req.headers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_head<R>(raw: &[u8], f: impl FnOnce(Option<Head<'_, '_>>) -> R) -> R {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(raw) {
            Ok(httparse::Status::Complete(_)) => f(take(&req)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn takes_plain_gets_and_leaves_everything_else() {
        with_head(
            b"GET /a?b=c HTTP/1.1\r\nHost: x\r\nUser-Agent: t\r\n\r\n",
            |h| {
                let h = h.expect("taken");
                assert_eq!((h.target, h.host, h.close), ("/a?b=c", "x", false));
                assert_eq!(h.user_agent, Some(&b"t"[..]));
            },
        );
        for raw in [
            &b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n"[..],
            b"GET / HTTP/1.0\r\nHost: x\r\n\r\n",
            b"GET / HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\nConnection: x-secret\r\n\r\n",
            b"GET http://x/ HTTP/1.1\r\nHost: x\r\n\r\n",
        ] {
            with_head(raw, |h| {
                assert!(h.is_none(), "{}", String::from_utf8_lossy(raw));
            });
        }
    }

    #[test]
    fn the_upstream_head_drops_hop_by_hop_and_forged_forwarding_headers() {
        let raw =
            b"GET /p HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, close\r\nKeep-Alive: 5\r\n\
X-Forwarded-For: 6.6.6.6\r\nX-Request-Id: first\r\nx-request-id: second\r\nAccept: */*\r\n\r\n";
        with_head(raw, |h| {
            let h = h.expect("taken");
            assert!(h.close);
            assert_eq!(h.request_id, Some(&b"first"[..]));
            let mut out = Vec::new();
            h.write_upstream(&mut out, b"10.0.0.1", "http", b"first");
            assert_eq!(
                String::from_utf8_lossy(&out),
                "GET /p HTTP/1.1\r\nHost: x\r\nAccept: */*\r\nx-forwarded-for: 10.0.0.1\r\n\
x-forwarded-proto: http\r\nx-request-id: first\r\n\r\n"
            );
        });
    }
}
