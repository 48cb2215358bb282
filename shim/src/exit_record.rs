//! Exit records: `containers/<id>/exit.json`, written so that a reader sees either no file or
//! a complete one (temp file, then rename), also when the shim dies half-way.
//!
//! They are not fsynced. A record has to outlive the shim and crius, both mere processes whose
//! death leaves the page cache intact; only a machine crash loses unsynced data, and that
//! ends every container and the records' purpose with them: the shim state lives under the
//! runtime state directory (`/run/crius`, a tmpfs until reboot; containerd's shim keeps exit
//! statuses in memory only). The two fsyncs (file, directory) cost 3 to 8 ms on the disk of
//! the test machine, on the path of every StopContainer, which waits for the exit.

use std::io;
use std::path::Path;

use crius_common::fs::{write_atomic, Durability};

use crius_api::shim::{ExitInfo, EXIT_FILE};

/// Write `exit` to `<dir>/exit.json` atomically.
pub fn write(dir: &Path, exit: &ExitInfo) -> io::Result<()> {
    let bytes = serde_json::to_vec(exit).map_err(io::Error::other)?;
    write_atomic(&dir.join(EXIT_FILE), &bytes, None, Durability::None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn round_trips_through_the_reader() {
        let dir = tempfile::tempdir().unwrap();
        let cdir = dir.path().join("containers").join("c1");
        fs::create_dir_all(&cdir).unwrap();
        assert_eq!(
            crius_api::shim::read_exit_file(dir.path(), "c1").unwrap(),
            None
        );
        let exit = ExitInfo {
            pid: 42,
            exit_code: 137,
            signal: Some(9),
            finished_at: "2023-11-14T22:13:20.123456789Z".into(),
            finished_at_unix_nano: 1_700_000_000_123_456_789,
            oom_killed: true,
        };
        write(&cdir, &exit).unwrap();
        assert_eq!(
            crius_api::shim::read_exit_file(dir.path(), "c1").unwrap(),
            Some(exit)
        );
        assert!(!cdir.join(".exit.json.tmp").exists());
    }
}
