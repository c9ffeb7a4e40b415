//! Who may hold one of the front's connections. A connection is *pending*
//! until one of its requests presents a valid token: pending connections
//! are what a client without a token can make, so they are capped per peer
//! and give way (the oldest first) to new connections, and each lives at
//! most [`PENDING_LIFETIME`] (TLS handshake included). A connection whose
//! token was accepted is never closed to make room; it is bounded by the
//! per-token request limits and by hyper's header timeout between requests.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

/// All connections at once.
pub const MAX_CONNECTIONS: usize = 512;
/// Connections from one peer (an IPv4 address, an IPv6 /64, a Unix uid).
pub const MAX_PER_PEER: usize = 256;
/// Pending connections from one peer: enough for a burst of new
/// connections of a client host running several tokens' requests at once
/// (32 each by default), few enough that a dozen hosts are needed to fill
/// the front with connections that present no token.
pub const MAX_PENDING_PER_PEER: usize = 128;
/// How long a connection may stay pending after it is accepted.
pub const PENDING_LIFETIME: Duration = Duration::from_secs(10);
/// At most one warning about the door per this long.
const REPORT_EVERY: Duration = Duration::from_secs(10);

/// The peer a connection counts against: an IPv4 address (IPv4-mapped IPv6
/// included), an IPv6 /64 (one host's usual allocation), or the `unix:uid`
/// of a Unix client.
pub fn peer_of(addr: &SocketAddr) -> String {
    match addr.ip() {
        IpAddr::V4(a) => a.to_string(),
        IpAddr::V6(a) => match a.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None if a.is_loopback() => a.to_string(),
            None => {
                let s = a.segments();
                format!("{:x}:{:x}:{:x}:{:x}::/64", s[0], s[1], s[2], s[3])
            }
        },
    }
}

struct Entry {
    peer: String,
    authenticated: Arc<AtomicBool>,
    close: CancellationToken,
}

impl Entry {
    fn pending(&self) -> bool {
        !self.authenticated.load(Ordering::Acquire)
    }
}

#[derive(Default)]
struct Inner {
    next: u64,
    /// By admission order: the first pending one is the oldest.
    open: BTreeMap<u64, Entry>,
    closed_for_room: u64,
    refused: u64,
    last_report: Option<Instant>,
}

/// A connection let in: its number, the flag its requests set once a token
/// is accepted, and what closes it to make room.
pub struct Admitted {
    pub id: u64,
    pub authenticated: Arc<AtomicBool>,
    pub close: CancellationToken,
}

#[derive(Default)]
pub struct Door {
    inner: Mutex<Inner>,
}

impl Door {
    /// Let a new connection from `peer` in, closing the oldest pending
    /// connection (of that peer when the peer is at its cap, of anyone when
    /// all places are taken) to make room; `None` when there is none to
    /// close (every place is held by connections with a valid token).
    pub fn admit(&self, peer: &str) -> Option<Admitted> {
        let mut d = self.inner.lock().ok()?;
        let (mut of_peer, mut pending_of_peer) = (0, 0);
        for e in d.open.values().filter(|e| e.peer == peer) {
            of_peer += 1;
            pending_of_peer += usize::from(e.pending());
        }
        let oldest_pending = |d: &Inner, same_peer: bool| {
            d.open.iter().find(|(_, e)| e.pending() && (!same_peer || e.peer == peer)).map(|(k, _)| *k)
        };
        if pending_of_peer >= MAX_PENDING_PER_PEER || of_peer >= MAX_PER_PEER {
            match oldest_pending(&d, true) {
                Some(k) => d.close_for_room(k),
                None => {
                    d.refused += 1;
                    return None;
                }
            }
        }
        if d.open.len() >= MAX_CONNECTIONS {
            match oldest_pending(&d, false) {
                Some(k) => d.close_for_room(k),
                None => {
                    d.refused += 1;
                    return None;
                }
            }
        }
        let id = d.next;
        d.next += 1;
        let admitted = Admitted { id, authenticated: Arc::default(), close: CancellationToken::new() };
        d.open.insert(
            id,
            Entry {
                peer: peer.to_owned(),
                authenticated: admitted.authenticated.clone(),
                close: admitted.close.clone(),
            },
        );
        Some(admitted)
    }

    /// The connection `id` has ended.
    pub fn left(&self, id: u64) {
        if let Ok(mut d) = self.inner.lock() {
            d.open.remove(&id);
        }
    }

    /// Log what the door did since the last report, at most once per
    /// [`REPORT_EVERY`] (a flood of connections is one line, not one per
    /// connection).
    pub fn report(&self) {
        let Ok(mut d) = self.inner.lock() else { return };
        if d.closed_for_room == 0 && d.refused == 0 {
            return;
        }
        if d.last_report.is_some_and(|t| t.elapsed() < REPORT_EVERY) {
            return;
        }
        tracing::warn!(
            closed = d.closed_for_room,
            refused = d.refused,
            open = d.open.len(),
            "serve-http: too many connections: {} without a valid token closed to make room, {} refused",
            d.closed_for_room,
            d.refused
        );
        d.closed_for_room = 0;
        d.refused = 0;
        d.last_report = Some(Instant::now());
    }

    #[cfg(test)]
    fn open(&self) -> usize {
        self.inner.lock().map(|d| d.open.len()).unwrap_or(0)
    }
}

impl Inner {
    fn close_for_room(&mut self, k: u64) {
        if let Some(e) = self.open.remove(&k) {
            e.close.cancel();
            self.closed_for_room += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn peers_are_addresses_v6_prefixes_and_v4_mapped() {
        let p = |s: &str| peer_of(&s.parse().unwrap());
        assert_eq!(p("192.0.2.7:443"), "192.0.2.7");
        assert_eq!(p("[::ffff:192.0.2.7]:443"), "192.0.2.7");
        assert_eq!(p("[2001:db8:1:2:3:4:5:6]:1"), "2001:db8:1:2::/64");
        assert_eq!(p("[2001:db8:1:2:ff::1]:2"), "2001:db8:1:2::/64");
        assert_eq!(p("[::1]:1"), "::1");
    }

    #[test]
    fn pending_connections_make_room_and_authenticated_ones_stay() {
        let door = Door::default();
        // One peer: at its pending cap, each new one closes its oldest.
        let first: Vec<Admitted> = (0..MAX_PENDING_PER_PEER).map(|_| door.admit("a").unwrap()).collect();
        let next = door.admit("a").unwrap();
        assert!(first[0].close.is_cancelled() && !first[1].close.is_cancelled());
        assert_eq!(door.open(), MAX_PENDING_PER_PEER);
        // Authenticated connections are not closed for room; a peer whose
        // every place is authenticated gets no more.
        first[1..].iter().chain([&next]).for_each(|c| c.authenticated.store(true, Ordering::Release));
        let mut authed = Vec::new();
        while door.open() < MAX_PER_PEER {
            let c = door.admit("a").unwrap();
            c.authenticated.store(true, Ordering::Release);
            authed.push(c);
        }
        assert!(door.admit("a").is_none(), "peer a holds all its places with a token");
        // Every place taken: others' pending connections give way, oldest first.
        let mut others = Vec::new();
        for i in 0.. {
            if door.open() >= MAX_CONNECTIONS {
                break;
            }
            others.push(door.admit(&format!("peer-{}", i % 8)).unwrap());
        }
        let newcomer = door.admit("b").unwrap();
        assert!(others[0].close.is_cancelled() && !others[1].close.is_cancelled());
        assert!(!newcomer.close.is_cancelled());
        assert!(authed.iter().all(|c| !c.close.is_cancelled()));
        // A connection that ended frees its place.
        door.left(newcomer.id);
        assert_eq!(door.open(), MAX_CONNECTIONS - 1);
    }
}
