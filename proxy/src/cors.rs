//! The CORS filter (GEP-1767): answers preflights at the edge and adds the
//! `Access-Control-*` headers to responses for allowed origins.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use serde::Serialize;

const REQUEST_METHOD: HeaderName = HeaderName::from_static("access-control-request-method");
const REQUEST_HEADERS: HeaderName = HeaderName::from_static("access-control-request-headers");
const ALLOW_ORIGIN: HeaderName = HeaderName::from_static("access-control-allow-origin");
const ALLOW_METHODS: HeaderName = HeaderName::from_static("access-control-allow-methods");
const ALLOW_HEADERS: HeaderName = HeaderName::from_static("access-control-allow-headers");
const ALLOW_CREDENTIALS: HeaderName = HeaderName::from_static("access-control-allow-credentials");
const EXPOSE_HEADERS: HeaderName = HeaderName::from_static("access-control-expose-headers");
const MAX_AGE: HeaderName = HeaderName::from_static("access-control-max-age");

/// One `allowOrigins` entry.
#[derive(Debug, Clone, Serialize)]
pub enum OriginMatch {
    Any,
    Exact(Box<str>),
    /// `scheme://*.suffix[:port]`: any host ending in `.suffix` (one or more labels).
    Wildcard {
        scheme: Box<str>,
        suffix: Box<str>,
        port: Option<Box<str>>,
    },
}

impl OriginMatch {
    pub fn parse(s: &str) -> Self {
        if s == "*" {
            return OriginMatch::Any;
        }
        if let Some((scheme, rest)) = s.split_once("://")
            && let Some(host_port) = rest.strip_prefix('*')
        {
            let (suffix, port) = match host_port.rsplit_once(':') {
                Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => (h, Some(p.into())),
                _ => (host_port, None),
            };
            return OriginMatch::Wildcard {
                scheme: scheme.to_ascii_lowercase().into(),
                suffix: suffix.to_ascii_lowercase().into(),
                port,
            };
        }
        OriginMatch::Exact(s.to_ascii_lowercase().into())
    }

    fn matches(&self, origin: &str) -> bool {
        match self {
            OriginMatch::Any => true,
            OriginMatch::Exact(o) => origin.eq_ignore_ascii_case(o),
            OriginMatch::Wildcard {
                scheme,
                suffix,
                port,
            } => {
                let Some((s, rest)) = origin.split_once("://") else {
                    return false;
                };
                let (host, p) = match rest.rsplit_once(':') {
                    Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => (h, Some(p)),
                    _ => (rest, None),
                };
                s.eq_ignore_ascii_case(scheme)
                    && p == port.as_deref()
                    && host.len() > suffix.len()
                    && host.to_ascii_lowercase().ends_with(&**suffix)
            }
        }
    }
}

/// A rule's compiled CORS policy.
#[derive(Debug, Clone, Serialize)]
pub struct Cors {
    pub origins: Vec<OriginMatch>,
    /// `None` means `*`: echo what the preflight asks for.
    pub methods: Option<Vec<Box<str>>>,
    pub headers: Option<Vec<Box<str>>>,
    pub expose_headers: Vec<Box<str>>,
    pub max_age: u32,
    pub credentials: bool,
}

impl Cors {
    /// The request's Origin when this policy allows it.
    fn allowed_origin<'a>(&self, req: &'a HeaderMap) -> Option<&'a HeaderValue> {
        let origin = req.get(header::ORIGIN)?;
        let o = origin.to_str().ok()?;
        self.origins.iter().any(|m| m.matches(o)).then_some(origin)
    }

    /// Is this a CORS preflight (OPTIONS with Origin and Access-Control-Request-Method)?
    pub fn is_preflight(method: &http::Method, req: &HeaderMap) -> bool {
        method == http::Method::OPTIONS
            && req.contains_key(header::ORIGIN)
            && req.contains_key(REQUEST_METHOD)
    }

    /// Headers answering a preflight. Empty when the origin is not allowed: the browser
    /// then refuses the real request.
    pub fn preflight_headers(&self, req: &HeaderMap) -> HeaderMap {
        let mut out = HeaderMap::new();
        let Some(origin) = self.allowed_origin(req) else {
            return out;
        };
        self.origin_headers(origin, &mut out);
        let methods = match &self.methods {
            Some(list) => join(list),
            None => req.get(REQUEST_METHOD).cloned(),
        };
        let headers = match &self.headers {
            Some(list) => join(list),
            None => req.get(REQUEST_HEADERS).cloned(),
        };
        for (name, value) in [(ALLOW_METHODS, methods), (ALLOW_HEADERS, headers)] {
            if let Some(v) = value {
                out.insert(name, v);
            }
        }
        out.insert(MAX_AGE, HeaderValue::from(self.max_age));
        out
    }

    /// Adds the response headers of an allowed cross-origin request.
    pub fn apply_to_response(&self, req: &HeaderMap, resp: &mut HeaderMap) {
        if let Some(origin) = self.allowed_origin(req) {
            self.origin_headers(origin, resp);
        }
    }

    fn origin_headers(&self, origin: &HeaderValue, out: &mut HeaderMap) {
        // With credentials the origin must be echoed; "*" is not allowed then.
        out.insert(ALLOW_ORIGIN, origin.clone());
        out.append(header::VARY, HeaderValue::from_static("origin"));
        if self.credentials {
            out.insert(ALLOW_CREDENTIALS, HeaderValue::from_static("true"));
        }
        if let Some(v) = join(&self.expose_headers) {
            out.insert(EXPOSE_HEADERS, v);
        }
    }
}

fn join(list: &[Box<str>]) -> Option<HeaderValue> {
    if list.is_empty() {
        return None;
    }
    HeaderValue::from_str(&list.join(", ")).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin(o: &'static str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::ORIGIN, HeaderValue::from_static(o));
        h
    }

    #[test]
    fn wildcard_origins_match_one_or_more_labels_and_respect_scheme_and_port() {
        let m = OriginMatch::parse("https://*.bar.com");
        assert!(m.matches("https://www.bar.com"));
        assert!(m.matches("https://xpto.www.bar.com"));
        assert!(!m.matches("https://bar.com"));
        assert!(!m.matches("http://www.bar.com"));
        assert!(!m.matches("https://www.bar.com:8443"));
        assert!(OriginMatch::parse("*").matches("https://foobar.com:12345"));
    }

    #[test]
    fn preflight_for_allowed_origin_lists_everything_and_others_get_nothing() {
        let cors = Cors {
            origins: vec![OriginMatch::parse("https://www.foo.com")],
            methods: Some(vec!["GET".into(), "OPTIONS".into()]),
            headers: None,
            expose_headers: vec!["x-header-3".into()],
            max_age: 3600,
            credentials: true,
        };
        let mut req = origin("https://www.foo.com");
        req.insert(REQUEST_METHOD, HeaderValue::from_static("GET"));
        req.insert(REQUEST_HEADERS, HeaderValue::from_static("x-a, x-b"));
        let h = cors.preflight_headers(&req);
        assert_eq!(h[ALLOW_ORIGIN], "https://www.foo.com");
        assert_eq!(h[ALLOW_METHODS], "GET, OPTIONS");
        assert_eq!(h[ALLOW_HEADERS], "x-a, x-b");
        assert_eq!(h[MAX_AGE], "3600");
        assert_eq!(h[ALLOW_CREDENTIALS], "true");
        assert!(
            cors.preflight_headers(&origin("https://evil.com"))
                .is_empty()
        );
    }
}
