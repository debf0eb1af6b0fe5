//! Rendering a record as one line: JSON (one object) or text (logfmt: `key=value`,
//! quoted when needed). Both come from one list of fields, so they always say the
//! same thing. Everything a client sent is escaped: a line can't be split or forged
//! by a path, a Host or a user agent.

use std::borrow::Cow;
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, SystemTime};

use http::{HeaderValue, Version};

use super::Format;
use super::record::{HttpRecord, L4Record};
use crate::snapshot::Listener;

/// A field's value.
pub(super) enum Val<'a> {
    Str(Cow<'a, str>),
    Num(u64),
    Ms(Duration),
    Bool(bool),
    Time(SystemTime),
    /// Addresses are written straight into the line: no `String` per field.
    Ip(IpAddr),
    Addr(SocketAddr),
    Null,
}

type Field<'a> = (&'static str, Val<'a>);

fn opt_str<'a>(v: Option<&'a str>) -> Val<'a> {
    v.map_or(Val::Null, |s| Val::Str(Cow::Borrowed(s)))
}

fn header<'a>(v: Option<&'a HeaderValue>) -> Val<'a> {
    v.map_or(Val::Null, |v| {
        Val::Str(String::from_utf8_lossy(v.as_bytes()))
    })
}

fn gateway(l: Option<&Listener>) -> Val<'_> {
    opt_str(l.map(|l| &*l.gateway))
}

/// The listener's name, borrowed in the usual case of one listener per socket.
fn listener(l: Option<&Listener>) -> Val<'_> {
    l.map_or(Val::Null, |l| match l.sections.as_slice() {
        [one] => Val::Str(Cow::Borrowed(&**one)),
        several => Val::Str(Cow::Owned(crate::telemetry::listener_label(several))),
    })
}

fn protocol(v: Version) -> &'static str {
    match v {
        Version::HTTP_09 => "HTTP/0.9",
        Version::HTTP_10 => "HTTP/1.0",
        Version::HTTP_2 => "HTTP/2",
        Version::HTTP_3 => "HTTP/3",
        _ => "HTTP/1.1",
    }
}

/// The trace ID of a W3C `traceparent` (`00-<32 hex>-<16 hex>-<2 hex>`), if valid:
/// the same parser the edge continues traces with (`crate::trace`).
pub(super) fn trace_id(traceparent: &HeaderValue) -> Option<&str> {
    crate::trace::TraceParent::parse(traceparent.as_bytes())?;
    traceparent.to_str().ok()?.get(3..35)
}

pub(super) fn http_fields(r: &HttpRecord) -> [Field<'_>; 24] {
    let l = r.listener.as_deref();
    let rule = r.rule.as_deref();
    let authority = r
        .uri
        .authority()
        .map(|a| Val::Str(Cow::Borrowed(a.as_str())))
        .unwrap_or_else(|| header(r.host.as_ref()));
    [
        ("time", Val::Time(r.time)),
        ("kind", Val::Str(Cow::Borrowed("http"))),
        ("gateway", gateway(l)),
        ("listener", listener(l)),
        ("route_kind", opt_str(rule.map(|a| a.kind))),
        ("route", opt_str(rule.map(|a| &*a.route))),
        ("rule", opt_str(rule.and_then(|a| a.rule.as_deref()))),
        ("client", Val::Ip(r.client)),
        ("authority", authority),
        ("method", Val::Str(Cow::Borrowed(r.method.as_str()))),
        ("path", Val::Str(Cow::Borrowed(r.uri.path()))),
        ("protocol", Val::Str(Cow::Borrowed(protocol(r.version)))),
        ("status", Val::Num(u64::from(r.status))),
        ("reason", opt_str(r.reason)),
        (
            "request_bytes",
            Val::Num(
                r.request_bytes
                    .as_ref()
                    .map_or(0, |n| n.load(std::sync::atomic::Ordering::Relaxed)),
            ),
        ),
        ("response_bytes", Val::Num(r.response_bytes)),
        ("duration_ms", Val::Ms(r.duration)),
        ("complete", Val::Bool(r.complete)),
        ("upstream", r.upstream.map_or(Val::Null, Val::Addr)),
        ("upstream_ms", r.upstream_time.map_or(Val::Null, Val::Ms)),
        ("retries", Val::Num(u64::from(r.retries))),
        ("request_id", header(r.request_id.as_ref())),
        (
            "trace_id",
            opt_str(r.traceparent.as_ref().and_then(trace_id)),
        ),
        ("user_agent", header(r.user_agent.as_ref())),
    ]
}

pub(super) fn l4_fields(r: &L4Record) -> [Field<'_>; 14] {
    let l = r.listener.as_deref();
    let t = r.target.as_deref();
    [
        ("time", Val::Time(r.time)),
        ("kind", Val::Str(Cow::Borrowed("l4"))),
        ("gateway", gateway(l)),
        ("listener", listener(l)),
        ("route_kind", opt_str(t.map(|t| t.kind))),
        ("route", opt_str(t.map(|t| &*t.route))),
        ("client", Val::Ip(r.peer.ip())),
        ("protocol", Val::Str(Cow::Borrowed(r.protocol))),
        ("sni", opt_str(r.sni.as_deref())),
        ("reason", opt_str(r.reason)),
        ("upstream", r.upstream.map_or(Val::Null, Val::Addr)),
        ("request_bytes", Val::Num(r.bytes_in)),
        ("response_bytes", Val::Num(r.bytes_out)),
        ("duration_ms", Val::Ms(r.duration)),
    ]
}

/// Appends one line (with its newline) to `out`.
pub(super) fn write_line(format: Format, fields: &[Field<'_>], out: &mut Vec<u8>) {
    match format {
        Format::Json => json(fields, out),
        Format::Text => text(fields, out),
    }
    out.push(b'\n');
}

fn json(fields: &[Field<'_>], out: &mut Vec<u8>) {
    out.push(b'{');
    for (i, (key, val)) in fields.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let _ = write!(out, "\"{key}\":");
        // Writing to a Vec cannot fail.
        let _ = match val {
            Val::Str(s) => serde_json::to_writer(&mut *out, s.as_ref()).map_err(|_| ()),
            Val::Num(n) => write!(out, "{n}").map_err(|_| ()),
            Val::Ms(d) => write!(out, "{:.3}", d.as_secs_f64() * 1000.0).map_err(|_| ()),
            Val::Bool(b) => write!(out, "{b}").map_err(|_| ()),
            Val::Time(t) => {
                write!(out, "\"{}\"", humantime::format_rfc3339_millis(*t)).map_err(|_| ())
            }
            Val::Ip(a) => write!(out, "\"{a}\"").map_err(|_| ()),
            Val::Addr(a) => write!(out, "\"{a}\"").map_err(|_| ()),
            Val::Null => out.write_all(b"null").map_err(|_| ()),
        };
    }
    out.push(b'}');
}

fn text(fields: &[Field<'_>], out: &mut Vec<u8>) {
    for (i, (key, val)) in fields.iter().enumerate() {
        if i > 0 {
            out.push(b' ');
        }
        let _ = write!(out, "{key}=");
        let _ = match val {
            Val::Str(s) => {
                logfmt_value(s, out);
                Ok(())
            }
            Val::Num(n) => write!(out, "{n}"),
            Val::Ms(d) => write!(out, "{:.3}", d.as_secs_f64() * 1000.0),
            Val::Bool(b) => write!(out, "{b}"),
            Val::Time(t) => write!(out, "{}", humantime::format_rfc3339_millis(*t)),
            // Addresses have no spaces, quotes or `=`: bare.
            Val::Ip(a) => write!(out, "{a}"),
            Val::Addr(a) => write!(out, "{a}"),
            Val::Null => out.write_all(b"-"),
        };
    }
}

/// A value bare when it is plain printable ASCII without spaces, quotes or `=`, else
/// quoted with `\"`, `\\` and control characters escaped. `-` is quoted so it is never
/// mistaken for "no value".
fn logfmt_value(s: &str, out: &mut Vec<u8>) {
    let bare = !s.is_empty()
        && s != "-"
        && s.bytes()
            .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'=' && b != b'\\');
    if bare {
        out.extend_from_slice(s.as_bytes());
        return;
    }
    out.push(b'"');
    for c in s.chars() {
        match c {
            '"' => out.extend_from_slice(b"\\\""),
            '\\' => out.extend_from_slice(b"\\\\"),
            '\n' => out.extend_from_slice(b"\\n"),
            '\r' => out.extend_from_slice(b"\\r"),
            '\t' => out.extend_from_slice(b"\\t"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{{{:04x}}}", u32::from(c));
            }
            c => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    out.push(b'"');
}
