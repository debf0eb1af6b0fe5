//! Rendering a record as one line: JSON (one object) or text (logfmt: `key=value`,
//! quoted when needed). Both come from one sequence of fields, so they always say the
//! same thing. Everything a client sent is escaped: a line can't be split or forged
//! by a path, a Host or a user agent.

use std::borrow::Cow;
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, SystemTime};

use http::Version;

use super::Format;
use super::record::{Copied, HttpRecord, L4Record};
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

#[cfg(test)]
type Field<'a> = (&'static str, Val<'a>);

fn opt_str<'a>(v: Option<&'a str>) -> Val<'a> {
    v.map_or(Val::Null, |s| Val::Str(Cow::Borrowed(s)))
}

/// A copied header's bytes: absent when empty; UTF-8 as is (visible ASCII, the usual
/// case), anything else made valid.
fn header(v: &[u8]) -> Val<'_> {
    if v.is_empty() {
        return Val::Null;
    }
    match std::str::from_utf8(v) {
        Ok(s) => Val::Str(Cow::Borrowed(s)),
        Err(_) => Val::Str(String::from_utf8_lossy(v)),
    }
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
pub(super) fn trace_id(traceparent: &[u8]) -> Option<&str> {
    crate::trace::TraceParent::parse(traceparent)?;
    std::str::from_utf8(traceparent).ok()?.get(3..35)
}

/// A key as each format writes it, made at compile time, so that writing it is one
/// copy of a length the compiler knows: written piece by piece, a key was three or
/// four calls into libc's memcpy, and the line's keys most of its cost.
pub(super) struct Key {
    json: &'static str,
    text: &'static str,
}

macro_rules! key {
    ($name:literal) => {
        &Key {
            json: concat!("\"", $name, "\":"),
            text: concat!($name, "="),
        }
    };
}

/// The fields every line starts with: when, what kind, where it arrived, and the
/// route (kind and name) that took it.
fn opening(
    line: &mut Line<'_, '_>,
    time: SystemTime,
    kind: &'static str,
    l: Option<&Listener>,
    route: Option<(&'static str, &str)>,
) {
    line.put(key!("time"), &Val::Time(time));
    line.put(key!("kind"), &Val::Str(Cow::Borrowed(kind)));
    line.put(key!("gateway"), &gateway(l));
    line.put(key!("listener"), &listener(l));
    line.put(key!("route_kind"), &opt_str(route.map(|r| r.0)));
    line.put(key!("route"), &opt_str(route.map(|r| r.1)));
}

/// One HTTP request's line. Fields go straight into the line, no list built first:
/// a list of 24 values was a kilobyte written and read again per request.
pub(super) fn http_line(r: &HttpRecord, line: &mut Line<'_, '_>) {
    let rule = r.rule.as_deref();
    let route = rule.map(|a| (a.kind, &*a.route));
    opening(line, r.time, "http", r.listener.as_deref(), route);
    line.put(key!("rule"), &opt_str(rule.and_then(|a| a.rule.as_deref())));
    line.put(key!("client"), &Val::Ip(r.client));
    line.put(key!("authority"), &header(r.field(Copied::Authority)));
    line.put(key!("method"), &Val::Str(Cow::Borrowed(r.method.as_str())));
    line.put(key!("path"), &Val::Str(String::from_utf8_lossy(r.path())));
    line.put(
        key!("protocol"),
        &Val::Str(Cow::Borrowed(protocol(r.version))),
    );
    line.put(key!("status"), &Val::Num(u64::from(r.status)));
    line.put(key!("reason"), &opt_str(r.reason));
    let request_bytes = r
        .request_bytes
        .as_ref()
        .map_or(0, |n| n.load(std::sync::atomic::Ordering::Relaxed));
    line.put(key!("request_bytes"), &Val::Num(request_bytes));
    line.put(key!("response_bytes"), &Val::Num(r.response_bytes));
    line.put(key!("duration_ms"), &Val::Ms(r.duration));
    line.put(key!("complete"), &Val::Bool(r.complete));
    line.put(key!("upstream"), &r.upstream.map_or(Val::Null, Val::Addr));
    line.put(
        key!("upstream_ms"),
        &r.upstream_time.map_or(Val::Null, Val::Ms),
    );
    line.put(key!("retries"), &Val::Num(u64::from(r.retries)));
    line.put(key!("request_id"), &header(r.field(Copied::RequestId)));
    line.put(
        key!("trace_id"),
        &opt_str(trace_id(r.field(Copied::TraceParent))),
    );
    line.put(key!("user_agent"), &header(r.field(Copied::UserAgent)));
}

/// One L4 connection's line.
pub(super) fn l4_line(r: &L4Record, line: &mut Line<'_, '_>) {
    let route = r.target.as_deref().map(|t| (t.kind, &*t.route));
    opening(line, r.time, "l4", r.listener.as_deref(), route);
    line.put(key!("client"), &Val::Ip(r.peer.ip()));
    line.put(key!("protocol"), &Val::Str(Cow::Borrowed(r.protocol)));
    line.put(key!("sni"), &opt_str(r.sni.as_deref()));
    line.put(key!("reason"), &opt_str(r.reason));
    line.put(key!("upstream"), &r.upstream.map_or(Val::Null, Val::Addr));
    line.put(key!("request_bytes"), &Val::Num(r.bytes_in));
    line.put(key!("response_bytes"), &Val::Num(r.bytes_out));
    line.put(key!("duration_ms"), &Val::Ms(r.duration));
}

/// Renders lines: the format, and the current second's timestamp already formatted
/// (one writer thread formats every line, and most lines of a second share it).
pub(super) struct LineWriter {
    format: Format,
    /// `YYYY-MM-DDTHH:MM:SS` of `second` (since the Unix epoch).
    second: u64,
    stamp: [u8; 19],
}

impl LineWriter {
    pub(super) fn new(format: Format) -> Self {
        Self {
            format,
            second: u64::MAX,
            stamp: [0; 19],
        }
    }

    /// Starts a line at the end of `out`; [`Line::end`] finishes it.
    pub(super) fn line<'w, 'o>(&'w mut self, out: &'o mut Vec<u8>) -> Line<'w, 'o> {
        Line {
            json: self.format == Format::Json,
            writer: self,
            out,
            first: true,
        }
    }

    /// Appends one line of `fields` (with its newline) to `out`.
    #[cfg(test)]
    pub(super) fn write_line(&mut self, fields: &[Field<'_>], out: &mut Vec<u8>) {
        let mut line = self.line(out);
        for (key, val) in fields {
            line.field(key, val);
        }
        line.end();
    }

    /// RFC 3339 in UTC with milliseconds: `2026-12-03T02:22:27.123Z`.
    fn time(&mut self, t: SystemTime, out: &mut Vec<u8>) {
        let Ok(since) = t.duration_since(SystemTime::UNIX_EPOCH) else {
            let _ = write!(out, "{}", humantime::format_rfc3339_millis(t));
            return;
        };
        if since.as_secs() != self.second {
            let whole = SystemTime::UNIX_EPOCH + Duration::from_secs(since.as_secs());
            let text = humantime::format_rfc3339_seconds(whole).to_string();
            match text.as_bytes().get(..19) {
                Some(prefix) => self.stamp.copy_from_slice(prefix),
                None => {
                    out.extend_from_slice(text.as_bytes());
                    return;
                }
            }
            self.second = since.as_secs();
        }
        out.extend_from_slice(&self.stamp);
        out.push(b'.');
        three_digits(since.subsec_millis(), out);
        out.push(b'Z');
    }
}

/// One line being written, byte by byte rather than through `fmt`: the line is
/// written on the worker that served the request, so its cost is the request's
/// (issue 16: logging within 5% of not logging).
pub(super) struct Line<'w, 'o> {
    writer: &'w mut LineWriter,
    out: &'o mut Vec<u8>,
    json: bool,
    first: bool,
}

impl Line<'_, '_> {
    /// One field of the edge's own lines.
    #[inline]
    pub(super) fn put(&mut self, key: &Key, val: &Val<'_>) {
        self.key(key);
        self.value(val);
    }

    #[inline(always)]
    fn key(&mut self, key: &Key) {
        self.separator();
        let piece = if self.json { key.json } else { key.text };
        self.out.extend_from_slice(piece.as_bytes());
    }

    /// What goes before a field: the object's opening or a comma in JSON, a space
    /// between text fields.
    #[inline(always)]
    fn separator(&mut self) {
        match (self.json, self.first) {
            (true, true) => self.out.push(b'{'),
            (true, false) => self.out.push(b','),
            (false, true) => {}
            (false, false) => self.out.push(b' '),
        }
        self.first = false;
    }

    /// One field under any key (the renderer's tests).
    #[cfg(test)]
    pub(super) fn field(&mut self, key: &str, val: &Val<'_>) {
        self.separator();
        if self.json {
            self.out.push(b'"');
        }
        self.out.extend_from_slice(key.as_bytes());
        self.out
            .extend_from_slice(if self.json { b"\":" } else { b"=" });
        self.value(val);
    }

    fn value(&mut self, val: &Val<'_>) {
        let out = &mut *self.out;
        // JSON quotes the values that are strings there; text leaves addresses and
        // times bare (they have no spaces, quotes or `=`).
        let quoted = self.json && matches!(val, Val::Time(_) | Val::Ip(_) | Val::Addr(_));
        if quoted {
            out.push(b'"');
        }
        match val {
            Val::Str(s) if self.json => json_string(s, out),
            Val::Str(s) => logfmt_value(s, out),
            Val::Num(n) => out.extend_from_slice(itoa::Buffer::new().format(*n).as_bytes()),
            Val::Ms(d) => millis(*d, out),
            Val::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
            Val::Time(t) => self.writer.time(*t, out),
            Val::Ip(a) => ip(*a, out),
            Val::Addr(a) => {
                if a.is_ipv6() {
                    out.push(b'[');
                }
                ip(a.ip(), out);
                if a.is_ipv6() {
                    out.push(b']');
                }
                out.push(b':');
                out.extend_from_slice(itoa::Buffer::new().format(a.port()).as_bytes());
            }
            Val::Null if self.json => out.extend_from_slice(b"null"),
            Val::Null => out.push(b'-'),
        }
        if quoted {
            out.push(b'"');
        }
    }

    /// Ends the line with its newline.
    pub(super) fn end(self) {
        if self.json {
            if self.first {
                self.out.push(b'{');
            }
            self.out.push(b'}');
        }
        self.out.push(b'\n');
    }
}

/// Milliseconds with three decimals (microseconds), rounded to the nearest.
fn millis(d: Duration, out: &mut Vec<u8>) {
    let micros = d.as_nanos().saturating_add(500) / 1000;
    let micros = u64::try_from(micros).unwrap_or(u64::MAX);
    out.extend_from_slice(itoa::Buffer::new().format(micros / 1000).as_bytes());
    out.push(b'.');
    three_digits((micros % 1000) as u32, out);
}

/// `n` (below 1000) as exactly three digits.
fn three_digits(n: u32, out: &mut Vec<u8>) {
    let n = n.min(999);
    out.extend_from_slice(&[
        b'0' + (n / 100) as u8,
        b'0' + (n / 10 % 10) as u8,
        b'0' + (n % 10) as u8,
    ]);
}

fn ip(a: IpAddr, out: &mut Vec<u8>) {
    match a {
        IpAddr::V4(v4) => {
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push(b'.');
                }
                out.extend_from_slice(itoa::Buffer::new().format(octet).as_bytes());
            }
        }
        // Rare on this path, and its shortening rules are std's to get right.
        IpAddr::V6(v6) => {
            let _ = write!(out, "{v6}");
        }
    }
}

/// A JSON string: copied as is when nothing in it needs escaping (the usual path,
/// Host or user agent), else through serde_json's escaping.
fn json_string(s: &str, out: &mut Vec<u8>) {
    if s.bytes()
        .all(|b| b >= 0x20 && b != b'"' && b != b'\\' && b != 0x7f)
    {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        let _ = serde_json::to_writer(&mut *out, s);
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
