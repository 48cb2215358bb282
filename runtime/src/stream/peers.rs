//! Who is on the other end of a streaming connection, for the per-peer cap on connections not
//! yet upgraded to a session.
//!
//! On loopback every client has the same address, so a cap per address would put kubelet and a
//! local user flooding the port in one bucket. A client on this node is told apart by the user
//! that owns its socket, which the kernel lists in `/proc/net/tcp` (or `tcp6`) beside the
//! connection's two ends; a client elsewhere is known by its address.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

/// One peer, as the cap counts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Peer {
    /// A client on this node: the uid owning its socket.
    LocalUser(u32),
    /// A client elsewhere (or one whose socket was not found).
    Address(IpAddr),
}

impl Peer {
    /// The peer of a connection from `remote` to our `local` address.
    pub fn of(remote: SocketAddr, local: SocketAddr) -> Peer {
        match local_owner(remote, local) {
            Some(uid) => Peer::LocalUser(uid),
            None => Peer::Address(remote.ip()),
        }
    }
}

/// Connections per peer, each counted by a [`Slot`] while it lives.
#[derive(Debug)]
pub struct PeerCounts {
    limit: usize,
    counts: Mutex<HashMap<Peer, usize>>,
}

/// A peer's place among the counted connections, given back on drop.
pub struct Slot {
    counts: Arc<PeerCounts>,
    peer: Peer,
}

impl PeerCounts {
    pub fn new(limit: usize) -> Arc<PeerCounts> {
        Arc::new(PeerCounts {
            limit,
            counts: Mutex::new(HashMap::new()),
        })
    }

    /// A slot for `peer`, or None if it already holds `limit`.
    pub fn take(self: &Arc<Self>, peer: Peer) -> Option<Slot> {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let n = counts.entry(peer).or_insert(0);
        if *n >= self.limit {
            return None;
        }
        *n += 1;
        Some(Slot {
            counts: Arc::clone(self),
            peer,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut counts = self.counts.counts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = counts.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.peer);
            }
        }
    }
}

/// The uid owning the client socket of a loopback connection `remote` → `local`: the kernel's
/// table line whose local end is `remote` and whose remote end is `local`.
fn local_owner(remote: SocketAddr, local: SocketAddr) -> Option<u32> {
    let table = match remote {
        SocketAddr::V4(_) => "/proc/net/tcp",
        SocketAddr::V6(_) => "/proc/net/tcp6",
    };
    owner_in(&std::fs::read_to_string(table).ok()?, remote, local)
}

fn owner_in(table: &str, remote: SocketAddr, local: SocketAddr) -> Option<u32> {
    let (want_local, want_remote) = (hex_addr(remote)?, hex_addr(local)?);
    table.lines().skip(1).find_map(|line| {
        let mut fields = line.split_whitespace();
        let _slot = fields.next()?;
        let (l, r) = (fields.next()?, fields.next()?);
        if !l.eq_ignore_ascii_case(&want_local) || !r.eq_ignore_ascii_case(&want_remote) {
            return None;
        }
        // st, tx_queue:rx_queue, tr:tm->when, retrnsmt, then uid
        fields.nth(4)?.parse().ok()
    })
}

/// `addr` as the kernel's tables print it: the address's 32-bit words in the machine's byte
/// order, then the port, all in hex.
fn hex_addr(addr: SocketAddr) -> Option<String> {
    let ip = match addr.ip() {
        IpAddr::V4(v4) => format!("{:08X}", u32::from_ne_bytes(v4.octets())),
        IpAddr::V6(v6) => v6
            .octets()
            .chunks(4)
            .map(|w| Some(format!("{:08X}", u32::from_ne_bytes(w.try_into().ok()?))))
            .collect::<Option<String>>()?,
    };
    Some(format!("{ip}:{:04X}", addr.port()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_owner_of_a_loopback_client_is_found_in_the_kernels_table() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (_server, remote) = listener.accept().unwrap();
        assert_eq!(remote, client.local_addr().unwrap());
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        let local = listener.local_addr().unwrap();
        assert_eq!(Peer::of(remote, local), Peer::LocalUser(me));
        // an address with no socket in the table is known by its address
        let stranger: SocketAddr = "127.0.0.2:9".parse().unwrap();
        assert_eq!(
            Peer::of(stranger, local),
            Peer::Address("127.0.0.2".parse().unwrap())
        );
    }

    #[test]
    fn table_lines_are_matched_on_both_ends() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   \
             0: 0100007F:9C40 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  1000        0 12345 1\n";
        let remote: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        let local: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        if cfg!(target_endian = "little") {
            assert_eq!(owner_in(table, remote, local), Some(1000));
        }
        assert_eq!(owner_in(table, local, remote), None);
    }

    #[test]
    fn slots_count_per_peer_and_come_back() {
        let counts = PeerCounts::new(2);
        let a = Peer::LocalUser(1);
        let b = Peer::LocalUser(2);
        let (s1, s2) = (counts.take(a).unwrap(), counts.take(a).unwrap());
        assert!(counts.take(a).is_none());
        assert!(counts.take(b).is_some());
        drop(s1);
        let s3 = counts.take(a);
        assert!(s3.is_some());
        drop((s2, s3));
        assert!(counts.counts.lock().unwrap().is_empty() || counts.take(a).is_some());
    }
}
