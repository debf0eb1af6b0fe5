//! HTTPRoute filters, compiled: header modifiers, redirects and URL rewrites.
//!
//! Everything is validated when the Snapshot is built, so applying a filter never fails
//! on the request path.

use std::fmt::Write;
use std::sync::Arc;

use http::uri::PathAndQuery;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use serde::{Serialize, Serializer};

use crate::backend::Backend;
use crate::cors::Cors;

/// set / add / remove on a header map. Names compare case-insensitively (HeaderName
/// is lower-case).
#[derive(Debug, Clone, Default, Serialize)]
pub struct HeaderModifier {
    #[serde(serialize_with = "ser_pairs")]
    pub set: Vec<(HeaderName, HeaderValue)>,
    #[serde(serialize_with = "ser_pairs")]
    pub add: Vec<(HeaderName, HeaderValue)>,
    #[serde(serialize_with = "ser_names")]
    pub remove: Vec<HeaderName>,
}

impl HeaderModifier {
    pub fn apply(&self, headers: &mut HeaderMap) {
        for (name, value) in &self.set {
            headers.insert(name.clone(), value.clone());
        }
        for (name, value) in &self.add {
            headers.append(name.clone(), value.clone());
        }
        for name in &self.remove {
            headers.remove(name);
        }
    }
}

/// How a filter changes the request path.
#[derive(Debug, Clone, Serialize)]
pub enum PathModifier {
    ReplaceFullPath(Box<str>),
    /// Replaces the part of the path the rule's PathPrefix matched.
    ReplacePrefixMatch(Box<str>),
}

impl PathModifier {
    /// The new path for `path`, whose first `matched` bytes are the matched prefix.
    pub fn apply(&self, path: &str, matched: usize) -> String {
        match self {
            PathModifier::ReplaceFullPath(p) => p.to_string(),
            PathModifier::ReplacePrefixMatch(replacement) => {
                let rest = path.get(matched..).unwrap_or("");
                if rest.is_empty() {
                    return if replacement.is_empty() {
                        "/".to_owned()
                    } else {
                        replacement.to_string()
                    };
                }
                // `rest` starts with '/' (prefix matching is segment-wise), so a trailing
                // slash on the replacement would double it.
                let mut out = replacement.trim_end_matches('/').to_owned();
                if !rest.starts_with('/') {
                    out.push('/');
                }
                out.push_str(rest);
                out
            }
        }
    }
}

/// RequestRedirect: answers the client with a Location built from the request.
#[derive(Debug, Clone, Serialize)]
pub struct Redirect {
    pub scheme: Option<Box<str>>,
    pub hostname: Option<Box<str>>,
    pub port: Option<u16>,
    pub path: Option<PathModifier>,
    #[serde(serialize_with = "ser_status")]
    pub status: StatusCode,
}

/// What a redirect needs to know about the request it answers.
pub struct RedirectInput<'a> {
    pub scheme: &'a str,
    pub host: &'a str,
    pub listener_port: u16,
    pub path: &'a str,
    pub query: Option<&'a str>,
    pub matched_prefix: usize,
}

impl Redirect {
    /// The Location header, following the spec's port rules: an explicit port wins; a
    /// changed scheme implies its well-known port; otherwise the listener's port. The
    /// well-known port of the resulting scheme is left out.
    pub fn location(&self, req: &RedirectInput<'_>) -> String {
        let scheme = self.scheme.as_deref().unwrap_or(req.scheme);
        let host = self.hostname.as_deref().unwrap_or(req.host);
        let port = match (self.port, &self.scheme) {
            (Some(p), _) => p,
            (None, Some(s)) => default_port(s),
            (None, None) => req.listener_port,
        };
        let path = match &self.path {
            Some(m) => m.apply(req.path, req.matched_prefix),
            None => req.path.to_owned(),
        };
        let mut loc = String::with_capacity(scheme.len() + host.len() + path.len() + 16);
        loc.push_str(scheme);
        loc.push_str("://");
        loc.push_str(host);
        if port != default_port(scheme) {
            let _ = write!(loc, ":{port}");
        }
        loc.push_str(&path);
        if let Some(q) = req.query {
            loc.push('?');
            loc.push_str(q);
        }
        loc
    }
}

fn default_port(scheme: &str) -> u16 {
    if scheme.eq_ignore_ascii_case("https") {
        443
    } else {
        80
    }
}

/// URLRewrite: changes Host and/or path before forwarding.
#[derive(Debug, Clone, Serialize)]
pub struct UrlRewrite {
    #[serde(serialize_with = "ser_opt_value")]
    pub hostname: Option<HeaderValue>,
    pub path: Option<PathModifier>,
}

impl UrlRewrite {
    /// The rewritten path and query, if the path changes.
    pub fn path_and_query(
        &self,
        current: &PathAndQuery,
        matched_prefix: usize,
    ) -> Option<PathAndQuery> {
        let m = self.path.as_ref()?;
        let mut p = m.apply(current.path(), matched_prefix);
        if let Some(q) = current.query() {
            p.push('?');
            p.push_str(q);
        }
        PathAndQuery::try_from(p).ok()
    }
}

/// RequestMirror: sends a sampled copy of requests to another backend.
#[derive(Debug, Clone, Serialize)]
pub struct Mirror {
    #[serde(serialize_with = "ser_backend_name")]
    pub backend: Arc<Backend>,
    /// The share of requests mirrored, as numerator / denominator.
    pub numerator: u32,
    pub denominator: u32,
}

impl Mirror {
    pub fn sampled(&self) -> bool {
        self.numerator >= self.denominator
            || (self.numerator > 0 && fastrand::u32(0..self.denominator.max(1)) < self.numerator)
    }
}

fn ser_backend_name<S: Serializer>(b: &Arc<Backend>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&b.name)
}

/// The filters of a rule or of one backendRef. Nearly every rule has none, so the set
/// sits behind one pointer that is null while empty: inline, a rule's model, its action
/// and each backendRef each carried 400 bytes of empty filters (heaptrack at 5,000
/// routes). The set is shared, so the Snapshot's action and the model it was built
/// from hold one copy. Reading goes through `Deref`; the first write allocates.
#[derive(Debug, Clone, Default)]
pub struct Filters(Option<Arc<FilterSet>>);

#[derive(Debug, Clone, Default, Serialize)]
pub struct FilterSet {
    pub request_headers: Option<HeaderModifier>,
    pub response_headers: Option<HeaderModifier>,
    pub redirect: Option<Redirect>,
    pub rewrite: Option<UrlRewrite>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mirrors: Vec<Mirror>,
    pub cors: Option<Cors>,
}

/// What an empty `Filters` reads as.
static NO_FILTERS: FilterSet = FilterSet {
    request_headers: None,
    response_headers: None,
    redirect: None,
    rewrite: None,
    mirrors: Vec::new(),
    cors: None,
};

impl std::ops::Deref for Filters {
    type Target = FilterSet;

    fn deref(&self) -> &FilterSet {
        self.0.as_deref().unwrap_or(&NO_FILTERS)
    }
}

impl std::ops::DerefMut for Filters {
    fn deref_mut(&mut self) -> &mut FilterSet {
        Arc::make_mut(self.0.get_or_insert_with(Arc::default))
    }
}

impl Serialize for Filters {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        (**self).serialize(s)
    }
}

impl Filters {
    pub fn is_empty(&self) -> bool {
        self.0.as_deref().is_none_or(FilterSet::is_empty)
    }
}

impl FilterSet {
    pub fn is_empty(&self) -> bool {
        self.request_headers.is_none()
            && self.response_headers.is_none()
            && self.redirect.is_none()
            && self.rewrite.is_none()
            && self.mirrors.is_empty()
            && self.cors.is_none()
    }
}

fn ser_pairs<S: Serializer>(v: &[(HeaderName, HeaderValue)], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(
        v.iter()
            .map(|(n, v)| (n.as_str(), v.to_str().unwrap_or("<binary>"))),
    )
}

fn ser_names<S: Serializer>(v: &[HeaderName], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(v.iter().map(HeaderName::as_str))
}

fn ser_status<S: Serializer>(v: &StatusCode, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u16(v.as_u16())
}

fn ser_opt_value<S: Serializer>(v: &Option<HeaderValue>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(v) => s.serialize_some(v.to_str().unwrap_or("<binary>")),
        None => s.serialize_none(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_replacement_never_doubles_or_drops_slashes() {
        let to_root = PathModifier::ReplacePrefixMatch("/".into());
        assert_eq!(to_root.apply("/prefix/one/two", 11), "/two");
        assert_eq!(to_root.apply("/prefix/one", 11), "/");
        let to_other = PathModifier::ReplacePrefixMatch("/xyz/".into());
        assert_eq!(to_other.apply("/prefix/one/two", 11), "/xyz/two");
        assert_eq!(to_other.apply("/prefix/one", 11), "/xyz/");
        let full = PathModifier::ReplaceFullPath("/full".into());
        assert_eq!(full.apply("/anything/else", 0), "/full");
    }

    #[test]
    fn redirect_ports_follow_the_spec() {
        let req = RedirectInput {
            scheme: "http",
            host: "example.com",
            listener_port: 8080,
            path: "/a",
            query: Some("x=1"),
            matched_prefix: 0,
        };
        let mut r = Redirect {
            scheme: None,
            hostname: None,
            port: None,
            path: None,
            status: StatusCode::FOUND,
        };
        assert_eq!(r.location(&req), "http://example.com:8080/a?x=1");
        r.scheme = Some("https".into());
        assert_eq!(r.location(&req), "https://example.com/a?x=1");
        r.port = Some(8443);
        r.hostname = Some("other.org".into());
        assert_eq!(r.location(&req), "https://other.org:8443/a?x=1");
        r.scheme = None;
        r.port = Some(80);
        assert_eq!(r.location(&req), "http://other.org/a?x=1");
    }

    #[test]
    fn header_modifier_sets_adds_and_removes() {
        let m = HeaderModifier {
            set: vec![(
                HeaderName::from_static("x-set"),
                HeaderValue::from_static("s"),
            )],
            add: vec![(
                HeaderName::from_static("x-add"),
                HeaderValue::from_static("a"),
            )],
            remove: vec![HeaderName::from_static("x-gone")],
        };
        let mut h = HeaderMap::new();
        h.insert("x-set", HeaderValue::from_static("old"));
        h.insert("x-add", HeaderValue::from_static("first"));
        h.insert("x-gone", HeaderValue::from_static("1"));
        m.apply(&mut h);
        assert_eq!(h["x-set"], "s");
        let added: Vec<_> = h.get_all("x-add").iter().collect();
        assert_eq!(added, vec!["first", "a"]);
        assert!(!h.contains_key("x-gone"));
    }
}
