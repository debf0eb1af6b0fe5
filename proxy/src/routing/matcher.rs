//! One HTTPRouteMatch, compiled, and the spec's precedence between matches as an `Ord`.

use std::cmp::Ordering;
use std::sync::Arc;

use http::{HeaderMap, HeaderName, Method};
use regex::Regex;
use serde::{Serialize, Serializer};

/// How a request path is matched. Shared (`Arc`), as is the rest of a
/// [`RequestMatch`]: a route's compiled matches are kept by the Store and copied into
/// every route table entry, and a copy of a boxed path was an allocation per route.
#[derive(Debug, Clone)]
pub enum PathMatch {
    Exact(Arc<str>),
    /// Stored without a trailing slash ("/" becomes ""), so that matching is
    /// segment-wise: `/foo` matches `/foo` and `/foo/bar`, never `/foobar`.
    Prefix(Arc<str>),
    /// Behind a pointer: a `Regex` is twice a path's size, and rare.
    Regex(Arc<Regex>),
}

/// Regexes compare by their pattern: two compiled from one pattern match alike.
impl PartialEq for PathMatch {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (PathMatch::Exact(a), PathMatch::Exact(b)) => a == b,
            (PathMatch::Prefix(a), PathMatch::Prefix(b)) => a == b,
            (PathMatch::Regex(a), PathMatch::Regex(b)) => a.as_str() == b.as_str(),
            _ => false,
        }
    }
}

impl PathMatch {
    pub fn prefix(value: &str) -> Self {
        PathMatch::Prefix(value.trim_end_matches('/').into())
    }

    /// How many leading bytes of a matching path a ReplacePrefixMatch replaces.
    pub fn matched_prefix_len(&self) -> usize {
        match self {
            PathMatch::Prefix(p) => p.len(),
            PathMatch::Exact(p) => p.len(),
            PathMatch::Regex(_) => 0,
        }
    }

    pub fn matches(&self, path: &str) -> bool {
        match self {
            PathMatch::Exact(p) => path == &**p,
            PathMatch::Prefix(p) => {
                path.starts_with(&**p)
                    && (path.len() == p.len() || path.as_bytes().get(p.len()) == Some(&b'/'))
            }
            PathMatch::Regex(re) => re.is_match(path),
        }
    }
}

/// A header or query value test.
#[derive(Debug, Clone)]
pub enum ValueMatch {
    Exact(Box<str>),
    Regex(Regex),
}

impl PartialEq for ValueMatch {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (ValueMatch::Exact(a), ValueMatch::Exact(b)) => a == b,
            (ValueMatch::Regex(a), ValueMatch::Regex(b)) => a.as_str() == b.as_str(),
            _ => false,
        }
    }
}

impl ValueMatch {
    pub fn matches(&self, value: &[u8]) -> bool {
        match self {
            ValueMatch::Exact(v) => value == v.as_bytes(),
            ValueMatch::Regex(re) => std::str::from_utf8(value).is_ok_and(|v| re.is_match(v)),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HeaderMatch {
    #[serde(serialize_with = "ser_header_name")]
    pub name: HeaderName,
    pub value: ValueMatch,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QueryMatch {
    pub name: Box<str>,
    pub value: ValueMatch,
}

/// Everything one HTTPRouteMatch asks of a request; all parts must hold.
///
/// 32 bytes: most matches are a path alone, and each is kept twice (the route's model
/// and its hostname's table), so the method, header and query tests most routes don't
/// have live in one box that is absent for them (at 5,000 routes the three inline
/// cost 0.8 MiB of empty lists).
#[derive(Debug, Clone, PartialEq)]
pub struct RequestMatch {
    pub path: PathMatch,
    more: Option<Arc<MoreTests>>,
}

/// A match's tests besides the path; never all empty (then there is no box).
#[derive(Debug, Clone, PartialEq)]
struct MoreTests {
    method: Option<Method>,
    headers: Box<[HeaderMatch]>,
    query: Box<[QueryMatch]>,
}

impl Default for RequestMatch {
    /// The spec's default match: PathPrefix "/".
    fn default() -> Self {
        Self::path(PathMatch::prefix("/"))
    }
}

impl RequestMatch {
    /// A match on the path alone.
    pub fn path(path: PathMatch) -> Self {
        Self { path, more: None }
    }

    pub fn new(
        path: PathMatch,
        method: Option<Method>,
        headers: Vec<HeaderMatch>,
        query: Vec<QueryMatch>,
    ) -> Self {
        let more = (method.is_some() || !headers.is_empty() || !query.is_empty()).then(|| {
            Arc::new(MoreTests {
                method,
                headers: headers.into(),
                query: query.into(),
            })
        });
        Self { path, more }
    }

    pub fn method(&self) -> Option<&Method> {
        self.more.as_ref().and_then(|m| m.method.as_ref())
    }

    pub fn headers(&self) -> &[HeaderMatch] {
        self.more.as_deref().map_or(&[], |m| &m.headers)
    }

    pub fn query(&self) -> &[QueryMatch] {
        self.more.as_deref().map_or(&[], |m| &m.query)
    }
}

impl Serialize for RequestMatch {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut m = s.serialize_struct("RequestMatch", 4)?;
        m.serialize_field("path", &self.path)?;
        m.serialize_field("method", &self.method().map(Method::as_str))?;
        m.serialize_field("headers", self.headers())?;
        m.serialize_field("query", self.query())?;
        m.end()
    }
}

impl RequestMatch {
    pub fn matches(
        &self,
        method: &Method,
        path: &str,
        query: Option<&str>,
        headers: &HeaderMap,
    ) -> bool {
        self.matches_with(method, path, query, |name| {
            headers.get(name).map(|v| v.as_bytes())
        })
    }

    /// [`Self::matches`] with headers read through `header` (the first value of a
    /// name), for requests whose headers are not in a `HeaderMap`.
    pub fn matches_with<'h>(
        &self,
        method: &Method,
        path: &str,
        query: Option<&str>,
        header: impl Fn(&HeaderName) -> Option<&'h [u8]>,
    ) -> bool {
        if !self.path.matches(path) {
            return false;
        }
        let Some(more) = self.more.as_deref() else {
            return true;
        };
        if more.method.as_ref().is_some_and(|m| m != method) {
            return false;
        }
        let headers_ok = more
            .headers
            .iter()
            .all(|h| header(&h.name).is_some_and(|v| h.value.matches(v)));
        if !headers_ok {
            return false;
        }
        more.query.iter().all(|q| {
            query
                .and_then(|qs| query_value(qs, &q.name))
                .is_some_and(|v| q.value.matches(v.as_bytes()))
        })
    }

    /// The spec's precedence between matches of routes on the same hostname: `Less`
    /// means `self` is tried first. Ties are broken by the caller (route age, then
    /// name, then rule order).
    pub fn precedence(&self, other: &Self) -> Ordering {
        fn path_rank(p: &PathMatch) -> (u8, std::cmp::Reverse<usize>) {
            match p {
                PathMatch::Exact(v) => (0, std::cmp::Reverse(v.len())),
                PathMatch::Prefix(v) => (1, std::cmp::Reverse(v.len())),
                PathMatch::Regex(r) => (2, std::cmp::Reverse(r.as_str().len())),
            }
        }
        path_rank(&self.path)
            .cmp(&path_rank(&other.path))
            .then_with(|| other.method().is_some().cmp(&self.method().is_some()))
            .then_with(|| other.headers().len().cmp(&self.headers().len()))
            .then_with(|| other.query().len().cmp(&self.query().len()))
    }
}

/// The first value of query parameter `name`, matched case-sensitively as the spec asks.
fn query_value<'a>(query: &'a str, name: &str) -> Option<&'a str> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == name).then_some(v)
    })
}

impl Serialize for PathMatch {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let (kind, value) = match self {
            PathMatch::Exact(v) => ("Exact", &**v),
            PathMatch::Prefix(v) if v.is_empty() => ("PathPrefix", "/"),
            PathMatch::Prefix(v) => ("PathPrefix", &**v),
            PathMatch::Regex(r) => ("RegularExpression", r.as_str()),
        };
        let mut m = s.serialize_map(Some(2))?;
        m.serialize_entry("type", kind)?;
        m.serialize_entry("value", value)?;
        m.end()
    }
}

impl Serialize for ValueMatch {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let (kind, value) = match self {
            ValueMatch::Exact(v) => ("Exact", &**v),
            ValueMatch::Regex(r) => ("RegularExpression", r.as_str()),
        };
        let mut m = s.serialize_map(Some(2))?;
        m.serialize_entry("type", kind)?;
        m.serialize_entry("value", value)?;
        m.end()
    }
}

fn ser_header_name<S: Serializer>(n: &HeaderName, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(n.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_is_segment_wise() {
        let p = PathMatch::prefix("/foo");
        assert!(p.matches("/foo"));
        assert!(p.matches("/foo/"));
        assert!(p.matches("/foo/bar"));
        assert!(!p.matches("/foobar"));
        assert!(!p.matches("/fo"));
        let trailing = PathMatch::prefix("/foo/");
        assert!(trailing.matches("/foo"));
        assert!(trailing.matches("/foo/bar"));
        assert!(!trailing.matches("/foobar"));
        let root = PathMatch::prefix("/");
        assert!(root.matches("/"));
        assert!(root.matches("/anything"));
    }

    #[test]
    fn exact_path_outranks_longer_prefix_and_method_outranks_headers() {
        let exact = RequestMatch::path(PathMatch::Exact("/a".into()));
        let long_prefix = RequestMatch::path(PathMatch::prefix("/a/b/c/d"));
        let short_prefix_method =
            RequestMatch::new(PathMatch::prefix("/a"), Some(Method::GET), vec![], vec![]);
        let short_prefix_header = RequestMatch::new(
            PathMatch::prefix("/a"),
            None,
            vec![HeaderMatch {
                name: HeaderName::from_static("x"),
                value: ValueMatch::Exact("1".into()),
            }],
            vec![],
        );
        assert_eq!(exact.precedence(&long_prefix), Ordering::Less);
        assert_eq!(long_prefix.precedence(&short_prefix_method), Ordering::Less);
        assert_eq!(
            short_prefix_method.precedence(&short_prefix_header),
            Ordering::Less
        );
    }

    #[test]
    fn headers_query_and_method_all_must_hold() {
        let m = RequestMatch::new(
            PathMatch::prefix("/"),
            Some(Method::POST),
            vec![HeaderMatch {
                name: HeaderName::from_static("x-env"),
                value: ValueMatch::Exact("canary".into()),
            }],
            vec![QueryMatch {
                name: "v".into(),
                value: ValueMatch::Regex(Regex::new("^[0-9]+$").unwrap_or_else(|e| panic!("{e}"))),
            }],
        );
        let mut h = HeaderMap::new();
        h.insert("x-env", http::HeaderValue::from_static("canary"));
        assert!(m.matches(&Method::POST, "/x", Some("a=1&v=42"), &h));
        assert!(!m.matches(&Method::GET, "/x", Some("v=42"), &h));
        assert!(!m.matches(&Method::POST, "/x", Some("v=abc"), &h));
        assert!(!m.matches(&Method::POST, "/x", None, &h));
        assert!(!m.matches(&Method::POST, "/x", Some("v=1"), &HeaderMap::new()));
    }

    /// Kept twice per route match (its model and its hostname's table): a path-only
    /// match must stay a path and one pointer.
    #[test]
    fn a_match_is_a_path_and_a_pointer() {
        assert!(std::mem::size_of::<PathMatch>() <= 24);
        assert!(std::mem::size_of::<RequestMatch>() <= 32);
        assert!(
            RequestMatch::new(PathMatch::prefix("/"), None, vec![], vec![])
                .more
                .is_none()
        );
    }

    #[test]
    fn serializes_as_before() {
        let m = RequestMatch::new(PathMatch::prefix("/a"), Some(Method::GET), vec![], vec![]);
        let json = serde_json::to_value(&m).unwrap_or_default();
        assert_eq!(
            json,
            serde_json::json!({"path": {"type": "PathPrefix", "value": "/a"},
                               "method": "GET", "headers": [], "query": []})
        );
        let plain = serde_json::to_value(RequestMatch::default()).unwrap_or_default();
        assert_eq!(plain["method"], serde_json::Value::Null);
    }
}
