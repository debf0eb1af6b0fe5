//! An HTTPRouteMatch compiled into the proxy's [`RequestMatch`]. It reads nothing but
//! the match, so the Store compiles a route's matches once, when it takes the route,
//! and keeps only the compiled form (see `compact`).

use std::sync::Arc;

use aether_proxy::routing::{HeaderMatch, PathMatch, QueryMatch, RequestMatch, ValueMatch};
use gateway_api::httproutes::{
    HttpRouteRulesMatches, HttpRouteRulesMatchesHeadersType, HttpRouteRulesMatchesMethod,
    HttpRouteRulesMatchesPathType, HttpRouteRulesMatchesQueryParamsType,
};
use http::{HeaderName, Method};
use regex::Regex;

/// A rule's matches compiled: those that compile (the spec's default when none are
/// listed), and why the first that doesn't failed.
pub fn compile_matches(listed: &[HttpRouteRulesMatches]) -> (Arc<[RequestMatch]>, Option<String>) {
    if listed.is_empty() {
        return (Arc::new([RequestMatch::default()]), None);
    }
    let mut problem = None;
    let compiled: Vec<RequestMatch> = listed
        .iter()
        .filter_map(|m| {
            compile_match(m)
                .map_err(|why| problem.get_or_insert(why))
                .ok()
        })
        .collect();
    (compiled.into(), problem)
}

fn compile_match(m: &HttpRouteRulesMatches) -> Result<RequestMatch, String> {
    let path = match &m.path {
        None => PathMatch::prefix("/"),
        Some(p) => {
            let value = p.value.as_deref().unwrap_or("/");
            match p
                .r#type
                .as_ref()
                .unwrap_or(&HttpRouteRulesMatchesPathType::PathPrefix)
            {
                HttpRouteRulesMatchesPathType::Exact
                | HttpRouteRulesMatchesPathType::PathPrefix
                    if !value.starts_with('/') =>
                {
                    return Err(format!("path {value:?} must start with '/'"));
                }
                HttpRouteRulesMatchesPathType::Exact => PathMatch::Exact(value.into()),
                HttpRouteRulesMatchesPathType::PathPrefix => PathMatch::prefix(value),
                HttpRouteRulesMatchesPathType::RegularExpression => {
                    PathMatch::Regex(std::sync::Arc::new(anchored(value)?))
                }
            }
        }
    };
    let mut headers: Vec<HeaderMatch> = Vec::new();
    for h in m.headers.iter().flatten() {
        let name = HeaderName::from_bytes(h.name.as_bytes())
            .map_err(|_| format!("invalid header name {:?}", h.name))?;
        // The spec: only the first entry for a given name counts.
        if headers.iter().any(|x| x.name == name) {
            continue;
        }
        let value = match h
            .r#type
            .as_ref()
            .unwrap_or(&HttpRouteRulesMatchesHeadersType::Exact)
        {
            HttpRouteRulesMatchesHeadersType::Exact => ValueMatch::Exact(h.value.as_str().into()),
            HttpRouteRulesMatchesHeadersType::RegularExpression => {
                ValueMatch::Regex(anchored(&h.value)?)
            }
        };
        headers.push(HeaderMatch { name, value });
    }
    let mut query: Vec<QueryMatch> = Vec::new();
    for q in m.query_params.iter().flatten() {
        if query.iter().any(|x| *x.name == *q.name) {
            continue;
        }
        let value = match q
            .r#type
            .as_ref()
            .unwrap_or(&HttpRouteRulesMatchesQueryParamsType::Exact)
        {
            HttpRouteRulesMatchesQueryParamsType::Exact => {
                ValueMatch::Exact(q.value.as_str().into())
            }
            HttpRouteRulesMatchesQueryParamsType::RegularExpression => {
                ValueMatch::Regex(anchored(&q.value)?)
            }
        };
        query.push(QueryMatch {
            name: q.name.as_str().into(),
            value,
        });
    }
    let method = m.method.as_ref().map(|m| match m {
        HttpRouteRulesMatchesMethod::Get => Method::GET,
        HttpRouteRulesMatchesMethod::Head => Method::HEAD,
        HttpRouteRulesMatchesMethod::Post => Method::POST,
        HttpRouteRulesMatchesMethod::Put => Method::PUT,
        HttpRouteRulesMatchesMethod::Delete => Method::DELETE,
        HttpRouteRulesMatchesMethod::Connect => Method::CONNECT,
        HttpRouteRulesMatchesMethod::Options => Method::OPTIONS,
        HttpRouteRulesMatchesMethod::Trace => Method::TRACE,
        HttpRouteRulesMatchesMethod::Patch => Method::PATCH,
    });
    Ok(RequestMatch::new(path, method, headers, query))
}

/// Regular expressions match the whole value, as Envoy's RE2 matchers (and so most
/// conformance expectations) do.
fn anchored(re: &str) -> Result<Regex, String> {
    Regex::new(&format!("^(?:{re})$"))
        .map_err(|e| format!("invalid regular expression {re:?}: {e}"))
}
