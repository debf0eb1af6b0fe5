//! Loopback networks and ports, each handed out once per test binary.
//!
//! Tests in one binary run at once, and other test binaries (another checkout's suite,
//! a rerun) may run beside them, so nothing is hand-numbered: a test asks for a network
//! ([`Net::allocate`]) or a port ([`free_port`]) and gets one nobody else holds.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

/// The echo backends listen on this port (the EndpointSlice port).
pub const ECHO_PORT: u16 = 9000;
/// Every test Gateway listener uses this port unless it says otherwise.
pub const LISTENER_PORT: u16 = 8080;

// ---------------------------------------------------------------------------------------
// Ports
// ---------------------------------------------------------------------------------------

/// Ports handed out by [`free_port`]: below Linux's default ephemeral range
/// (32768-60999) and clear of 27100-27199, which the Kubernetes suite gives the edges
/// for internal ports.
///
/// Asking the kernel for port 0 and closing the socket again is a race: the port comes
/// from the ephemeral range, where any outgoing connection of a test running beside
/// (an edge dialing the apiserver, a client) can take it before the server binds it.
/// CI lost a run to exactly that ("bind: address already in use" from an apiserver).
/// So ports come from below the ephemeral range, which the kernel never hands out on
/// its own, and each is given out once per test binary.
pub const FREE_PORTS: std::ops::Range<u16> = 20_000..27_000;

/// A port on 127.0.0.1 that nothing listens on now and no other caller in this process
/// was given. Starts at an offset drawn from the process id, so that two test binaries
/// started one after the other (or a rerun while sockets of the last run sit in
/// TIME_WAIT) do not walk the same ports.
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let first = u32::from(FREE_PORTS.start);
    let span = u32::from(FREE_PORTS.end) - first;
    let start = std::process::id() % span;
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let Ok(port) = u16::try_from(first + (start + n) % span) else {
            continue;
        };
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port on 127.0.0.1 in {FREE_PORTS:?}");
}

// ---------------------------------------------------------------------------------------
// Networks
// ---------------------------------------------------------------------------------------

/// Second octet of the networks [`Net::allocate`] hands out: 127.77.k.0/24.
pub const NET_B: u8 = 77;
/// Held on host .254 of every allocated network for the life of the test binary: the
/// claim that keeps another process from allocating the same network.
const CLAIM_PORT: u16 = 27_900;

/// A loopback network 127.b.k.0/24 owned by one test, and the layout the standalone
/// tests give it (admin at .250, echo backends at .251 and .252, clients from .100,
/// the Gateway at .5; .254 is the allocator's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Net {
    pub b: u8,
    pub k: u8,
}

impl Net {
    /// A network no other test of this binary was given, nor any other process holds:
    /// one is claimed by binding 127.77.k.254:27900 and keeping it bound until the
    /// binary exits. Starts at an offset drawn from the process id, like [`free_port`].
    pub fn allocate() -> Net {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        static CLAIMS: Mutex<Vec<TcpListener>> = Mutex::new(Vec::new());
        let span = 254;
        let start = std::process::id() % span;
        for _ in 0..span {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let Ok(k) = u8::try_from(1 + (start + n) % span) else {
                continue;
            };
            let net = Net { b: NET_B, k };
            if let Ok(claim) = TcpListener::bind(net.addr(254, CLAIM_PORT)) {
                CLAIMS
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(claim);
                return net;
            }
        }
        panic!("no free network 127.{NET_B}.k.0/24 left in this process");
    }

    pub fn ip(&self, host: u8) -> Ipv4Addr {
        Ipv4Addr::new(127, self.b, self.k, host)
    }
    pub fn ip_str(&self, host: u8) -> String {
        self.ip(host).to_string()
    }
    pub fn addr(&self, host: u8, port: u16) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(self.ip(host)), port)
    }
    /// The edge's admin server.
    pub fn admin(&self) -> SocketAddr {
        self.addr(250, 9901)
    }
    /// Echo backend "a".
    pub fn echo_a(&self) -> SocketAddr {
        self.addr(251, ECHO_PORT)
    }
    /// Echo backend "b".
    pub fn echo_b(&self) -> SocketAddr {
        self.addr(252, ECHO_PORT)
    }
    /// The source address every test client binds, so `x-forwarded-for` is exact.
    pub fn client_ip(&self) -> IpAddr {
        IpAddr::V4(self.ip(100))
    }
    /// The edge's address pool: .0-.15.
    pub fn pool(&self) -> String {
        format!("127.{}.{}.0/28", self.b, self.k)
    }
    /// The explicit Gateway address most tests use.
    pub fn gw(&self) -> SocketAddr {
        self.addr(5, LISTENER_PORT)
    }
}

impl std::fmt::Display for Net {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "127.{}.{}.0/24", self.b, self.k)
    }
}
