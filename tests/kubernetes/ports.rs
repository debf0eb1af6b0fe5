//! Ports for the processes the tests start on 127.0.0.1 (etcd, the apiserver, the
//! edges' admin servers).
//!
//! Asking the kernel for port 0 and closing the socket again is a race: the port comes
//! from the ephemeral range, where any outgoing connection of a test running beside
//! (an edge dialing the apiserver, a client) can take it before the server binds it.
//! CI lost a run to exactly that ("bind: address already in use" from an apiserver).
//! So ports come from below the ephemeral range, which the kernel never hands out on
//! its own, and each is given out once per test binary.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};

/// Below Linux's default ephemeral range (32768-60999) and clear of `RANGE`
/// (27100-27199), which the edges' internal ports use.
const FIRST: u32 = 20_000;
const END: u32 = 27_000;

/// The next port to try. Starts at an offset drawn from the process id so that two
/// test binaries started one after the other (or a rerun while sockets of the last run
/// sit in TIME_WAIT) do not walk the same ports.
static NEXT: AtomicU32 = AtomicU32::new(0);

/// A port on 127.0.0.1 that nothing listens on now and no other caller in this
/// process was given.
pub fn free_port() -> u16 {
    let span = END - FIRST;
    let start = std::process::id() % span;
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = FIRST + (start + n) % span;
        let Ok(port) = u16::try_from(port) else {
            continue;
        };
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port on 127.0.0.1 in {FIRST}-{END}");
}
