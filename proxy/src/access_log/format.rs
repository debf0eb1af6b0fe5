//! Rendering a record as one line: JSON (one object) or text (logfmt: `key=value`,
//! quoted when needed). Both come from one sequence of fields, so they always say the
//! same thing. Everything a client sent is escaped: a line can't be split or forged
//! by a path, a Host or a user agent.

use std::borrow::Cow;
use std::io::Write;
use std::marker::PhantomData;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use http::{Method, Version};

use super::record::{Copied, HttpRecord, L4Record};
use crate::routing::RuleAction;
use crate::snapshot::Listener;

/// How a line is written, as a type: each format's lines are their own code, so a
/// key is one copy of a length the compiler knows and no field asks which format.
pub(super) trait Style {
    const JSON: bool;
}

/// One JSON object per line.
pub(super) enum Json {}
/// logfmt: `key=value`, values quoted when needed.
pub(super) enum Text {}

impl Style for Json {
    const JSON: bool = true;
}

impl Style for Text {
    const JSON: bool = false;
}

/// The listener's name, borrowed in the usual case of one listener per socket.
fn listener_name(l: &Listener) -> Cow<'_, str> {
    match l.sections.as_slice() {
        [one] => Cow::Borrowed(&**one),
        several => Cow::Owned(crate::telemetry::listener_label(several)),
    }
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

/// Each form starts with the separator from the field before (`,` or a space), so a
/// key and its separator are one copy; a line's first key leaves it out.
macro_rules! key {
    ($name:literal) => {
        &Key {
            json: concat!(",\"", $name, "\":"),
            text: concat!(" ", $name, "="),
        }
    };
}

/// The key the renderer's tests write values under.
#[cfg(test)]
pub(super) const TEST_KEY: &Key = key!("k");

/// The fields an L4 line starts with: when, what kind, where it arrived, and the
/// route (kind and name) that took it. An HTTP line has the same, and its rule.
#[inline(always)]
fn opening<S: Style>(
    line: &mut Line<'_, '_, S>,
    time: SystemTime,
    kind: &'static str,
    l: Option<&Listener>,
    route: Option<(&'static str, &str)>,
) {
    line.time(key!("time"), time);
    line.str(key!("kind"), kind);
    place(line, l);
    line.opt_str(key!("route_kind"), route.map(|r| r.0));
    line.opt_str(key!("route"), route.map(|r| r.1));
}

/// The Gateway and listener a request or connection arrived on.
#[inline(always)]
fn place<S: Style>(line: &mut Line<'_, '_, S>, l: Option<&Listener>) {
    line.opt_str(key!("gateway"), l.map(|l| &*l.gateway));
    match l {
        Some(l) => line.str(key!("listener"), &listener_name(l)),
        None => line.null(key!("listener")),
    }
}

/// One HTTP request's line. Fields go straight into the line, no list built first:
/// a list of 24 values was a kilobyte written and read again per request.
pub(super) fn http_line<S: Style>(r: &HttpRecord, line: &mut Line<'_, '_, S>) {
    line.time(key!("time"), r.time);
    line.plain(key!("kind"), "http");
    line.names(r.listener.as_ref(), r.rule.as_ref());
    line.ip(key!("client"), r.client);
    line.header(key!("authority"), r.field(Copied::Authority));
    method(line, &r.method);
    line.bytes(key!("path"), r.path());
    line.plain(key!("protocol"), protocol(r.version));
    line.num(key!("status"), u64::from(r.status));
    line.opt_str(key!("reason"), r.reason);
    let request_bytes = r
        .request_bytes
        .as_ref()
        .map_or(0, |n| n.load(std::sync::atomic::Ordering::Relaxed));
    line.num(key!("request_bytes"), request_bytes);
    line.num(key!("response_bytes"), r.response_bytes);
    line.ms(key!("duration_ms"), r.duration);
    line.bool(key!("complete"), r.complete);
    line.opt_addr(key!("upstream"), r.upstream);
    match r.upstream_time {
        Some(d) => line.ms(key!("upstream_ms"), d),
        None => line.null(key!("upstream_ms")),
    }
    line.num(key!("retries"), u64::from(r.retries));
    line.header(key!("request_id"), r.field(Copied::RequestId));
    line.opt_str(key!("trace_id"), trace_id(r.field(Copied::TraceParent)));
    line.header(key!("user_agent"), r.field(Copied::UserAgent));
}

/// The method: HTTP's own are plain constants; an extension method is a token, which
/// has no byte to escape, but is still checked (a method named `-` must be quoted in
/// text).
#[inline(always)]
pub(super) fn method<S: Style>(line: &mut Line<'_, '_, S>, m: &Method) {
    match crate::http::standard_method(m) {
        Some(known) => line.plain(key!("method"), known),
        None => line.str(key!("method"), m.as_str()),
    }
}

/// An HTTP line's names: where it arrived, and the route and rule that took it.
#[inline(always)]
fn names_of<S: Style>(line: &mut Line<'_, '_, S>, l: Option<&Listener>, rule: Option<&RuleAction>) {
    place(line, l);
    line.opt_str(key!("route_kind"), rule.map(|a| a.kind.as_str()));
    line.opt_str(key!("route"), rule.map(|a| &**a.route()));
    line.opt_str(key!("rule"), rule.and_then(|a| a.rule().map(|r| &**r)));
}

/// One L4 connection's line.
pub(super) fn l4_line<S: Style>(r: &L4Record, line: &mut Line<'_, '_, S>) {
    let route = r.target.as_deref().map(|t| (t.kind, &*t.route));
    opening(line, r.time, "l4", r.listener.as_deref(), route);
    line.ip(key!("client"), r.peer.ip());
    line.str(key!("protocol"), r.protocol);
    line.opt_str(key!("sni"), r.sni.as_deref());
    line.opt_str(key!("reason"), r.reason);
    line.opt_addr(key!("upstream"), r.upstream);
    line.num(key!("request_bytes"), r.bytes_in);
    line.num(key!("response_bytes"), r.bytes_out);
    line.ms(key!("duration_ms"), r.duration);
}

/// `255.255.255.255:65535` is 21 bytes; the last byte of a kept text is its length.
const KEPT_TEXT: usize = 24;

/// The text of the last few IPv4 addresses written, by a nonzero key made of the
/// address (and port): a connection's requests, or a load balancer's, come from one
/// client, and a worker's go to a route's few endpoints. Written afresh, an address
/// and port were about 300 instructions a line under callgrind.
struct KeptTexts<const SLOTS: usize> {
    slots: [(u64, [u8; KEPT_TEXT]); SLOTS],
    next: usize,
}

impl<const SLOTS: usize> KeptTexts<SLOTS> {
    const fn new() -> Self {
        Self {
            slots: [(0, [0; KEPT_TEXT]); SLOTS],
            next: 0,
        }
    }

    /// Writes the text kept for `key`, or has `render` write it and keeps it.
    fn write(&mut self, key: u64, out: &mut Vec<u8>, render: impl FnOnce(&mut Vec<u8>)) {
        if let Some((_, text)) = self.slots.iter().find(|(k, _)| *k == key) {
            push_padded(out, text, usize::from(text[KEPT_TEXT - 1]));
            return;
        }
        let start = out.len();
        render(out);
        let written = out.get(start..).unwrap_or_default();
        let mut text = [0u8; KEPT_TEXT];
        if let Some(keep) = text.get_mut(..written.len()) {
            keep.copy_from_slice(written);
            text[KEPT_TEXT - 1] = written.len() as u8;
            if let Some(slot) = self.slots.get_mut(self.next % SLOTS) {
                *slot = (key, text);
            }
            self.next = self.next.wrapping_add(1);
        }
    }
}

/// The key of an IPv4 address and port in [`KeptTexts`]: bit 63 set, so never an
/// empty slot's 0.
fn kept_key(ip: Ipv4Addr, port: u16) -> u64 {
    1 << 63 | u64::from(ip.to_bits()) << 16 | u64::from(port)
}

/// The first `len` bytes of `text`: all of it stored (one copy of a length the
/// compiler knows, no call) and the rest taken back.
#[inline(always)]
fn push_padded<const N: usize>(out: &mut Vec<u8>, text: &[u8; N], len: usize) {
    out.extend_from_slice(text);
    out.truncate(out.len() - N + len.min(N));
}

/// Longer names than this are written each time rather than kept.
const NAMES_KEPT: usize = 1024;

/// Renders lines: the current second's timestamp already formatted (most lines of a
/// second share it). One per thread that writes lines.
pub(super) struct LineWriter {
    /// `YYYY-MM-DDTHH:MM:SS` of `second` (since the Unix epoch).
    second: u64,
    stamp: [u8; 19],
    /// The last IPv4 client address written, and its text.
    client: KeptTexts<1>,
    /// The last four IPv4 upstream addresses written, and their text.
    upstreams: KeptTexts<4>,
    /// The last HTTP line's listener and rule, and their five fields as written: a
    /// worker's requests mostly go one route after another the same way. Held weakly:
    /// a `Weak` keeps the allocation, so a pointer compared equal is the same listener
    /// and rule, never a new one at a freed one's address, but not the contents, whose
    /// metric handles must go with a removed route (its series leave `/metrics`).
    names: Option<Names>,
}

struct Names {
    listener: Option<Weak<Listener>>,
    rule: Option<Weak<RuleAction>>,
    json: bool,
    text: Vec<u8>,
}

impl Names {
    fn is_for(
        &self,
        json: bool,
        l: Option<&Arc<Listener>>,
        rule: Option<&Arc<RuleAction>>,
    ) -> bool {
        fn same<T>(a: Option<&Weak<T>>, b: Option<&Arc<T>>) -> bool {
            match (a, b) {
                (Some(a), Some(b)) => std::ptr::eq(a.as_ptr(), Arc::as_ptr(b)),
                (None, None) => true,
                _ => false,
            }
        }
        self.json == json && same(self.listener.as_ref(), l) && same(self.rule.as_ref(), rule)
    }
}

impl LineWriter {
    pub(super) fn new() -> Self {
        Self {
            second: u64::MAX,
            stamp: [0; 19],
            client: KeptTexts::new(),
            upstreams: KeptTexts::new(),
            names: None,
        }
    }

    /// A client address, its text kept for the next line from it.
    fn client(&mut self, a: IpAddr, out: &mut Vec<u8>) {
        match a {
            IpAddr::V4(v4) => self.client.write(kept_key(v4, 0), out, |out| ip(a, out)),
            IpAddr::V6(_) => ip(a, out),
        }
    }

    /// An IPv4 upstream address (`1.2.3.4:80`), its text kept among the last few.
    fn upstream(&mut self, a: SocketAddrV4, out: &mut Vec<u8>) {
        self.upstreams
            .write(kept_key(*a.ip(), a.port()), out, |out| {
                ip(IpAddr::V4(*a.ip()), out);
                out.push(b':');
                digits(u64::from(a.port()), out);
            });
    }

    /// Starts a line at the end of `out`; [`Line::end`] finishes it.
    pub(super) fn line<'w, 'o, S: Style>(&'w mut self, out: &'o mut Vec<u8>) -> Line<'w, 'o, S> {
        Line {
            writer: self,
            out,
            first: true,
            style: PhantomData,
        }
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
/// (issue 16: logging within 5% of not logging). Each field is a typed call, so a
/// line does only the work its values need.
pub(super) struct Line<'w, 'o, S> {
    writer: &'w mut LineWriter,
    out: &'o mut Vec<u8>,
    first: bool,
    style: PhantomData<S>,
}

impl<S: Style> Line<'_, '_, S> {
    #[inline(always)]
    fn key(&mut self, key: &Key) {
        let piece = if S::JSON { key.json } else { key.text };
        if self.first {
            self.first = false;
            if S::JSON {
                self.out.push(b'{');
            }
            self.out
                .extend_from_slice(piece.as_bytes().get(1..).unwrap_or_default());
        } else {
            self.out.extend_from_slice(piece.as_bytes());
        }
    }

    /// A value JSON quotes and text leaves bare (times, addresses: no spaces, quotes
    /// or `=` in them).
    #[inline(always)]
    fn quote(&mut self) {
        if S::JSON {
            self.out.push(b'"');
        }
    }

    /// A string: written as is when nothing in it needs escaping (names, the usual
    /// Host, path and user agent), else escaped.
    #[inline]
    pub(super) fn str(&mut self, key: &Key, s: &str) {
        self.key(key);
        string::<S>(s.as_bytes(), self.out);
    }

    /// A string known to need no escaping or quoting in either format (a constant
    /// of the edge's): written without looking at its bytes.
    #[inline]
    pub(super) fn plain(&mut self, key: &Key, s: &'static str) {
        debug_assert!(plain_text_or_json(s.as_bytes()).0, "{s:?} is not plain");
        self.key(key);
        self.quote();
        self.out.extend_from_slice(s.as_bytes());
        self.quote();
    }

    /// Bytes a client sent (a path): as a string, anything not UTF-8 made valid.
    #[inline]
    pub(super) fn bytes(&mut self, key: &Key, b: &[u8]) {
        self.key(key);
        string::<S>(b, self.out);
    }

    /// A copied header: absent when empty.
    #[inline]
    pub(super) fn header(&mut self, key: &Key, b: &[u8]) {
        if b.is_empty() {
            self.null(key);
        } else {
            self.bytes(key, b);
        }
    }

    #[inline]
    pub(super) fn opt_str(&mut self, key: &Key, s: Option<&str>) {
        match s {
            Some(s) => self.str(key, s),
            None => self.null(key),
        }
    }

    /// No value: JSON's `null`, text's `-`.
    #[inline]
    pub(super) fn null(&mut self, key: &Key) {
        self.key(key);
        if S::JSON {
            self.out.extend_from_slice(b"null");
        } else {
            self.out.push(b'-');
        }
    }

    #[inline]
    pub(super) fn num(&mut self, key: &Key, n: u64) {
        self.key(key);
        digits(n, self.out);
    }

    /// Milliseconds with three decimals (microseconds), rounded to the nearest.
    #[inline]
    pub(super) fn ms(&mut self, key: &Key, d: Duration) {
        self.key(key);
        // In u64: `as_nanos` is a u128, and dividing one is a call into a 128-bit
        // division routine (`__udivti3`), twice a line.
        let micros = d
            .as_secs()
            .saturating_mul(1_000_000)
            .saturating_add(u64::from((d.subsec_nanos() + 500) / 1000));
        digits(micros / 1000, self.out);
        self.out.push(b'.');
        three_digits((micros % 1000) as u32, self.out);
    }

    #[inline]
    pub(super) fn bool(&mut self, key: &Key, b: bool) {
        self.key(key);
        self.out
            .extend_from_slice(if b { &b"true"[..] } else { &b"false"[..] });
    }

    #[inline]
    pub(super) fn time(&mut self, key: &Key, t: SystemTime) {
        self.key(key);
        self.quote();
        self.writer.time(t, self.out);
        self.quote();
    }

    #[inline]
    pub(super) fn ip(&mut self, key: &Key, a: IpAddr) {
        self.key(key);
        self.quote();
        self.writer.client(a, self.out);
        self.quote();
    }

    #[inline]
    pub(super) fn opt_addr(&mut self, key: &Key, a: Option<SocketAddr>) {
        let Some(a) = a else {
            return self.null(key);
        };
        self.key(key);
        self.quote();
        match a {
            SocketAddr::V4(v4) => self.writer.upstream(v4, self.out),
            SocketAddr::V6(v6) => {
                self.out.push(b'[');
                ip(IpAddr::V6(*v6.ip()), self.out);
                self.out.push(b']');
                self.out.push(b':');
                digits(u64::from(v6.port()), self.out);
            }
        }
        self.quote();
    }

    /// The gateway, listener, route kind, route and rule fields: copied from the last
    /// line this thread wrote when it had the same listener and rule, else written and
    /// kept. Never the line's first field.
    pub(super) fn names(&mut self, l: Option<&Arc<Listener>>, rule: Option<&Arc<RuleAction>>) {
        if let Some(kept) = &self.writer.names
            && kept.is_for(S::JSON, l, rule)
        {
            self.out.extend_from_slice(&kept.text);
            return;
        }
        let start = self.out.len();
        names_of(self, l.map(|l| &**l), rule.map(|r| &**r));
        let written = self.out.get(start..).unwrap_or_default();
        let mut text = self.writer.names.take().map(|n| n.text).unwrap_or_default();
        text.clear();
        if written.len() <= NAMES_KEPT {
            text.extend_from_slice(written);
            self.writer.names = Some(Names {
                listener: l.map(Arc::downgrade),
                rule: rule.map(Arc::downgrade),
                json: S::JSON,
                text,
            });
        }
    }

    /// Ends the line with its newline.
    pub(super) fn end(self) {
        if S::JSON {
            if self.first {
                self.out.push(b'{');
            }
            self.out.push(b'}');
        }
        self.out.push(b'\n');
    }
}

/// `n` in decimal, digit by digit: the usual values (a status, a few bytes, a port)
/// have a few digits, and pushing them costs less than a call to copy them (itoa's
/// two digits at a time and a copy measured 25 ns slower a line).
fn digits(mut n: u64, out: &mut Vec<u8>) {
    // Most numbers on a line are one digit (no request body, no retry, a duration
    // under a millisecond).
    if n < 10 {
        out.push(b'0' + n as u8);
        return;
    }
    let start = out.len();
    loop {
        out.push(b'0' + (n % 10) as u8);
        n /= 10;
        if n == 0 {
            break;
        }
    }
    if let Some(written) = out.get_mut(start..) {
        written.reverse();
    }
}

/// `n` (below 1000) as exactly three digits, from a table (no division).
fn three_digits(n: u32, out: &mut Vec<u8>) {
    push_padded(out, &THREE_DIGITS[n.min(999) as usize], 3);
}

/// 000 to 999, each padded to four bytes.
static THREE_DIGITS: [[u8; 4]; 1000] = {
    let mut table = [[0u8; 4]; 1000];
    let mut i = 0;
    while i < 1000 {
        table[i] = [
            b'0' + (i / 100) as u8,
            b'0' + (i / 10 % 10) as u8,
            b'0' + (i % 10) as u8,
            0,
        ];
        i += 1;
    }
    table
};

/// Each IPv4 octet in decimal, padded to four bytes, and its length.
static OCTETS: [([u8; 4], u8); 256] = {
    let mut table = [([0u8; 4], 0u8); 256];
    let mut i = 0;
    while i < 256 {
        let n = i as u8;
        table[i] = if n >= 100 {
            ([b'0' + n / 100, b'0' + n / 10 % 10, b'0' + n % 10, 0], 3)
        } else if n >= 10 {
            ([b'0' + n / 10, b'0' + n % 10, 0, 0], 2)
        } else {
            ([b'0' + n, 0, 0, 0], 1)
        };
        i += 1;
    }
    table
};

fn ip(a: IpAddr, out: &mut Vec<u8>) {
    match a {
        IpAddr::V4(v4) => {
            // A third of the instructions of digit by digit.
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push(b'.');
                }
                let (text, len) = &OCTETS[usize::from(octet)];
                push_padded(out, text, usize::from(*len));
            }
        }
        // Rare on this path, and its shortening rules are std's to get right.
        IpAddr::V6(v6) => {
            let _ = write!(out, "{v6}");
        }
    }
}

/// A string value in `S`'s form: copied as is when every byte may stand in it
/// unescaped, else escaped (and made valid UTF-8).
#[inline]
fn string<S: Style>(b: &[u8], out: &mut Vec<u8>) {
    if S::JSON {
        if plain_json(b) {
            out.push(b'"');
            out.extend_from_slice(b);
            out.push(b'"');
        } else {
            let _ = serde_json::to_writer(&mut *out, &String::from_utf8_lossy(b));
        }
    } else {
        let (bare, quotable) = plain_text_or_json(b);
        if bare {
            out.extend_from_slice(b);
        } else if quotable {
            // Spaces (a browser's user agent) or `=` only: quoted, nothing to escape.
            out.push(b'"');
            out.extend_from_slice(b);
            out.push(b'"');
        } else {
            logfmt_quoted(&String::from_utf8_lossy(b), out);
        }
    }
}

/// What a byte may not stand in as is: [`NOT_JSON`] (a JSON string or a quoted text
/// value: anything but printable ASCII, `"` and `\`; non-ASCII takes the escaping
/// path, which also makes it valid UTF-8) and [`NOT_BARE`] (a bare text value: also
/// a space or `=`). A table, OR-ed over a value: half the time of comparing each byte
/// (11 against 6 ns over the benchmark's four values), and fewer instructions.
static CLASS: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut i = 0;
    while i < 256 {
        let c = i as u8;
        if c.wrapping_sub(0x20) >= 0x5f || c == b'"' || c == b'\\' {
            table[i] = NOT_JSON | NOT_BARE;
        } else if c == b' ' || c == b'=' {
            table[i] = NOT_BARE;
        }
        i += 1;
    }
    table
};
const NOT_JSON: u8 = 1;
const NOT_BARE: u8 = 2;

/// The [`CLASS`] bits of every byte of `b`.
#[inline(always)]
fn classes(b: &[u8]) -> u8 {
    b.iter().fold(0, |bits, &c| bits | CLASS[usize::from(c)])
}

/// Whether `b` can stand in a JSON string, or a quoted text value, as is.
fn plain_json(b: &[u8]) -> bool {
    classes(b) & NOT_JSON == 0
}

/// Whether `b` is a bare logfmt value (visible ASCII but `"`, `=` and `\`, not empty,
/// and not `-`, which says "no value"), and whether it can be quoted as is (see
/// [`plain_json`]): one pass for both, since a value with a space (a browser's user
/// agent) is the second.
fn plain_text_or_json(b: &[u8]) -> (bool, bool) {
    let bits = classes(b);
    (
        bits == 0 && !b.is_empty() && b != b"-",
        bits & NOT_JSON == 0,
    )
}

/// A value quoted, with `\"`, `\\` and control characters escaped.
fn logfmt_quoted(s: &str, out: &mut Vec<u8>) {
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
