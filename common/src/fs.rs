//! Atomic file replacement and directory-tree removal.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// How far a replaced file must survive a machine crash. Every level is atomic for readers:
/// they see the old content or the new, never a part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Nothing is synced: for state on a tmpfs, which a reboot empties anyway (the shim's exit
    /// records, libcontainer's state files).
    None,
    /// The new content is synced before the rename, so after a crash the file holds the old
    /// content or the new, never an empty or torn one; the rename itself may be lost.
    Data,
    /// As `Data`, and the directory is synced after the rename, so the new name survives.
    Full,
}

/// Replace `path` by `bytes` through a temporary file in the same directory and a rename; the
/// new file gets `mode` (default 0644 less the umask). The temporary file is removed on error.
pub fn write_atomic(
    path: &Path,
    bytes: &[u8],
    mode: Option<u32>,
    durability: Durability,
) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
    // One writer per file at a time is the callers' rule; the pid keeps two processes apart.
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp = dir.join(tmp_name);
    let write = || -> io::Result<()> {
        let mut options = OpenOptions::new();
        options.write(true).create(true).truncate(true);
        if let Some(mode) = mode {
            options.mode(mode);
        }
        let mut file = options.open(&tmp)?;
        file.write_all(bytes)?;
        if durability != Durability::None {
            file.sync_all()?;
        }
        drop(file);
        std::fs::rename(&tmp, path)?;
        if durability == Durability::Full {
            File::open(dir)?.sync_all()?;
        }
        Ok(())
    };
    write().inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// `rmdir` `dir` and every directory below it, deepest first (cgroupfs removes a cgroup's
/// files with it; only its child cgroups must go first). A missing `dir` is fine. On failure,
/// the directory that could not be removed and why (EBUSY: a cgroup still has processes).
pub fn remove_dir_tree(dir: &Path) -> Result<(), (PathBuf, io::Error)> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err((dir.to_path_buf(), e)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| (dir.to_path_buf(), e))?;
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_dir_tree(&entry.path())?;
        }
    }
    match std::fs::remove_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err((dir.to_path_buf(), e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn replaces_at_every_durability_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        for (i, d) in [Durability::None, Durability::Data, Durability::Full]
            .into_iter()
            .enumerate()
        {
            write_atomic(&path, format!("v{i}").as_bytes(), None, d).unwrap();
            assert_eq!(std::fs::read_to_string(&path).unwrap(), format!("v{i}"));
        }
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn sets_the_mode_and_cleans_up_after_a_failure() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bin");
        write_atomic(&path, b"x", Some(0o755), Durability::Data).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o755);
        // The target is a non-empty directory: the rename fails, no temp file is left.
        let blocked = dir.path().join("blocked");
        std::fs::create_dir_all(blocked.join("inside")).unwrap();
        assert!(write_atomic(&blocked, b"x", None, Durability::None).is_err());
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().collect();
        assert_eq!(names.len(), 2, "{names:?}");
    }

    #[test]
    fn removes_nested_directories_leaf_first() {
        let dir = tempfile::tempdir().unwrap();
        let top = dir.path().join("a");
        std::fs::create_dir_all(top.join("b/c")).unwrap();
        std::fs::create_dir_all(top.join("d")).unwrap();
        remove_dir_tree(&top).unwrap();
        assert!(!top.exists());
        remove_dir_tree(&top).unwrap();
        // A plain file in the tree (not cgroupfs) stops the removal and names the directory.
        std::fs::create_dir_all(top.join("b")).unwrap();
        std::fs::write(top.join("b/file"), b"").unwrap();
        let (at, _) = remove_dir_tree(&top).unwrap_err();
        assert_eq!(at, top.join("b"));
    }
}
