//! A temporary directory that leaves no mounts behind.

use std::path::{Path, PathBuf};

use nix::mount::{umount2, MntFlags};

use crate::{Error, Result};

/// A fresh directory under the system temp dir (`$TMPDIR` or `/tmp`), named `crius-<label>-XXXXXX`.
///
/// On drop it first detaches (lazily unmounts) every mount at or below it — overlay rootfs,
/// bind mounts, netns pins a failed test left — and then removes it recursively. Errors during
/// drop are printed, never panicked on.
#[derive(Debug)]
pub struct TestDir {
    // Canonical path: /proc/self/mountinfo lists canonical mount points.
    path: PathBuf,
    dir: Option<tempfile::TempDir>,
}

impl TestDir {
    /// Creates the directory; `label` says what it is for (`registry`, `daemon`, ...).
    pub fn new(label: &str) -> Result<TestDir> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("crius-{label}-"))
            .tempdir()
            .map_err(|source| Error::io("create a temp dir", std::env::temp_dir(), source))?;
        let path = dir
            .path()
            .canonicalize()
            .map_err(|source| Error::io("resolve temp dir", dir.path(), source))?;
        Ok(TestDir {
            path,
            dir: Some(dir),
        })
    }

    /// The directory (canonical, absolute).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `self.path().join(rel)`.
    pub fn join(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.path.join(rel)
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        if let Err(err) = unmount_all_under(&self.path) {
            eprintln!("crius-tests: unmount under {}: {err}", self.path.display());
        }
        if let Some(dir) = self.dir.take() {
            if let Err(err) = dir.close() {
                eprintln!("crius-tests: remove {}: {err}", self.path.display());
            }
        }
    }
}

/// Lazily unmounts (`MNT_DETACH`) every mount of this mount namespace at or below `dir`,
/// newest first, and returns how many were detached.
///
/// Repeats until `/proc/self/mountinfo` lists nothing under `dir`, so stacked mounts go too.
pub fn unmount_all_under(dir: &Path) -> Result<usize> {
    let mut detached = 0;
    // Each round removes at least the top mount of each stack; the bound only guards against a
    // mount that keeps reappearing.
    for _ in 0..64 {
        let mounts = mounts_under(dir)?;
        if mounts.is_empty() {
            return Ok(detached);
        }
        for mount in mounts.iter().rev() {
            match umount2(mount, MntFlags::MNT_DETACH) {
                Ok(()) => detached += 1,
                // Already gone with a parent that was detached before it.
                Err(nix::Error::EINVAL) | Err(nix::Error::ENOENT) => {}
                Err(errno) => {
                    return Err(Error::io("unmount", mount, std::io::Error::from(errno)));
                }
            }
        }
    }
    Err(Error::io(
        "mounts keep reappearing under",
        dir,
        std::io::Error::other("gave up after 64 rounds"),
    ))
}

/// Mount points at or below `dir`, in mountinfo order (oldest first).
fn mounts_under(dir: &Path) -> Result<Vec<PathBuf>> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|source| Error::io("read", "/proc/self/mountinfo", source))?;
    Ok(mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|field| PathBuf::from(unescape_mountinfo(field)))
        .filter(|mount| mount.starts_with(dir))
        .collect())
}

/// Undoes mountinfo's octal escapes (`\040` for a space, `\011`, `\012`, `\134`).
fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            let octal = std::str::from_utf8(&bytes[i + 1..i + 4]).unwrap_or("");
            if let Ok(value) = u8::from_str_radix(octal, 8) {
                out.push(value);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unescapes_mountinfo_fields() {
        assert_eq!(unescape_mountinfo(r"/tmp/a\040b"), "/tmp/a b");
        assert_eq!(unescape_mountinfo(r"/tmp/x\134y"), r"/tmp/x\y");
        assert_eq!(unescape_mountinfo("/plain"), "/plain");
        assert_eq!(unescape_mountinfo(r"/end\04"), r"/end\04");
    }
}
