//! Reading Kubernetes objects from YAML manifests (standalone mode).
//!
//! YAML is parsed with serde-saphyr: pure Rust, maintained, with line-accurate errors
//! and limits against alias bombs (serde_yaml is deprecated and serde_yml is
//! unmaintained). Each `---` document is parsed on its own so that one bad document
//! names its own line and the others still load.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::compact::RouteObject;
use crate::gateway_ext::GatewayExt;
use crate::grpc_route::to_http_route;
use crate::route_ext::HttpRouteExt;
use crate::store::Object;
use gateway_api::grpcroutes::GrpcRoute;
use gateway_api::httproutes::HttpRoute;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// Why a document or file could not be loaded.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ManifestError {
    pub file: PathBuf,
    /// 1-based line in the file, when the parser knows it.
    pub line: Option<u64>,
    pub reason: String,
}

impl std::fmt::Display for ManifestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            Some(l) => write!(f, "{}:{}: {}", self.file.display(), l, self.reason),
            None => write!(f, "{}: {}", self.file.display(), self.reason),
        }
    }
}

/// The objects of one file, and the errors of the documents that failed.
#[derive(Debug, Default)]
pub struct ParsedFile {
    pub objects: Vec<Object>,
    pub errors: Vec<ManifestError>,
}

#[derive(Deserialize)]
struct TypeMeta {
    #[serde(rename = "apiVersion", default)]
    api_version: String,
    #[serde(default)]
    kind: String,
}

/// Parses every document of `text`, read from `file`.
pub fn parse(file: &Path, text: &str) -> ParsedFile {
    let mut out = ParsedFile::default();
    for (first_line, doc) in documents(text) {
        match parse_document(file, first_line, doc) {
            Ok(Some(obj)) => out.objects.push(obj),
            Ok(None) => {}
            Err(e) => out.errors.push(e),
        }
    }
    out
}

/// Parses one document of `file` that starts on `first_line`: `None` for an empty
/// document or a kind the reconciler does not read.
pub fn parse_document(
    file: &Path,
    first_line: u64,
    doc: &str,
) -> Result<Option<Object>, ManifestError> {
    if doc.lines().all(is_blank_or_comment) {
        return Ok(None);
    }
    let err = |line: Option<u64>, reason: String| ManifestError {
        file: file.to_owned(),
        line: line.map(|l| l + first_line - 1).or(Some(first_line)),
        reason,
    };
    let meta: TypeMeta = serde_saphyr::from_str(doc)
        .map_err(|e| err(e.location().map(|l| l.line()), first_error_line(&e)))?;
    match decode(&meta, doc) {
        Ok(Some(obj)) => {
            let meta = obj.meta();
            if meta.name.as_deref().unwrap_or_default().is_empty() {
                Err(err(None, format!("{} has no metadata.name", obj.kind())))
            } else if let Some(field) = slashed(meta) {
                // Refused as the API server refuses them: `a/b` is no object's name.
                Err(err(
                    None,
                    format!("{} {field} may not contain '/'", obj.kind()),
                ))
            } else {
                Ok(Some(obj))
            }
        }
        Ok(None) => {
            tracing::debug!(file = %file.display(), kind = %meta.kind, api_version = %meta.api_version, "ignoring unsupported kind");
            Ok(None)
        }
        Err(e) => Err(err(
            e.location().map(|l| l.line()),
            format!("invalid {}: {}", meta.kind, first_error_line(&e)),
        )),
    }
}

/// The first of `metadata.name` and `metadata.namespace` that holds a `/`.
fn slashed(meta: &ObjectMeta) -> Option<&'static str> {
    let has = |v: &Option<String>| v.as_deref().is_some_and(|v| v.contains('/'));
    if has(&meta.name) {
        Some("metadata.name")
    } else if has(&meta.namespace) {
        Some("metadata.namespace")
    } else {
        None
    }
}

fn decode(meta: &TypeMeta, doc: &str) -> Result<Option<Object>, serde_saphyr::Error> {
    fn typed<T: DeserializeOwned>(doc: &str) -> Result<Box<T>, serde_saphyr::Error> {
        serde_saphyr::from_str(doc).map(Box::new)
    }
    let group = meta.api_version.split_once('/').map_or("", |(g, _)| g);
    Ok(Some(match (group, meta.kind.as_str()) {
        ("gateway.networking.k8s.io", "GatewayClass") => Object::GatewayClass(typed(doc)?),
        ("gateway.networking.k8s.io", "Gateway") => {
            // Typed first, for its line-accurate errors; the raw form only adds fields.
            let gateway = typed(doc)?;
            let raw: serde_json::Value = serde_saphyr::from_str(doc).unwrap_or_default();
            Object::Gateway(gateway, GatewayExt::from_raw(&raw))
        }
        ("gateway.networking.k8s.io", "HTTPRoute") => {
            let route: Box<HttpRoute> = typed(doc)?;
            let ext = HttpRouteExt::from_yaml(doc);
            Object::HttpRoute(Box::new(RouteObject::from(*route)), ext)
        }
        ("gateway.networking.k8s.io", "GRPCRoute") => {
            let route: Box<GrpcRoute> = typed(doc)?;
            // Its own types parsed, so the HTTPRoute form always exists; a failure here
            // would be a bug in the conversion, reported like any invalid object.
            match to_http_route(&route) {
                Ok(r) => Object::GrpcRoute(Box::new(RouteObject::from(r))),
                Err(e) => return Err(serde::de::Error::custom(format!("GRPCRoute: {e}"))),
            }
        }
        ("gateway.networking.k8s.io", "ReferenceGrant") => Object::ReferenceGrant(typed(doc)?),
        ("gateway.networking.k8s.io", "ListenerSet") => Object::ListenerSet(typed(doc)?),
        ("gateway.networking.k8s.io", "BackendTLSPolicy") => Object::BackendTlsPolicy(typed(doc)?),
        ("gateway.networking.k8s.io", "TCPRoute" | "UDPRoute" | "TLSRoute") => {
            Object::L4Route(typed(doc)?)
        }
        ("", "Service") => Object::Service(typed(doc)?),
        ("", "Secret") => Object::Secret(typed(doc)?),
        ("", "ConfigMap") => Object::ConfigMap(typed(doc)?),
        ("", "Namespace") => Object::Namespace(typed(doc)?),
        ("", "Pod") => Object::Pod(typed(doc)?),
        ("discovery.k8s.io", "EndpointSlice") => Object::EndpointSlice(typed(doc)?),
        _ => return Ok(None),
    }))
}

/// saphyr errors can carry a rendered source snippet; status and logs want one line.
fn first_error_line(e: &serde_saphyr::Error) -> String {
    let text = e.to_string();
    text.lines()
        .next()
        .unwrap_or("parse error")
        .trim()
        .to_owned()
}

fn is_blank_or_comment(line: &str) -> bool {
    let t = line.trim();
    t.is_empty() || t.starts_with('#')
}

/// Splits a multi-document stream at `---` markers, returning each document with the
/// 1-based line it starts on. A marker can only appear at column 0, where no content of
/// a Kubernetes object can be, so a line split is exact for these files.
pub fn documents(text: &str) -> Vec<(u64, &str)> {
    let mut docs = Vec::new();
    let mut start = 0usize;
    let mut start_line = 1u64;
    let mut offset = 0usize;
    for (i, line) in text.split_inclusive('\n').enumerate() {
        let line_no = i as u64 + 1;
        let bare = line.trim_end();
        if bare == "---" || bare.starts_with("--- ") || bare == "..." {
            docs.push((start_line, &text[start..offset]));
            start = offset + line.len();
            start_line = line_no + 1;
        }
        offset += line.len();
    }
    docs.push((start_line, &text[start..]));
    docs
}

/// Expands `paths` into the manifest files they name: a file as given, a directory as
/// every `*.yaml`/`*.yml` below it, sorted so loading order is stable.
pub fn expand(paths: &[PathBuf]) -> (Vec<PathBuf>, Vec<ManifestError>) {
    let mut files = Vec::new();
    let mut errors = Vec::new();
    for p in paths {
        if p.is_dir() {
            walk(p, &mut files, &mut errors);
        } else if p.exists() {
            files.push(p.clone());
        } else {
            errors.push(ManifestError {
                file: p.clone(),
                line: None,
                reason: "no such file or directory".into(),
            });
        }
    }
    files.sort();
    files.dedup();
    (files, errors)
}

fn walk(dir: &Path, files: &mut Vec<PathBuf>, errors: &mut Vec<ManifestError>) {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) => {
            errors.push(ManifestError {
                file: dir.to_owned(),
                line: None,
                reason: e.to_string(),
            });
            return;
        }
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            walk(&path, files, errors);
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml")
            && !path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with('.'))
        {
            files.push(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata:
  name: aether
spec:
  controllerName: aether.io/edge
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: ignored
";

    #[test]
    fn loads_known_kinds_and_skips_unknown_ones() {
        let parsed = parse(Path::new("a.yaml"), GOOD);
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        assert_eq!(parsed.objects.len(), 1);
        assert_eq!(parsed.objects[0].kind(), "GatewayClass");
    }

    #[test]
    fn a_bad_document_names_its_line_and_the_rest_still_load() {
        let text =
            format!("{GOOD}---\napiVersion: v1\nkind: Service\nmetadata:\n  name: [unclosed\n");
        let parsed = parse(Path::new("b.yaml"), &text);
        assert_eq!(parsed.objects.len(), 1);
        assert_eq!(parsed.errors.len(), 1, "{:?}", parsed.errors);
        let line = parsed.errors[0].line.unwrap_or(0);
        assert!(
            (13..=17).contains(&line),
            "line {line}: {}",
            parsed.errors[0]
        );
    }

    #[test]
    fn a_missing_required_field_is_an_error_not_a_default() {
        let text = "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata:\n  name: g\nspec:\n  listeners: []\n";
        let parsed = parse(Path::new("c.yaml"), text);
        assert!(parsed.objects.is_empty());
        assert!(
            parsed.errors[0].reason.contains("gatewayClassName"),
            "{}",
            parsed.errors[0]
        );
    }

    #[test]
    fn a_slash_in_a_name_or_namespace_is_refused_and_the_rest_still_load() {
        let service =
            |meta: &str| format!("---\napiVersion: v1\nkind: Service\nmetadata:\n{meta}\n");
        let text = format!(
            "{GOOD}{}{}",
            service("  name: a/b"),
            service("  name: b\n  namespace: x/y")
        );
        let parsed = parse(Path::new("d.yaml"), &text);
        assert_eq!(parsed.objects.len(), 1, "{:?}", parsed.errors);
        let reasons: Vec<_> = parsed.errors.iter().map(|e| e.reason.as_str()).collect();
        assert_eq!(
            reasons,
            [
                "Service metadata.name may not contain '/'",
                "Service metadata.namespace may not contain '/'"
            ]
        );
    }
}
