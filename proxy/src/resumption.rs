//! TLS session resumption for one listener address, shared by its workers' sockets.
//!
//! A client that comes back resumes its session (a ticket, or a session ID for TLS 1.2
//! clients without tickets) instead of a full handshake with a certificate signature.
//! With `--workers`, the kernel may hand the next connection to any worker's socket, so
//! the session store and the ticket keys belong to the listener address, not a socket.
//!
//! rustls resumes a session without asking the client-certificate verifier again (it
//! checks the suite and the server name only). A session made before the listener
//! started requiring client certificates, or before its CA changed, must not resume
//! after: every session and ticket is tagged with an epoch, and the listener manager
//! bumps it when the listener's client validation changes, which makes every earlier
//! session a miss (a full handshake, verified). The check is one atomic load.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rustls::crypto::ring::Ticketer;
use rustls::server::{ProducesTickets, ServerSessionMemoryCache, StoresServerSessions};

/// Sessions kept per listener address for clients without tickets (TLS 1.2 IDs).
const SESSION_CACHE: usize = 1024;

/// Bytes of epoch in front of every ticket and session key.
const TAG: usize = 8;

#[derive(Debug)]
pub struct Resumption {
    epoch: AtomicU64,
    sessions: Arc<ServerSessionMemoryCache>,
    tickets: Arc<dyn ProducesTickets>,
}

impl Resumption {
    /// A store and fresh ticket keys (rotated by rustls while they live).
    pub fn new() -> Result<Arc<Self>, rustls::Error> {
        Ok(Arc::new(Self {
            epoch: AtomicU64::new(0),
            sessions: ServerSessionMemoryCache::new(SESSION_CACHE),
            tickets: Ticketer::new()?,
        }))
    }

    /// Makes every session issued so far unresumable.
    pub fn invalidate(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
    }

    fn tag(&self) -> [u8; TAG] {
        self.epoch.load(Ordering::Acquire).to_be_bytes()
    }

    fn tagged(&self, key: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(TAG + key.len());
        out.extend_from_slice(&self.tag());
        out.extend_from_slice(key);
        out
    }

    /// The pieces a `ServerConfig` takes.
    pub(crate) fn store(self: &Arc<Self>) -> Arc<dyn StoresServerSessions> {
        Arc::new(Sessions(Arc::clone(self)))
    }

    pub(crate) fn ticketer(self: &Arc<Self>) -> Arc<dyn ProducesTickets> {
        Arc::new(Tickets(Arc::clone(self)))
    }
}

#[derive(Debug)]
struct Sessions(Arc<Resumption>);

impl StoresServerSessions for Sessions {
    fn put(&self, key: Vec<u8>, value: Vec<u8>) -> bool {
        self.0.sessions.put(self.0.tagged(&key), value)
    }

    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.0.sessions.get(&self.0.tagged(key))
    }

    fn take(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.0.sessions.take(&self.0.tagged(key))
    }

    fn can_cache(&self) -> bool {
        true
    }
}

#[derive(Debug)]
struct Tickets(Arc<Resumption>);

impl ProducesTickets for Tickets {
    fn enabled(&self) -> bool {
        self.0.tickets.enabled()
    }

    fn lifetime(&self) -> u32 {
        self.0.tickets.lifetime()
    }

    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        let sealed = self.0.tickets.encrypt(plain)?;
        let mut out = Vec::with_capacity(TAG + sealed.len());
        out.extend_from_slice(&self.0.tag());
        out.extend_from_slice(&sealed);
        Some(out)
    }

    /// `cipher` is what a client sent: anything short or from another epoch is a miss.
    fn decrypt(&self, cipher: &[u8]) -> Option<Vec<u8>> {
        let (tag, sealed) = cipher.split_at_checked(TAG)?;
        if tag != self.0.tag() {
            return None;
        }
        self.0.tickets.decrypt(sealed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_invalidated_epoch_misses_tickets_and_sessions_issued_before() {
        let r = Resumption::new().unwrap_or_else(|e| panic!("{e}"));
        let (store, tickets) = (r.store(), r.ticketer());
        let ticket = tickets
            .encrypt(b"state")
            .unwrap_or_else(|| panic!("no ticket"));
        assert!(store.put(b"id".to_vec(), b"session".to_vec()));
        assert_eq!(tickets.decrypt(&ticket).as_deref(), Some(&b"state"[..]));
        assert_eq!(store.get(b"id").as_deref(), Some(&b"session"[..]));
        assert_eq!(tickets.decrypt(b"short"), None);

        r.invalidate();
        assert_eq!(tickets.decrypt(&ticket), None);
        assert_eq!(store.get(b"id"), None);
        let fresh = tickets
            .encrypt(b"again")
            .unwrap_or_else(|| panic!("no ticket"));
        assert_eq!(tickets.decrypt(&fresh).as_deref(), Some(&b"again"[..]));
    }
}
