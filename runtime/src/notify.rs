//! systemd's service notification protocol (sd_notify(3)): datagrams of `KEY=VALUE` lines to
//! the unix socket named by `$NOTIFY_SOCKET` (a path, or `@name` for an abstract socket). With
//! `Type=notify` in crius's unit, systemd counts crius as started on `READY=1` (sent once the
//! CRI socket accepts calls) and sees an orderly stop begin on `STOPPING=1`. Around the
//! re-read of the configuration on SIGHUP crius sends `RELOADING=1` and `READY=1` again, so
//! `systemctl status` shows the reload, and a unit with `Type=notify-reload` (systemd 253 and
//! later) would work as well.
//!
//! [`take_socket`] reads the variable once at start and removes it from the environment, so
//! the processes crius starts (shims, CNI plugins) never talk to systemd as crius.

use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::OnceLock;

static SOCKET: OnceLock<Option<String>> = OnceLock::new();

/// Read and unset `$NOTIFY_SOCKET`. Call at the very start of `main`, before any thread
/// exists (changing the environment races with threads reading it).
pub fn take_socket() {
    let value = std::env::var("NOTIFY_SOCKET")
        .ok()
        .filter(|v| !v.is_empty());
    if value.is_some() {
        std::env::remove_var("NOTIFY_SOCKET");
    }
    let _ = SOCKET.set(value);
}

/// Send `state` (newline-separated assignments, e.g. `READY=1`) to systemd. Without a
/// notification socket nothing is sent; a failure is logged, never fatal: the service works
/// without its manager hearing of it.
pub fn notify(state: &str) {
    let Some(Some(path)) = SOCKET.get() else {
        return;
    };
    if let Err(e) = send(path, state) {
        tracing::warn!(socket = %path, "notify systemd ({state:?}): {e}");
    }
}

/// Tell systemd a reload has begun. `MONOTONIC_USEC` (CLOCK_MONOTONIC in microseconds) is
/// what systemd 253 and later require with `RELOADING=1` to tell this reload from an older
/// one; earlier versions ignore it. Follow with `READY=1` once the reload is done.
pub fn reloading() {
    notify(&format!(
        "RELOADING=1\nMONOTONIC_USEC={}\nSTATUS=re-reading the configuration",
        monotonic_usec()
    ));
}

fn monotonic_usec() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the struct we own; CLOCK_MONOTONIC
    // always exists on Linux, so it cannot fail.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64) * 1_000_000 + (ts.tv_nsec as u64) / 1_000
}

fn send(path: &str, state: &str) -> io::Result<()> {
    let addr = match path.strip_prefix('@') {
        Some(name) => SocketAddr::from_abstract_name(name.as_bytes())?,
        None => SocketAddr::from_pathname(path)?,
    };
    let socket = UnixDatagram::unbound()?;
    socket.send_to_addr(state.as_bytes(), &addr)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sends_to_a_path_and_to_an_abstract_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let receiver = UnixDatagram::bind(&path).unwrap();
        send(path.to_str().unwrap(), "READY=1").unwrap();
        let mut buf = [0u8; 64];
        let n = receiver.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");

        let name = format!("crius-notify-test-{}", std::process::id());
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let receiver = UnixDatagram::bind_addr(&addr).unwrap();
        send(&format!("@{name}"), "STOPPING=1").unwrap();
        let n = receiver.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1");
    }

    #[test]
    fn monotonic_usec_is_the_monotonic_clock() {
        // /proc/uptime counts CLOCK_BOOTTIME, which is never behind CLOCK_MONOTONIC.
        let uptime: f64 = std::fs::read_to_string("/proc/uptime")
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap();
        let usec = monotonic_usec();
        assert!(
            usec > 0 && usec as f64 <= (uptime + 1.0) * 1e6,
            "{usec} vs {uptime} s"
        );
        assert!(monotonic_usec() >= usec);
    }
}
