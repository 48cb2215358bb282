//! Whether the node rebooted since crius last ran: the kernel's boot id against the one the
//! last start kept in `<root>/boot_id`.
//!
//! After a reboot nothing of the old pods runs (`/run` is empty, the cgroups and systemd units
//! are new, every netns pin is gone) while the database still holds them, and host-local still
//! holds their IPs. Knowing it, the start settles every container and pod at once with a reason
//! that says so, instead of trying each pod's shim.

use std::path::{Path, PathBuf};

/// The kernel's id of the running boot.
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";
/// The file under `root` holding the boot id of the last start.
const KEPT: &str = "boot_id";

/// The boot crius starts in, and the one it last started in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Boot {
    /// This boot's id.
    pub current: String,
    /// The boot id of crius's last start, when one was kept.
    pub previous: Option<String>,
    kept: PathBuf,
}

impl Boot {
    /// Reads this boot's id and the one the last start kept under `root`.
    pub fn read(root: &Path) -> std::io::Result<Boot> {
        Self::read_from(Path::new(BOOT_ID), root)
    }

    fn read_from(boot_id: &Path, root: &Path) -> std::io::Result<Boot> {
        let current = std::fs::read_to_string(boot_id)?.trim().to_string();
        let kept = root.join(KEPT);
        let previous = match std::fs::read_to_string(&kept) {
            Ok(s) => Some(s.trim().to_string()).filter(|s| !s.is_empty()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        Ok(Boot {
            current,
            previous,
            kept,
        })
    }

    /// Whether the node booted again since the last start. Unknown (no kept id: a first start,
    /// or a database from a crius that kept none) counts as no: the shims are then asked, as
    /// after any restart.
    pub fn restarted(&self) -> bool {
        self.previous.as_ref().is_some_and(|p| *p != self.current)
    }

    /// What a container of the earlier boot (created or running) is told about its end.
    pub fn message(&self) -> String {
        format!(
            "the node restarted (boot {} ended; this is boot {})",
            self.previous.as_deref().unwrap_or("unknown"),
            self.current
        )
    }

    /// Keeps this boot's id for the next start, durably. Called once the records of the
    /// earlier boot are settled, so a crius killed before that settles them on its next start.
    pub fn keep(&self) -> std::io::Result<()> {
        if self.previous.as_deref() == Some(self.current.as_str()) {
            return Ok(());
        }
        crate::util::write_atomic(&self.kept, format!("{}\n", self.current).as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_boot_id_is_a_restart_and_is_kept_for_the_next_start() {
        let dir = tempfile::tempdir().unwrap();
        let id = dir.path().join("id");
        let root = dir.path().join("root");
        std::fs::create_dir(&root).unwrap();

        std::fs::write(&id, "aaa\n").unwrap();
        let first = Boot::read_from(&id, &root).unwrap();
        assert_eq!(first.previous, None);
        assert!(!first.restarted(), "a first start is not a reboot");
        first.keep().unwrap();

        let again = Boot::read_from(&id, &root).unwrap();
        assert_eq!(again.previous.as_deref(), Some("aaa"));
        assert!(!again.restarted(), "a restart of crius in the same boot");

        std::fs::write(&id, "bbb\n").unwrap();
        let rebooted = Boot::read_from(&id, &root).unwrap();
        assert!(rebooted.restarted());
        assert!(
            rebooted.message().contains("boot aaa ended"),
            "{}",
            rebooted.message()
        );
        // Not kept until asked: a crius killed while settling sees the reboot again.
        assert!(Boot::read_from(&id, &root).unwrap().restarted());
        rebooted.keep().unwrap();
        assert!(!Boot::read_from(&id, &root).unwrap().restarted());
    }

    #[test]
    fn an_unreadable_kept_id_is_an_error_and_an_empty_one_unknown() {
        let dir = tempfile::tempdir().unwrap();
        let id = dir.path().join("id");
        std::fs::write(&id, "aaa\n").unwrap();
        std::fs::write(dir.path().join(KEPT), "").unwrap();
        assert_eq!(Boot::read_from(&id, dir.path()).unwrap().previous, None);
        std::fs::remove_file(dir.path().join(KEPT)).unwrap();
        std::fs::create_dir(dir.path().join(KEPT)).unwrap();
        assert!(Boot::read_from(&id, dir.path()).is_err());
    }
}
