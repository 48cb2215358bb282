//! The systemd manager, as the systemd driver uses it: start transient units, change their
//! properties, stop them, over the manager's private D-Bus socket ([`super::dbus`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::dbus::{self, Arg, Connection, DbusError, Value};
use super::{CgroupError, Result};

const MANAGER_PATH: &str = "/org/freedesktop/systemd1";
const MANAGER: &str = "org.freedesktop.systemd1.Manager";

/// How long one call (and a unit's start job) may take before crius gives up on systemd.
const TIMEOUT: Duration = Duration::from_secs(10);

/// A reachable systemd manager and where its cgroup tree starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Systemd {
    socket: PathBuf,
    /// systemd's root cgroup, `""` when it owns the whole hierarchy (PID 1 on the host);
    /// a user manager or a systemd in a container without a cgroup namespace has its own
    /// cgroup here, and every unit's cgroup is below it.
    root: String,
}

impl Systemd {
    /// Connects to the manager at `socket` and asks for its root cgroup (the `ControlGroup`
    /// of `-.slice`): both prove that systemd answers.
    pub fn connect(socket: &Path) -> Result<Systemd> {
        let unreachable = |source| CgroupError::SystemdUnreachable {
            socket: socket.to_path_buf(),
            source,
        };
        let mut c = Connection::open(socket, TIMEOUT).map_err(unreachable)?;
        let reply = c
            .call(
                &dbus::unit_object_path("-.slice"),
                "org.freedesktop.DBus.Properties",
                "Get",
                &[
                    Arg::Str("org.freedesktop.systemd1.Slice"),
                    Arg::Str("ControlGroup"),
                ],
            )
            .map_err(unreachable)?;
        let root = match reply.variant().map_err(unreachable)? {
            Value::Str(s) => s.trim_end_matches('/').to_string(),
            _ => String::new(),
        };
        Ok(Systemd {
            socket: socket.to_path_buf(),
            root,
        })
    }

    /// A handle for tests: nothing is contacted until a unit call.
    #[cfg(test)]
    pub fn with_root(socket: &Path, root: &str) -> Systemd {
        Systemd {
            socket: socket.to_path_buf(),
            root: root.trim_end_matches('/').to_string(),
        }
    }

    /// systemd's root cgroup (`""` for the hierarchy's root).
    pub fn root(&self) -> &str {
        &self.root
    }

    fn connection(&self) -> Result<Connection> {
        Connection::open(&self.socket, TIMEOUT).map_err(|source| CgroupError::SystemdUnreachable {
            socket: self.socket.clone(),
            source,
        })
    }

    /// `StartTransientUnit` of `unit` with `props`, and waits for its start job to finish.
    /// A unit that exists already is an error unless `exists_ok` (a pod slice made by an
    /// earlier, interrupted attempt).
    pub fn start_transient(
        &self,
        unit: &str,
        props: &[(String, Value)],
        exists_ok: bool,
    ) -> Result<()> {
        let mut c = self.connection()?;
        let reply = c.call(
            MANAGER_PATH,
            MANAGER,
            "StartTransientUnit",
            &[
                Arg::Str(unit),
                Arg::Str("replace"),
                Arg::Properties(props),
                Arg::NoAuxUnits,
            ],
        );
        let job = match reply {
            Ok(r) => r.first_str().ok_or_else(|| {
                unit_err(unit, DbusError::Malformed("StartTransientUnit gave no job"))
            })?,
            Err(DbusError::Call { name, .. }) if exists_ok && name == dbus::UNIT_EXISTS => {
                return Ok(())
            }
            Err(e) => return Err(unit_err(unit, e)),
        };
        let result = c.wait_job(&job).map_err(|e| unit_err(unit, e))?;
        if result != "done" {
            return Err(CgroupError::UnitStart {
                unit: unit.to_string(),
                result,
            });
        }
        Ok(())
    }

    /// `SetUnitProperties` for the unit's runtime (for a transient unit they go with it).
    pub fn set_properties(&self, unit: &str, props: &[(String, Value)]) -> Result<()> {
        let mut c = self.connection()?;
        c.call(
            MANAGER_PATH,
            MANAGER,
            "SetUnitProperties",
            &[Arg::Str(unit), Arg::Bool(true), Arg::Properties(props)],
        )
        .map(|_| ())
        .map_err(|e| unit_err(unit, e))
    }

    /// `StopUnit`, without waiting for the stop job; a unit systemd does not know (a scope
    /// whose processes are gone is collected by itself) is fine.
    pub fn stop(&self, unit: &str) -> Result<()> {
        let mut c = self.connection()?;
        match c.call(
            MANAGER_PATH,
            MANAGER,
            "StopUnit",
            &[Arg::Str(unit), Arg::Str("replace")],
        ) {
            Ok(_) => Ok(()),
            Err(DbusError::Call { name, .. }) if name == dbus::NO_SUCH_UNIT => Ok(()),
            Err(e) => Err(unit_err(unit, e)),
        }
    }
}

fn unit_err(unit: &str, source: DbusError) -> CgroupError {
    CgroupError::Systemd {
        unit: unit.to_string(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroups::dbus::fake;
    use std::io::{Read, Write};
    use std::os::unix::net::UnixListener;

    /// A fake manager on `socket` that serves `connections` connections: it authenticates the
    /// client, answers `Get` with root `/crius-fake`, `StartTransientUnit` with a job whose
    /// `JobRemoved` says `result` (after an unrelated signal), `StopUnit` with NoSuchUnit.
    /// Returns the calls it saw: (member, first argument).
    fn fake_manager(
        socket: &Path,
        connections: usize,
        result: &'static str,
    ) -> std::thread::JoinHandle<Vec<(String, String)>> {
        let listener = UnixListener::bind(socket).unwrap();
        std::thread::spawn(move || {
            let mut seen = Vec::new();
            for _ in 0..connections {
                let (mut s, _) = listener.accept().unwrap();
                let mut line = Vec::new();
                let mut b = [0u8; 1];
                while !line.ends_with(b"\r\n") {
                    s.read_exact(&mut b).unwrap();
                    line.push(b[0]);
                }
                assert_eq!(line, b"\0AUTH EXTERNAL 30\r\n");
                s.write_all(b"OK 0123456789abcdef0123456789abcdef\r\n")
                    .unwrap();
                let mut begin = [0u8; 7];
                s.read_exact(&mut begin).unwrap();
                assert_eq!(&begin, b"BEGIN\r\n");
                let Some((serial, member, arg)) = fake::read_call(&mut s) else {
                    continue;
                };
                let reply = match member.as_str() {
                    "Get" => fake::method_return(serial, "v", "/crius-fake"),
                    "StartTransientUnit" => {
                        let job = "/org/freedesktop/systemd1/job/7";
                        let mut r =
                            fake::job_removed("/org/freedesktop/systemd1/job/6", "x", "done");
                        r.extend(fake::method_return(serial, "o", job));
                        r.extend(fake::job_removed(job, &arg, result));
                        r
                    }
                    "StopUnit" => fake::error(serial, dbus::NO_SUCH_UNIT, "Unit x not loaded."),
                    _ => fake::error(serial, "org.freedesktop.DBus.Error.UnknownMethod", "no"),
                };
                s.write_all(&reply).unwrap();
                seen.push((member, arg));
            }
            seen
        })
    }

    #[test]
    fn connect_start_and_stop_against_a_fake_manager() {
        if !crius_common::test_needs_root("connect_start_and_stop_against_a_fake_manager") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("private");
        let server = fake_manager(&socket, 3, "done");
        let sd = Systemd::connect(&socket).unwrap();
        assert_eq!(sd.root(), "/crius-fake");
        let props = vec![("Delegate".to_string(), Value::Bool(true))];
        sd.start_transient("crius-c1.scope", &props, false).unwrap();
        sd.stop("crius-gone.scope").unwrap();
        let seen = server.join().unwrap();
        assert_eq!(
            seen,
            vec![
                (
                    "Get".to_string(),
                    "org.freedesktop.systemd1.Slice".to_string()
                ),
                (
                    "StartTransientUnit".to_string(),
                    "crius-c1.scope".to_string()
                ),
                ("StopUnit".to_string(), "crius-gone.scope".to_string()),
            ]
        );
    }

    #[test]
    fn a_failed_start_job_is_an_error_naming_the_unit() {
        if !crius_common::test_needs_root("a_failed_start_job_is_an_error_naming_the_unit") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("private");
        let server = fake_manager(&socket, 1, "failed");
        let sd = Systemd::with_root(&socket, "");
        let err = sd
            .start_transient("crius-c2.scope", &[], false)
            .unwrap_err();
        assert!(matches!(err, CgroupError::UnitStart { .. }), "{err:?}");
        assert!(err.to_string().contains("crius-c2.scope"), "{err}");
        assert!(err.to_string().contains("failed"), "{err}");
        server.join().unwrap();
    }

    #[test]
    fn no_manager_is_an_error_naming_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("private");
        let err = Systemd::connect(&socket).unwrap_err();
        let msg = crius_common::error_chain(&err);
        assert!(
            msg.contains(&format!("systemd does not answer at {}", socket.display())),
            "{msg}"
        );
        assert!(msg.contains("driver = \"cgroupfs\""), "{msg}");
    }
}
