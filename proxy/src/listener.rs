//! The listener manager: binds the sockets a Snapshot asks for, keeps unchanged ones
//! (and their connections) untouched across reloads, and drains the ones that go.
//! Every TCP listener is one `SO_REUSEPORT` socket per data-plane worker
//! ([`crate::workers`]), each accepted and served on its worker's thread.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::server::graceful::GracefulShutdown;
use socket2::{Domain, Protocol as SockProtocol, Socket, Type};
use tokio::net::TcpListener;
use tokio::runtime::Handle;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::client_auth::ClientAuth;
use crate::config::ProxyConfig;
use crate::connection::Connections;
use crate::drain::Signal;
use crate::limits::{ConnectionSlots, Limits, Refusal};
use crate::resumption::Resumption;
use crate::series::ListenerSeries;
use crate::snapshot::Snapshot;
use crate::state::ProxyState;
use crate::upstream::Upstreams;
use crate::{telemetry, tls};

/// A socket the Snapshot wants but that could not be bound.
#[derive(Debug, Clone)]
pub struct BindFailure {
    pub addr: SocketAddr,
    pub reason: String,
}

/// One data-plane worker as the manager sees it: the runtime its sockets are
/// registered with and served on, and its own upstream pools.
struct Worker {
    runtime: Handle,
    upstreams: Arc<Upstreams>,
}

struct Running {
    cancel: CancellationToken,
    /// A TCP listener's accept loop on every worker, or a UDP socket's one task.
    tasks: Vec<JoinHandle<()>>,
    /// TCP: the TLS sessions of the address, and the client validation they were made
    /// under.
    tls: Option<SocketTls>,
}

struct SocketTls {
    resumption: Arc<Resumption>,
    client_auth: Option<Arc<ClientAuth>>,
}

pub struct ListenerManager {
    state: Arc<ProxyState>,
    drain_timeout: Duration,
    limits: Arc<Limits>,
    /// Connection slots shared by every listener.
    total_slots: Arc<Semaphore>,
    workers: Vec<Worker>,
    /// The worker the next UDP socket goes to. A UDP socket is one flow table (its
    /// per-listener and per-source limits count every flow), so it is served by one
    /// worker, and UDP listeners are dealt out over the workers in turn.
    next_udp: usize,
    running: HashMap<SocketAddr, Running>,
    /// UDP sockets, apart: a UDP and a TCP listener may share an address.
    running_udp: HashMap<SocketAddr, Running>,
    /// Sockets whose last bind failed, and why: a failure is logged when it starts or
    /// its reason changes, not on every retry.
    failing: HashMap<(Transport, SocketAddr), String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Transport {
    Tcp,
    Udp,
}

const BACKLOG: i32 = 1024;

impl ListenerManager {
    /// `workers` are the data-plane runtimes ([`crate::workers`]): every TCP listener
    /// gets a socket on each, and each gets its own upstream pools. Empty: the runtime
    /// this is called on is the only worker (it must be called on one then). Takes the
    /// limits and the drain timeout of `config`.
    pub fn new(state: Arc<ProxyState>, workers: &[Handle], config: &ProxyConfig) -> Self {
        let limits = config.limits.clone();
        let runtimes = if workers.is_empty() {
            vec![Handle::current()]
        } else {
            workers.to_vec()
        };
        let workers = runtimes
            .into_iter()
            .map(|runtime| {
                // The pools' idle reaper runs on the runtime current at creation.
                let upstreams = {
                    let _entered = runtime.enter();
                    Arc::new(state.worker_upstreams())
                };
                Worker { runtime, upstreams }
            })
            .collect();
        Self {
            state,
            drain_timeout: config.drain_timeout,
            total_slots: Arc::new(Semaphore::new(limits.max_connections)),
            limits: Arc::new(limits),
            workers,
            next_udp: 0,
            running: HashMap::new(),
            running_udp: HashMap::new(),
            failing: HashMap::new(),
        }
    }

    /// Publishes `snapshot` and brings the bound sockets in line with it. New requests
    /// see the new routes at once; removed sockets stop accepting and drain in the
    /// background. Sockets that could not be bound are returned and retried on the
    /// next call.
    pub fn apply(&mut self, snapshot: Arc<Snapshot>) -> Vec<BindFailure> {
        // rustls resumes a session without asking the verifier again: a listener whose
        // client validation changes forgets its sessions. Before the swap, so nothing
        // made under the old validation resumes under the new; after it too, for
        // sessions made by handshakes still running under the old one meanwhile.
        let revalidate = self.validation_changed(&snapshot);
        for r in &revalidate {
            r.invalidate();
        }
        self.state.snapshot.store(Arc::clone(&snapshot));
        for r in &revalidate {
            r.invalidate();
        }
        let gone: Vec<SocketAddr> = self
            .running
            .keys()
            .filter(|a| !snapshot.listeners.contains_key(a))
            .copied()
            .collect();
        for addr in gone {
            if let Some(r) = self.running.remove(&addr) {
                tracing::info!(%addr, "listener removed; draining");
                r.cancel.cancel();
            }
        }
        // A socket the Snapshot stopped asking for starts over: if it comes back and
        // fails, that is news.
        self.failing.retain(|(transport, addr), _| match transport {
            Transport::Tcp => snapshot.listeners.contains_key(addr),
            Transport::Udp => snapshot.udp.contains_key(addr),
        });
        let mut failures = Vec::new();
        for addr in snapshot.listeners.keys() {
            if self.running.contains_key(addr) {
                continue;
            }
            match self.start_tcp(*addr, &snapshot) {
                Ok(running) => {
                    let retried = self.failing.remove(&(Transport::Tcp, *addr)).is_some();
                    tracing::info!(%addr, retried, workers = running.tasks.len(), "listener bound");
                    self.running.insert(*addr, running);
                }
                Err(e) => failures.push(self.bind_failed(Transport::Tcp, *addr, &e)),
            }
        }
        self.apply_udp(&snapshot, &mut failures);
        failures
    }

    /// The session stores of running sockets whose listener's client validation is
    /// not the one their sessions were made under (added, removed or replaced).
    fn validation_changed(&mut self, snapshot: &Snapshot) -> Vec<Arc<Resumption>> {
        let mut changed = Vec::new();
        for (addr, running) in &mut self.running {
            let Some(tls) = running.tls.as_mut() else {
                continue;
            };
            let now = snapshot.listener(addr).and_then(|l| l.client_auth.clone());
            let same = match (&tls.client_auth, &now) {
                (None, None) => true,
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                _ => false,
            };
            if !same {
                tls.client_auth = now;
                changed.push(Arc::clone(&tls.resumption));
            }
        }
        changed
    }

    /// Binds one `SO_REUSEPORT` socket per worker at `addr` and starts each worker's
    /// accept loop on it; the kernel spreads new connections over them.
    fn start_tcp(&self, addr: SocketAddr, snapshot: &Snapshot) -> std::io::Result<Running> {
        // All bound before any serves: a bind failing part-way leaves nothing behind.
        let mut sockets = Vec::with_capacity(self.workers.len());
        for worker in &self.workers {
            // Registered with the worker's reactor, which is the thread that polls it.
            let _entered = worker.runtime.enter();
            sockets.push(bind(addr)?);
        }
        // One limit per listener, whichever worker accepted the connection.
        let slots = ConnectionSlots::new(
            Arc::clone(&self.total_slots),
            self.limits.max_connections_per_listener,
        );
        let resumption = Resumption::new().map_err(std::io::Error::other)?;
        let cancel = CancellationToken::new();
        let tasks = self
            .workers
            .iter()
            .zip(sockets)
            .map(|(worker, listener)| {
                worker.runtime.spawn(serve(
                    listener,
                    SocketPlan {
                        local: addr,
                        state: Arc::clone(&self.state),
                        upstreams: Arc::clone(&worker.upstreams),
                        limits: Arc::clone(&self.limits),
                        slots: slots.clone(),
                        resumption: Arc::clone(&resumption),
                    },
                    cancel.clone(),
                    self.drain_timeout,
                ))
            })
            .collect();
        let client_auth = snapshot.listener(&addr).and_then(|l| l.client_auth.clone());
        Ok(Running {
            cancel,
            tasks,
            tls: Some(SocketTls {
                resumption,
                client_auth,
            }),
        })
    }

    /// Brings the UDP sockets in line with `snapshot`, like the TCP ones.
    fn apply_udp(&mut self, snapshot: &Snapshot, failures: &mut Vec<BindFailure>) {
        self.running_udp.retain(|addr, r| {
            let keep = snapshot.udp.contains_key(addr);
            if !keep {
                tracing::info!(%addr, "UDP listener removed");
                r.cancel.cancel();
            }
            keep
        });
        for addr in snapshot.udp.keys() {
            if self.running_udp.contains_key(addr) {
                continue;
            }
            let runtime = self.workers[self.next_udp % self.workers.len()]
                .runtime
                .clone();
            let bound = {
                let _entered = runtime.enter();
                std::net::UdpSocket::bind(addr)
                    .and_then(|s| s.set_nonblocking(true).map(|()| s))
                    .and_then(tokio::net::UdpSocket::from_std)
            };
            match bound {
                Ok(socket) => {
                    self.next_udp = self.next_udp.wrapping_add(1);
                    let retried = self.failing.remove(&(Transport::Udp, *addr)).is_some();
                    tracing::info!(%addr, retried, "UDP listener bound");
                    let cancel = CancellationToken::new();
                    let task = runtime.spawn(crate::l4::udp::serve(
                        socket,
                        *addr,
                        Arc::clone(&self.state),
                        self.limits.udp,
                        cancel.clone(),
                    ));
                    self.running_udp.insert(
                        *addr,
                        Running {
                            cancel,
                            tasks: vec![task],
                            tls: None,
                        },
                    );
                }
                Err(e) => failures.push(self.bind_failed(Transport::Udp, *addr, &e)),
            }
        }
    }

    /// Counts a failed bind, and logs it if it is new or failed differently than last
    /// time: a port held for hours must not log on every retry.
    fn bind_failed(
        &mut self,
        transport: Transport,
        addr: SocketAddr,
        e: &std::io::Error,
    ) -> BindFailure {
        metrics::counter!(telemetry::LISTENER_BIND_ERRORS_TOTAL).increment(1);
        let reason = e.to_string();
        let kind = match transport {
            Transport::Tcp => "TCP",
            Transport::Udp => "UDP",
        };
        if self.failing.get(&(transport, addr)) == Some(&reason) {
            tracing::debug!(%addr, error = %e, kind, "listener still cannot bind");
        } else {
            tracing::error!(%addr, error = %e, kind, "cannot bind listener; retrying with backoff");
            self.failing.insert((transport, addr), reason.clone());
        }
        BindFailure { addr, reason }
    }

    /// The addresses currently bound.
    pub fn bound(&self) -> Vec<SocketAddr> {
        let mut v: Vec<_> = self.running.keys().copied().collect();
        v.sort();
        v
    }

    /// Stops accepting everywhere and waits until in-flight requests finish or each
    /// listener's drain deadline passes.
    pub async fn shutdown(&mut self) {
        for r in self.running.values() {
            r.cancel.cancel();
        }
        for r in self.running_udp.values() {
            r.cancel.cancel();
        }
        for (addr, r) in self.running.drain().chain(self.running_udp.drain()) {
            for task in r.tasks {
                if let Err(e) = task.await {
                    tracing::warn!(%addr, error = %e, "listener task ended abnormally");
                }
            }
        }
    }
}

/// How long the deadline waits for cut connections' tasks to finish.
const FORCE_CLOSE_GRACE: Duration = Duration::from_secs(1);

fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = Socket::new(
        Domain::for_address(addr),
        Type::STREAM,
        Some(SockProtocol::TCP),
    )?;
    // Lets a restarted edge rebind while old connections sit in TIME_WAIT.
    socket.set_reuse_address(true)?;
    // Gives every worker of this process a socket of its own on the same address,
    // and lets a new edge process bind the same listeners while the old one drains (a
    // hitless restart or upgrade on one host): the kernel spreads new connections over
    // all of them until the old one closes its sockets. Only sockets of the same user that
    // also ask for it can join, so a foreign process on the port still makes the bind
    // fail (and be reported).
    #[cfg(unix)]
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    TcpListener::from_std(socket.into())
}

/// What the accept loop of one socket works with.
struct SocketPlan {
    local: SocketAddr,
    state: Arc<ProxyState>,
    /// The pools of the worker the socket belongs to.
    upstreams: Arc<Upstreams>,
    limits: Arc<Limits>,
    slots: ConnectionSlots,
    /// TLS sessions, shared by every worker's socket at this address.
    resumption: Arc<Resumption>,
}

async fn serve(
    listener: TcpListener,
    socket: SocketPlan,
    cancel: CancellationToken,
    drain_timeout: Duration,
) {
    let SocketPlan {
        local,
        state,
        upstreams,
        limits,
        slots,
        resumption,
    } = socket;
    // Connections accepted while the Snapshot no longer has this socket (between the
    // reload that removed its listener and the socket's close) count under "none"; the
    // cell is looked up once and kept only as long as the socket.
    let mut orphan: Option<Arc<ListenerSeries>> = None;
    let graceful = GracefulShutdown::new();
    let connections = Arc::new(Connections {
        state: Arc::clone(&state),
        upstreams,
        local,
        builder: limits.server_builder(),
        builder_h2: limits.server_builder().http2_only(),
        tls: tls::Handshakes::new(Arc::clone(&state), local, resumption),
        force_close: Signal::new(),
        draining: Signal::new(),
        header_read_timeout: limits.header_read_timeout,
        max_header_bytes: limits.max_header_bytes,
        max_headers: limits.max_headers,
        tasks: TaskTracker::new(),
    });
    loop {
        let (stream, peer) = tokio::select! {
            () = cancel.cancelled() => break,
            r = listener.accept() => match r {
                Ok(pair) => pair,
                Err(e) => {
                    // Typically EMFILE: back off instead of spinning on the error.
                    tracing::warn!(%local, error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        if state.shedding.load(std::sync::atomic::Ordering::Relaxed) {
            metrics::counter!(telemetry::OVERLOAD_SHED_TOTAL, "what" => "connection").increment(1);
            drop(stream);
            continue;
        }
        let slot = match slots.try_take() {
            Ok(slot) => slot,
            Err(why) => {
                // Refusing at accept keeps a flood from costing more than a close.
                let reason = match why {
                    Refusal::ListenerFull => "listener_full",
                    Refusal::ProcessFull => "process_full",
                };
                metrics::counter!(telemetry::CONNECTIONS_REFUSED_TOTAL, "reason" => reason)
                    .increment(1);
                tracing::debug!(%local, %peer, reason, "connection refused");
                drop(stream);
                continue;
            }
        };
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "set_nodelay failed");
        }
        // The connection's one Snapshot load (a TLS handshake makes one more, at its
        // ClientHello; a request, one of its own).
        let serving = state.snapshot.load().listeners.get(&local).cloned();
        // Counted in the cell of the listener the Snapshot has now (a reload may have
        // folded another listener into this socket): atomics, no label lookup.
        let open = match &serving {
            Some(l) => l.series.accepted(),
            None => orphan
                .get_or_insert_with(|| crate::series::listener(&Arc::from("none"), &[], false))
                .accepted(),
        };
        connections.spawn(stream, peer, serving, graceful.watcher(), slot, open);
    }
    drop(listener);
    connections.draining.fire();
    tokio::select! {
        () = graceful.shutdown() => tracing::debug!(%local, "listener drained"),
        () = tokio::time::sleep(drain_timeout) => {
            tracing::warn!(%local, "drain deadline passed; closing remaining connections");
            connections.force_close.fire();
            connections.tasks.close();
            // Every task drops its connection as soon as it sees the token; the bound
            // only guards against a task stuck outside any await of it.
            if tokio::time::timeout(FORCE_CLOSE_GRACE, connections.tasks.wait()).await.is_err() {
                tracing::warn!(%local, "connections still open after the force-close grace");
            }
        }
    }
}
