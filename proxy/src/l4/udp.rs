//! UDPRoute: datagrams forwarded per client flow.
//!
//! A flow is one client source address. Its first datagram picks a backend endpoint
//! and opens one connected upstream socket; later datagrams from that source go the
//! same way, and datagrams from the upstream socket go back to that source from the
//! listener's own socket. A flow ends after `idle_timeout` without traffic either way.
//!
//! The flow table is owned by the socket's receive loop (no lock). It is bounded in
//! total and per source IP, so one host spraying datagrams from many ports cannot grow
//! it without limit; refused datagrams are counted in `aether_udp_dropped_total`.
//! Upstream datagrams are read into a per-thread scratch buffer, so an idle flow holds
//! no buffer at all.

use std::cell::RefCell;
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use metrics::counter;
use tokio::net::UdpSocket;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{L4Stats, UDP_DROPPED_TOTAL};
use crate::access_log::{AccessLog, L4Record};
use crate::backend::Pick;
use crate::series::Open;
use crate::state::ProxyState;

/// The largest UDP payload.
const MAX_DATAGRAM: usize = 65_535;

/// Flow limits of every UDP listener.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct UdpSettings {
    pub idle_timeout: Duration,
    pub max_flows: usize,
    pub max_flows_per_source: usize,
}

impl UdpSettings {
    pub const DEFAULT: Self = Self {
        idle_timeout: Duration::from_secs(60),
        max_flows: 10_000,
        max_flows_per_source: 256,
    };
}

impl Default for UdpSettings {
    fn default() -> Self {
        Self::DEFAULT
    }
}

struct Flow {
    id: u64,
    upstream: Arc<UdpSocket>,
    /// Milliseconds since the loop's epoch of the last datagram either way.
    last_seen: Arc<AtomicU64>,
    stats: L4Stats,
    /// Counts the flow in its listener's `aether_udp_flows_active` until removed.
    _open: Open,
    /// Payload bytes client to backend, when the flow is access-logged.
    logged_in: Option<Arc<AtomicU64>>,
}

/// A logged flow's record, finished when the flow ends.
struct FlowLog {
    log: &'static AccessLog,
    record: Box<L4Record>,
    bytes_in: Arc<AtomicU64>,
}

fn dropped(reason: &'static str) {
    counter!(UDP_DROPPED_TOTAL, "reason" => reason).increment(1);
}

fn millis(epoch: Instant) -> u64 {
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Serves the UDP socket bound at `local` until `cancel` fires; its flows end with it.
pub async fn serve(
    socket: UdpSocket,
    local: SocketAddr,
    state: Arc<ProxyState>,
    settings: UdpSettings,
    cancel: CancellationToken,
) {
    let socket = Arc::new(socket);
    let epoch = Instant::now();
    let mut flows: HashMap<SocketAddr, Flow> = HashMap::new();
    let mut per_source: HashMap<IpAddr, usize> = HashMap::new();
    let (ended_tx, mut ended_rx) = mpsc::unbounded_channel::<(SocketAddr, u64)>();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let mut next_id = 0u64;
    loop {
        let (n, client) = tokio::select! {
            () = cancel.cancelled() => break,
            Some((client, id)) = ended_rx.recv() => {
                if flows.get(&client).is_some_and(|f| f.id == id) {
                    flows.remove(&client);
                    release(&mut per_source, client.ip());
                }
                continue;
            }
            r = socket.recv_from(&mut buf) => match r {
                Ok(pair) => pair,
                Err(e) => {
                    tracing::debug!(%local, error = %e, "UDP receive failed");
                    continue;
                }
            },
        };
        let datagram = &buf[..n];
        if let Some(flow) = flows.get(&client) {
            flow.last_seen.store(millis(epoch), Ordering::Relaxed);
            send_upstream(flow, datagram);
            continue;
        }
        if flows.len() >= settings.max_flows {
            dropped("flow_table_full");
            continue;
        }
        let from_source = per_source.get(&client.ip()).copied().unwrap_or(0);
        if from_source >= settings.max_flows_per_source {
            dropped("source_flow_limit");
            continue;
        }
        // One Snapshot load per new flow; a flow keeps its backend for its life.
        let snapshot = state.snapshot.load();
        let Some((listener, target)) = snapshot
            .udp
            .get(&local)
            .and_then(|l| Some((l, l.l4.as_ref()?.lookup(None)?)))
        else {
            dropped("no_route");
            continue;
        };
        let endpoint = match target.backends.pick() {
            Pick::Endpoint(_, _, ep) => ep.addr,
            Pick::NoEndpoints(_) | Pick::Invalid => {
                dropped("no_endpoint");
                continue;
            }
        };
        // One line per flow, when it ends; refused datagrams are only counted (one
        // line each would let a sender flood the log).
        let flow_log = state.access_log.filter(|l| l.sampled()).map(|log| {
            let mut record = Box::new(L4Record::new(Some(Arc::clone(listener)), client, "udp"));
            record.set_target(target);
            record.set_upstream(endpoint);
            FlowLog {
                log,
                record,
                bytes_in: Arc::new(AtomicU64::new(0)),
            }
        });
        let upstream = match connect_upstream(endpoint) {
            Ok(s) => Arc::new(s),
            Err(e) => {
                tracing::debug!(%endpoint, error = %e, "cannot open the upstream UDP socket");
                dropped("upstream_socket");
                continue;
            }
        };
        next_id += 1;
        let flow = Flow {
            id: next_id,
            upstream: Arc::clone(&upstream),
            last_seen: Arc::new(AtomicU64::new(millis(epoch))),
            stats: target.stats.clone(),
            _open: listener.series.flow(),
            logged_in: flow_log.as_ref().map(|f| Arc::clone(&f.bytes_in)),
        };
        flow.stats.flows.increment(1);
        send_upstream(&flow, datagram);
        tokio::spawn(run_flow(
            FlowTask {
                client,
                id: flow.id,
                upstream,
                downstream: Arc::clone(&socket),
                last_seen: Arc::clone(&flow.last_seen),
                stats: flow.stats.clone(),
                epoch,
                idle: settings.idle_timeout,
                log: flow_log,
            },
            cancel.child_token(),
            ended_tx.clone(),
        ));
        if let Entry::Vacant(v) = flows.entry(client) {
            v.insert(flow);
        }
        *per_source.entry(client.ip()).or_insert(0) += 1;
    }
    // The flows' `_open` guards close them in the listener's gauge as `flows` drops.
}

fn release(per_source: &mut HashMap<IpAddr, usize>, ip: IpAddr) {
    if let Entry::Occupied(mut e) = per_source.entry(ip) {
        *e.get_mut() -= 1;
        if *e.get() == 0 {
            e.remove();
        }
    }
}

/// Never waits: a full socket buffer drops the datagram, as the network would. The
/// send goes straight to the non-blocking socket: tokio's `try_send` would refuse until
/// the reactor has seen the new socket writable, losing a flow's first datagram.
fn send_upstream(flow: &Flow, datagram: &[u8]) {
    match socket2::SockRef::from(flow.upstream.as_ref()).send(datagram) {
        Ok(_) => {
            flow.stats.datagrams_in.increment(1);
            if let Some(n) = &flow.logged_in {
                n.fetch_add(datagram.len() as u64, Ordering::Relaxed);
            }
        }
        Err(e) => {
            tracing::debug!(error = %e, "UDP send to upstream failed");
            dropped("upstream_send");
        }
    }
}

fn connect_upstream(endpoint: SocketAddr) -> std::io::Result<UdpSocket> {
    let any: SocketAddr = match endpoint {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = std::net::UdpSocket::bind(any)?;
    socket.connect(endpoint)?;
    socket.set_nonblocking(true)?;
    UdpSocket::from_std(socket)
}

struct FlowTask {
    client: SocketAddr,
    id: u64,
    upstream: Arc<UdpSocket>,
    downstream: Arc<UdpSocket>,
    last_seen: Arc<AtomicU64>,
    stats: L4Stats,
    epoch: Instant,
    idle: Duration,
    log: Option<FlowLog>,
}

thread_local! {
    static SCRATCH: RefCell<Vec<u8>> = RefCell::new(vec![0u8; MAX_DATAGRAM]);
}

/// Carries the upstream's datagrams back to the client until the flow idles out.
async fn run_flow(
    f: FlowTask,
    cancel: CancellationToken,
    ended: mpsc::UnboundedSender<(SocketAddr, u64)>,
) {
    let idle_ms = u64::try_from(f.idle.as_millis()).unwrap_or(u64::MAX);
    let mut bytes_out = 0u64;
    loop {
        let quiet = millis(f.epoch).saturating_sub(f.last_seen.load(Ordering::Relaxed));
        if quiet >= idle_ms {
            break;
        }
        tokio::select! {
            () = cancel.cancelled() => break,
            () = tokio::time::sleep(Duration::from_millis(idle_ms - quiet)) => {}
            r = f.upstream.readable() => {
                if let Err(e) = r {
                    tracing::debug!(error = %e, "upstream UDP socket failed");
                    break;
                }
                // Both calls are non-blocking, so the scratch buffer is never held
                // across an await.
                SCRATCH.with_borrow_mut(|buf| match f.upstream.try_recv(buf) {
                    Ok(n) => {
                        f.last_seen.store(millis(f.epoch), Ordering::Relaxed);
                        let to = socket2::SockAddr::from(f.client);
                        match socket2::SockRef::from(f.downstream.as_ref()).send_to(&buf[..n], &to) {
                            Ok(_) => {
                                f.stats.datagrams_out.increment(1);
                                bytes_out += n as u64;
                            }
                            Err(_) => dropped("downstream_send"),
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    // E.g. ECONNREFUSED from an ICMP port unreachable: the backend may
                    // come back, so the flow lives on until it idles out.
                    Err(e) => tracing::debug!(error = %e, "upstream UDP receive failed"),
                });
            }
        }
    }
    if let Some(FlowLog {
        log,
        mut record,
        bytes_in,
    }) = f.log
    {
        record.add_bytes(bytes_in.load(Ordering::Relaxed), bytes_out);
        record.finish(log);
    }
    // The loop may be gone already (listener removed); nothing to tell it then.
    let _ = ended.send((f.client, f.id));
}
