//! One HTTPRouteMatch, compiled, and the spec's precedence between matches as an `Ord`.

use std::cmp::Ordering;

use http::{HeaderMap, HeaderName, Method};
use regex::Regex;
use serde::{Serialize, Serializer};

/// How a request path is matched.
#[derive(Debug, Clone)]
pub enum PathMatch {
    Exact(Box<str>),
    /// Stored without a trailing slash ("/" becomes ""), so that matching is
    /// segment-wise: `/foo` matches `/foo` and `/foo/bar`, never `/foobar`.
    Prefix(Box<str>),
    Regex(Regex),
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

impl ValueMatch {
    pub fn matches(&self, value: &[u8]) -> bool {
        match self {
            ValueMatch::Exact(v) => value == v.as_bytes(),
            ValueMatch::Regex(re) => std::str::from_utf8(value).is_ok_and(|v| re.is_match(v)),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct HeaderMatch {
    #[serde(serialize_with = "ser_header_name")]
    pub name: HeaderName,
    pub value: ValueMatch,
}

#[derive(Debug, Clone, Serialize)]
pub struct QueryMatch {
    pub name: Box<str>,
    pub value: ValueMatch,
}

/// Everything one HTTPRouteMatch asks of a request; all parts must hold.
#[derive(Debug, Clone, Serialize)]
pub struct RequestMatch {
    pub path: PathMatch,
    #[serde(serialize_with = "ser_method")]
    pub method: Option<Method>,
    pub headers: Vec<HeaderMatch>,
    pub query: Vec<QueryMatch>,
}

impl Default for RequestMatch {
    /// The spec's default match: PathPrefix "/".
    fn default() -> Self {
        Self {
            path: PathMatch::prefix("/"),
            method: None,
            headers: Vec::new(),
            query: Vec::new(),
        }
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
        if self.method.as_ref().is_some_and(|m| m != method) {
            return false;
        }
        if !self.path.matches(path) {
            return false;
        }
        let headers_ok = self
            .headers
            .iter()
            .all(|h| header(&h.name).is_some_and(|v| h.value.matches(v)));
        if !headers_ok {
            return false;
        }
        self.query.iter().all(|q| {
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
            .then_with(|| other.method.is_some().cmp(&self.method.is_some()))
            .then_with(|| other.headers.len().cmp(&self.headers.len()))
            .then_with(|| other.query.len().cmp(&self.query.len()))
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

fn ser_method<S: Serializer>(m: &Option<Method>, s: S) -> Result<S::Ok, S::Error> {
    match m {
        Some(m) => s.serialize_some(m.as_str()),
        None => s.serialize_none(),
    }
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
        let exact = RequestMatch {
            path: PathMatch::Exact("/a".into()),
            ..RequestMatch::default()
        };
        let long_prefix = RequestMatch {
            path: PathMatch::prefix("/a/b/c/d"),
            ..RequestMatch::default()
        };
        let short_prefix_method = RequestMatch {
            path: PathMatch::prefix("/a"),
            method: Some(Method::GET),
            ..RequestMatch::default()
        };
        let short_prefix_header = RequestMatch {
            path: PathMatch::prefix("/a"),
            headers: vec![HeaderMatch {
                name: HeaderName::from_static("x"),
                value: ValueMatch::Exact("1".into()),
            }],
            ..RequestMatch::default()
        };
        assert_eq!(exact.precedence(&long_prefix), Ordering::Less);
        assert_eq!(long_prefix.precedence(&short_prefix_method), Ordering::Less);
        assert_eq!(
            short_prefix_method.precedence(&short_prefix_header),
            Ordering::Less
        );
    }

    #[test]
    fn headers_query_and_method_all_must_hold() {
        let m = RequestMatch {
            path: PathMatch::prefix("/"),
            method: Some(Method::POST),
            headers: vec![HeaderMatch {
                name: HeaderName::from_static("x-env"),
                value: ValueMatch::Exact("canary".into()),
            }],
            query: vec![QueryMatch {
                name: "v".into(),
                value: ValueMatch::Regex(Regex::new("^[0-9]+$").unwrap_or_else(|e| panic!("{e}"))),
            }],
        };
        let mut h = HeaderMap::new();
        h.insert("x-env", http::HeaderValue::from_static("canary"));
        assert!(m.matches(&Method::POST, "/x", Some("a=1&v=42"), &h));
        assert!(!m.matches(&Method::GET, "/x", Some("v=42"), &h));
        assert!(!m.matches(&Method::POST, "/x", Some("v=abc"), &h));
        assert!(!m.matches(&Method::POST, "/x", None, &h));
        assert!(!m.matches(&Method::POST, "/x", Some("v=1"), &HeaderMap::new()));
    }
}
