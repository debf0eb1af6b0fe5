//! Compiling HTTPRoute filters into the proxy's `Filters`, with the spec's validation.

use std::sync::Arc;

use aether_proxy::backend::Backend;
use aether_proxy::cors::{Cors, OriginMatch};
use aether_proxy::filters::{Filters, HeaderModifier, Mirror, PathModifier, Redirect, UrlRewrite};
use gateway_api::httproutes::{
    HttpRouteRulesBackendRefsFilters, HttpRouteRulesFilters,
    HttpRouteRulesFiltersRequestHeaderModifier, HttpRouteRulesFiltersRequestRedirectPathType,
    HttpRouteRulesFiltersRequestRedirectScheme, HttpRouteRulesFiltersType,
    HttpRouteRulesFiltersUrlRewritePathType,
};
use http::{HeaderName, HeaderValue, StatusCode};

use super::backend::BackendRefSpec;

/// Resolves a mirror's backendRef; a failure is recorded by the caller (ResolvedRefs)
/// and the mirror is left out.
pub type MirrorResolver<'a> = dyn FnMut(&BackendRefSpec<'_>) -> Option<Arc<Backend>> + 'a;

/// Compiles one filter list. `prefix_matches_only` says whether every match of the rule
/// is a PathPrefix, which ReplacePrefixMatch requires.
pub fn compile(
    filters: &[HttpRouteRulesFilters],
    prefix_matches_only: bool,
    resolve_mirror: &mut MirrorResolver<'_>,
) -> Result<Filters, String> {
    let mut out = Filters::default();
    for f in filters {
        let kind = &f.r#type;
        let dup = || format!("filter {kind:?} appears more than once");
        match kind {
            HttpRouteRulesFiltersType::RequestHeaderModifier => {
                let m = f
                    .request_header_modifier
                    .as_ref()
                    .ok_or("RequestHeaderModifier has no configuration")?;
                if out.request_headers.replace(header_modifier(m)?).is_some() {
                    return Err(dup());
                }
            }
            HttpRouteRulesFiltersType::ResponseHeaderModifier => {
                let m = f
                    .response_header_modifier
                    .as_ref()
                    .ok_or("ResponseHeaderModifier has no configuration")?;
                // Same shape as the request modifier; convert and reuse its validation.
                let as_request: HttpRouteRulesFiltersRequestHeaderModifier =
                    serde_json::to_value(m)
                        .and_then(serde_json::from_value)
                        .map_err(|e| e.to_string())?;
                if out
                    .response_headers
                    .replace(header_modifier(&as_request)?)
                    .is_some()
                {
                    return Err(dup());
                }
            }
            HttpRouteRulesFiltersType::RequestRedirect => {
                let r = f
                    .request_redirect
                    .as_ref()
                    .ok_or("RequestRedirect has no configuration")?;
                let path = match &r.path {
                    None => None,
                    Some(p) => Some(path_modifier(
                        matches!(
                            p.r#type,
                            HttpRouteRulesFiltersRequestRedirectPathType::ReplacePrefixMatch
                        ),
                        p.replace_full_path.as_deref(),
                        p.replace_prefix_match.as_deref(),
                        prefix_matches_only,
                    )?),
                };
                let status = match r.status_code.unwrap_or(302) {
                    c @ (301 | 302 | 303 | 307 | 308) => {
                        StatusCode::from_u16(u16::try_from(c).unwrap_or(302))
                            .unwrap_or(StatusCode::FOUND)
                    }
                    c => {
                        return Err(format!(
                            "redirect status code {c} is not one of 301, 302, 303, 307, 308"
                        ));
                    }
                };
                let port = match r.port {
                    None => None,
                    Some(p) => Some(
                        u16::try_from(p)
                            .ok()
                            .filter(|p| *p != 0)
                            .ok_or(format!("redirect port {p} is out of range"))?,
                    ),
                };
                let redirect = Redirect {
                    scheme: r.scheme.as_ref().map(|s| match s {
                        HttpRouteRulesFiltersRequestRedirectScheme::Http => "http".into(),
                        HttpRouteRulesFiltersRequestRedirectScheme::Https => "https".into(),
                    }),
                    hostname: r.hostname.as_deref().map(Into::into),
                    port,
                    path,
                    status,
                };
                if out.redirect.replace(redirect).is_some() {
                    return Err(dup());
                }
            }
            HttpRouteRulesFiltersType::UrlRewrite => {
                let r = f
                    .url_rewrite
                    .as_ref()
                    .ok_or("URLRewrite has no configuration")?;
                let hostname = match r.hostname.as_deref() {
                    None => None,
                    Some(h) => Some(
                        HeaderValue::from_str(h)
                            .map_err(|_| format!("invalid rewrite hostname {h:?}"))?,
                    ),
                };
                let path = match &r.path {
                    None => None,
                    Some(p) => Some(path_modifier(
                        matches!(
                            p.r#type,
                            HttpRouteRulesFiltersUrlRewritePathType::ReplacePrefixMatch
                        ),
                        p.replace_full_path.as_deref(),
                        p.replace_prefix_match.as_deref(),
                        prefix_matches_only,
                    )?),
                };
                if out.rewrite.replace(UrlRewrite { hostname, path }).is_some() {
                    return Err(dup());
                }
            }
            HttpRouteRulesFiltersType::RequestMirror => {
                let m = f
                    .request_mirror
                    .as_ref()
                    .ok_or("RequestMirror has no configuration")?;
                let (numerator, denominator) = match (&m.fraction, m.percent) {
                    (Some(fr), _) => (fr.numerator, fr.denominator.unwrap_or(100)),
                    (None, Some(p)) => (p, 100),
                    (None, None) => (1, 1),
                };
                let (Ok(numerator), Ok(denominator)) =
                    (u32::try_from(numerator), u32::try_from(denominator))
                else {
                    return Err("RequestMirror fraction must not be negative".to_owned());
                };
                if denominator == 0 || numerator > denominator {
                    return Err(format!(
                        "RequestMirror fraction {numerator}/{denominator} is not between 0 and 1"
                    ));
                }
                let b = &m.backend_ref;
                let spec = BackendRefSpec {
                    group: b.group.as_deref(),
                    kind: b.kind.as_deref(),
                    name: &b.name,
                    namespace: b.namespace.as_deref(),
                    port: b.port,
                };
                if let Some(backend) = resolve_mirror(&spec) {
                    out.mirrors.push(Mirror {
                        backend,
                        numerator,
                        denominator,
                    });
                }
            }
            HttpRouteRulesFiltersType::Cors => {
                let c = f.cors.as_ref().ok_or("CORS has no configuration")?;
                // "*" in a list means "whatever the preflight asks for".
                let list = |v: &Option<Vec<String>>| -> Option<Vec<Box<str>>> {
                    let v = v.as_deref().unwrap_or_default();
                    (!v.iter().any(|x| x == "*"))
                        .then(|| v.iter().map(|x| x.as_str().into()).collect())
                };
                let cors = Cors {
                    origins: c
                        .allow_origins
                        .iter()
                        .flatten()
                        .map(|o| OriginMatch::parse(o))
                        .collect(),
                    methods: list(&c.allow_methods),
                    headers: list(&c.allow_headers),
                    expose_headers: c
                        .expose_headers
                        .iter()
                        .flatten()
                        .map(|x| x.as_str().into())
                        .collect(),
                    max_age: c.max_age.map_or(5, |a| u32::try_from(a).unwrap_or(0)),
                    credentials: c.allow_credentials.unwrap_or(false),
                };
                if out.cors.replace(cors).is_some() {
                    return Err(dup());
                }
            }
            other => return Err(format!("filter type {other:?} is not supported yet")),
        }
    }
    if out.redirect.is_some() && out.rewrite.is_some() {
        return Err("RequestRedirect and URLRewrite cannot be used together".to_owned());
    }
    Ok(out)
}

/// backendRef filters have their own generated type with the same shape; convert
/// through serde rather than keep a second copy of the validation.
pub fn compile_backend(
    filters: &[HttpRouteRulesBackendRefsFilters],
    prefix_matches_only: bool,
    resolve_mirror: &mut MirrorResolver<'_>,
) -> Result<Filters, String> {
    let value = serde_json::to_value(filters).map_err(|e| e.to_string())?;
    let as_rule: Vec<HttpRouteRulesFilters> =
        serde_json::from_value(value).map_err(|e| e.to_string())?;
    compile(&as_rule, prefix_matches_only, resolve_mirror)
}

fn path_modifier(
    prefix: bool,
    full: Option<&str>,
    replacement: Option<&str>,
    prefix_matches_only: bool,
) -> Result<PathModifier, String> {
    if prefix {
        if !prefix_matches_only {
            return Err(
                "ReplacePrefixMatch needs every match of the rule to be a PathPrefix".to_owned(),
            );
        }
        let r = replacement.ok_or("ReplacePrefixMatch has no replacePrefixMatch value")?;
        Ok(PathModifier::ReplacePrefixMatch(r.into()))
    } else {
        let p = full.ok_or("ReplaceFullPath has no replaceFullPath value")?;
        Ok(PathModifier::ReplaceFullPath(p.into()))
    }
}

fn header_modifier(
    m: &HttpRouteRulesFiltersRequestHeaderModifier,
) -> Result<HeaderModifier, String> {
    let pair = |name: &str, value: &str| -> Result<(HeaderName, HeaderValue), String> {
        let n = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("invalid header name {name:?}"))?;
        let v = HeaderValue::from_str(value)
            .map_err(|_| format!("invalid value for header {name:?}"))?;
        Ok((n, v))
    };
    Ok(HeaderModifier {
        set: m
            .set
            .iter()
            .flatten()
            .map(|h| pair(&h.name, &h.value))
            .collect::<Result<_, _>>()?,
        add: m
            .add
            .iter()
            .flatten()
            .map(|h| pair(&h.name, &h.value))
            .collect::<Result<_, _>>()?,
        remove: m
            .remove
            .iter()
            .flatten()
            .map(|n| {
                HeaderName::from_bytes(n.as_bytes())
                    .map_err(|_| format!("invalid header name {n:?}"))
            })
            .collect::<Result<_, _>>()?,
    })
}
