//! The data plane's runtimes, one per core, like nginx's worker processes.
//!
//! Each worker is a single-threaded (`current_thread`) tokio runtime on an OS thread of
//! its own. The listener manager gives every worker its own `SO_REUSEPORT` socket for
//! each listener, so the kernel spreads new connections over the workers, and a
//! connection then lives on one thread for its whole life: its upstream connections are
//! the worker's own (no lock contention, no cross-thread wake-ups), and its I/O is
//! registered with the same reactor that runs its task. A work-stealing runtime would
//! instead move tasks between threads and share one pool, which is the per-request
//! hand-off cost this design removes.
//!
//! The control plane (watchers, reconcile, status writes, admin, metrics) runs on a
//! runtime of its own, so a slow API server or a large reconcile never holds a thread
//! that serves traffic.

use std::num::NonZeroUsize;
use std::thread::JoinHandle;

use tokio::runtime::{Builder, Handle};
use tokio::sync::oneshot;

/// Why the workers could not be started.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("cannot build the runtime of worker {index}: {source}")]
    Runtime {
        index: usize,
        source: std::io::Error,
    },
    #[error("cannot start the thread of worker {index}: {source}")]
    Thread {
        index: usize,
        source: std::io::Error,
    },
}

/// The data-plane workers. Dropping this stops them and waits for their threads: drop
/// it outside any async context, after the listeners have drained.
pub struct Workers {
    handles: Vec<Handle>,
    /// Dropping a sender ends its worker's `block_on`, which drops its runtime.
    stops: Vec<oneshot::Sender<()>>,
    threads: Vec<JoinHandle<()>>,
}

impl Workers {
    /// Starts `count` workers, each a `current_thread` runtime on its own thread.
    pub fn spawn(count: NonZeroUsize) -> Result<Self, WorkerError> {
        let mut workers = Self {
            handles: Vec::with_capacity(count.get()),
            stops: Vec::with_capacity(count.get()),
            threads: Vec::with_capacity(count.get()),
        };
        for index in 0..count.get() {
            let runtime = Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|source| WorkerError::Runtime { index, source })?;
            let (stop, stopped) = oneshot::channel::<()>();
            let handle = runtime.handle().clone();
            let thread = std::thread::Builder::new()
                .name(format!("aether-worker-{index}"))
                .spawn(move || {
                    // A current_thread runtime runs its tasks only inside block_on:
                    // this thread is the worker. The result is only "sender dropped".
                    let _ = runtime.block_on(stopped);
                })
                .map_err(|source| WorkerError::Thread { index, source })?;
            workers.handles.push(handle);
            workers.stops.push(stop);
            workers.threads.push(thread);
        }
        Ok(workers)
    }

    /// The workers' runtimes, to spawn on (and register sockets with).
    pub fn handles(&self) -> &[Handle] {
        &self.handles
    }

    /// The worker count a process gets by default: the CPUs it may run on (affinity
    /// and cgroup quota included), or one if that cannot be told.
    pub fn default_count() -> NonZeroUsize {
        std::thread::available_parallelism().unwrap_or(NonZeroUsize::MIN)
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.stops.clear();
        for thread in self.threads.drain(..) {
            if thread.join().is_err() {
                tracing::warn!("a worker thread panicked while stopping");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_worker_runs_its_tasks_on_its_own_thread() {
        let Some(count) = NonZeroUsize::new(3) else {
            return;
        };
        let workers = Workers::spawn(count).unwrap_or_else(|e| panic!("{e}"));
        let mut names = Vec::new();
        for handle in workers.handles() {
            let (tx, rx) = std::sync::mpsc::channel();
            handle.spawn(async move {
                let _ = tx.send(std::thread::current().name().map(str::to_owned));
            });
            names.push(rx.recv().unwrap_or_else(|e| panic!("{e}")));
        }
        assert_eq!(
            names,
            ["aether-worker-0", "aether-worker-1", "aether-worker-2"].map(|n| Some(n.to_owned()))
        );
        drop(workers);
    }
}
