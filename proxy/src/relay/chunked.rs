//! Finds where a chunked body ends: the relay passes the chunks through as they came,
//! so all it must know is when the last one (and its trailers) is over, and that the
//! framing is sound enough to reuse the connection after it; the full path's byte
//! exchange (`super::full_path`) also takes the data out ([`Chunked::decode`]).

/// Longest chunk-size line (size, extensions) and trailer section accepted.
const MAX_LINE: usize = 4096;
const MAX_TRAILERS: usize = 16 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading the size's hex digits.
    Size {
        digits: u8,
    },
    /// After the size: extensions up to CR.
    Extension,
    SizeLf,
    Data,
    DataCr,
    DataLf,
    /// At the start of a trailer line (or the final empty line).
    TrailerStart,
    TrailerLine,
    TrailerLf,
    EndLf,
    Done,
}

/// A malformed chunked body: the connection can't be trusted after it.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("malformed chunked body: {0}")]
pub struct Malformed(&'static str);

#[derive(Debug)]
pub struct Chunked {
    state: State,
    size: u64,
    line: usize,
    trailers: usize,
}

impl Default for Chunked {
    fn default() -> Self {
        Self {
            state: State::Size { digits: 0 },
            size: 0,
            line: 0,
            trailers: 0,
        }
    }
}

impl Chunked {
    /// Scans the next bytes of the body. `Some(n)`: the body ended after the first `n`
    /// of them (the rest belong to whatever follows); `None`: it goes on.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<Option<usize>, Malformed> {
        self.decode(bytes, |_| {})
    }

    /// As [`Self::feed`], and gives `data` each range of `bytes` that is chunk data:
    /// the decoded body, for a reader that does not pass the chunks on as they came.
    pub fn decode(
        &mut self,
        bytes: &[u8],
        mut data: impl FnMut(std::ops::Range<usize>),
    ) -> Result<Option<usize>, Malformed> {
        let mut i = 0;
        while i < bytes.len() {
            if self.state == State::Data {
                // Skip the data in one step.
                let left = bytes.len() - i;
                let take = usize::try_from(self.size).map_or(left, |s| s.min(left));
                data(i..i + take);
                i += take;
                self.size -= take as u64;
                if self.size == 0 {
                    self.state = State::DataCr;
                }
                continue;
            }
            let b = bytes[i];
            i += 1;
            self.state = match self.state {
                State::Size { digits } => match hex(b) {
                    Some(v) if digits < 16 => {
                        self.size = (self.size << 4) | u64::from(v);
                        State::Size { digits: digits + 1 }
                    }
                    Some(_) => return Err(Malformed("chunk size too large")),
                    None if digits == 0 => return Err(Malformed("chunk size missing")),
                    None => {
                        self.line = 0;
                        self.after_size(b)?
                    }
                },
                State::Extension => {
                    self.line += 1;
                    if self.line > MAX_LINE {
                        return Err(Malformed("chunk extension too long"));
                    }
                    match b {
                        b'\r' => State::SizeLf,
                        b'\n' => return Err(Malformed("bare LF")),
                        _ => State::Extension,
                    }
                }
                State::SizeLf => {
                    expect(b, b'\n')?;
                    if self.size == 0 {
                        State::TrailerStart
                    } else {
                        State::Data
                    }
                }
                State::DataCr => {
                    expect(b, b'\r')?;
                    State::DataLf
                }
                State::DataLf => {
                    expect(b, b'\n')?;
                    self.size = 0;
                    State::Size { digits: 0 }
                }
                State::TrailerStart => match b {
                    b'\r' => State::EndLf,
                    _ => {
                        self.count_trailer()?;
                        State::TrailerLine
                    }
                },
                State::TrailerLine => {
                    self.count_trailer()?;
                    match b {
                        b'\r' => State::TrailerLf,
                        b'\n' => return Err(Malformed("bare LF")),
                        _ => State::TrailerLine,
                    }
                }
                State::TrailerLf => {
                    expect(b, b'\n')?;
                    State::TrailerStart
                }
                State::EndLf => {
                    expect(b, b'\n')?;
                    self.state = State::Done;
                    return Ok(Some(i));
                }
                State::Data | State::Done => unreachable_state()?,
            };
        }
        Ok(None)
    }

    fn after_size(&mut self, b: u8) -> Result<State, Malformed> {
        match b {
            b'\r' => Ok(State::SizeLf),
            // RFC 9112 §7.1.1: BWS then `;` extensions.
            b';' | b' ' | b'\t' => Ok(State::Extension),
            _ => Err(Malformed("invalid chunk size")),
        }
    }

    fn count_trailer(&mut self) -> Result<(), Malformed> {
        self.trailers += 1;
        if self.trailers > MAX_TRAILERS {
            return Err(Malformed("trailers too long"));
        }
        Ok(())
    }
}

fn unreachable_state() -> Result<State, Malformed> {
    Err(Malformed("bytes after the end"))
}

fn expect(b: u8, want: u8) -> Result<(), Malformed> {
    if b == want {
        Ok(())
    } else {
        Err(Malformed("missing CRLF"))
    }
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end_of(body: &[u8]) -> Result<Option<usize>, Malformed> {
        Chunked::default().feed(body)
    }

    #[test]
    fn finds_the_end_in_one_piece_and_leaves_what_follows() {
        let body = b"5\r\nhello\r\n0\r\n\r\nHTTP/1.1 200 OK";
        assert_eq!(end_of(body), Ok(Some(15)));
        let with_ext = b"3;name=value\r\nabc\r\n0\r\nx-trailer: 1\r\n\r\n";
        assert_eq!(end_of(with_ext), Ok(Some(with_ext.len())));
        let upper = b"A\r\n0123456789\r\n0\r\n\r\n";
        assert_eq!(end_of(upper), Ok(Some(upper.len())));
    }

    #[test]
    fn decodes_the_data_across_every_split() {
        let body = b"4\r\nwiki\r\n5;x\r\npedia\r\n0\r\nt: v\r\n\r\n";
        for split in 0..body.len() {
            let mut c = Chunked::default();
            let mut got = Vec::new();
            let (a, b) = body.split_at(split);
            assert_eq!(c.decode(a, |r| got.extend_from_slice(&a[r])), Ok(None));
            let end = c.decode(b, |r| got.extend_from_slice(&b[r]));
            assert_eq!(end, Ok(Some(b.len())), "split at {split}");
            assert_eq!(got, b"wikipedia", "split at {split}");
        }
    }

    #[test]
    fn finds_the_end_across_every_split() {
        let body = b"4\r\nwiki\r\n5;x\r\npedia\r\n0\r\nt: v\r\n\r\n";
        for split in 0..body.len() {
            let mut c = Chunked::default();
            let first = c.feed(&body[..split]);
            assert_eq!(first, Ok(None), "split at {split}");
            assert_eq!(
                c.feed(&body[split..]),
                Ok(Some(body.len() - split)),
                "split at {split}"
            );
        }
        // Byte by byte.
        let mut c = Chunked::default();
        for (i, b) in body.iter().enumerate() {
            let r = c.feed(std::slice::from_ref(b));
            let want = if i + 1 == body.len() { Some(1) } else { None };
            assert_eq!(r, Ok(want), "byte {i}");
        }
    }

    #[test]
    fn refuses_what_a_backend_could_frame_differently() {
        for bad in [
            &b"x\r\n"[..],
            b"\r\n",
            b"5\nhello\r\n0\r\n\r\n",
            b"5\r\nhelloXX0\r\n\r\n",
            b"11111111111111111\r\n",
            b"0\r\nbad\ntrailer\r\n\r\n",
            b"-1\r\n",
        ] {
            assert!(end_of(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
