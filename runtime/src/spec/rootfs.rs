//! Reading files inside an image rootfs: path resolution that never leaves the rootfs, and the
//! `/etc/passwd` and `/etc/group` databases.

use std::ffi::OsString;
use std::io;
use std::path::{Component, Path, PathBuf};

/// Linux's limit on symlinks followed while resolving one path (`MAXSYMLINKS`).
const MAX_SYMLINKS: usize = 40;

/// Resolves `path` inside `root` as if `root` were `/`: symlinks are followed, but an absolute
/// target restarts at `root` and `..` stops at `root`, so the result always lies inside `root`.
/// Missing components are kept as they are (opening the result then fails with `NotFound`).
pub(crate) fn resolve_in_root(root: &Path, path: &Path) -> io::Result<PathBuf> {
    let mut pending: Vec<OsString> = components(path);
    pending.reverse();
    let mut resolved: Vec<OsString> = Vec::new();
    let mut followed = 0;
    while let Some(part) = pending.pop() {
        if part == ".." {
            resolved.pop();
            continue;
        }
        resolved.push(part);
        let candidate = join(root, &resolved);
        let meta = match std::fs::symlink_metadata(&candidate) {
            Ok(meta) => meta,
            Err(err) if err.kind() == io::ErrorKind::NotFound => continue,
            Err(err) => return Err(err),
        };
        if !meta.file_type().is_symlink() {
            continue;
        }
        followed += 1;
        if followed > MAX_SYMLINKS {
            return Err(io::Error::from_raw_os_error(libc::ELOOP));
        }
        let target = std::fs::read_link(&candidate)?;
        resolved.pop();
        if target.is_absolute() {
            resolved.clear();
        }
        let mut parts = components(&target);
        parts.reverse();
        pending.extend(parts);
    }
    Ok(join(root, &resolved))
}

/// The normal and `..` components of a path; `.` and the root are dropped.
fn components(path: &Path) -> Vec<OsString> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(name) => Some(name.to_os_string()),
            Component::ParentDir => Some(OsString::from("..")),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
        })
        .collect()
}

fn join(root: &Path, parts: &[OsString]) -> PathBuf {
    let mut out = root.to_path_buf();
    out.extend(parts);
    out
}

/// Largest image file read (`/etc/passwd`, `/etc/group`).
const MAX_IMAGE_FILE: u64 = 16 << 20;

/// Reads a regular file of at most 16 MiB inside the rootfs; `Ok(None)` when it does not
/// exist. The image's content is not trusted: a FIFO or a huge file there is an error of kind
/// `InvalidData` ([`crate::util::read_regular`]).
pub(crate) fn read_in_root(root: &Path, path: &str) -> io::Result<Option<String>> {
    let resolved = resolve_in_root(root, Path::new(path))?;
    match crate::util::read_regular(&resolved, MAX_IMAGE_FILE) {
        Ok(bytes) => Ok(Some(String::from_utf8_lossy(&bytes).into_owned())),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(err),
    }
}

/// One `/etc/passwd` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PasswdEntry {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

/// One `/etc/group` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GroupEntry {
    pub name: String,
    pub gid: u32,
    pub members: Vec<String>,
}

/// Parses `/etc/passwd` (`name:password:uid:gid:gecos:home:shell`); malformed lines are skipped,
/// as libc's getpwent does.
pub(crate) fn parse_passwd(text: &str) -> Vec<PasswdEntry> {
    text.lines()
        .filter(|line| !line.trim_start().starts_with('#'))
        .filter_map(|line| {
            let mut fields = line.split(':');
            let name = fields.next()?.trim();
            let _password = fields.next()?;
            let uid = fields.next()?.trim().parse().ok()?;
            let gid = fields.next()?.trim().parse().ok()?;
            (!name.is_empty()).then(|| PasswdEntry {
                name: name.to_string(),
                uid,
                gid,
            })
        })
        .collect()
}

/// Parses `/etc/group` (`name:password:gid:member,member`); malformed lines are skipped.
pub(crate) fn parse_group(text: &str) -> Vec<GroupEntry> {
    text.lines()
        .filter(|line| !line.trim_start().starts_with('#'))
        .filter_map(|line| {
            let mut fields = line.split(':');
            let name = fields.next()?.trim();
            let _password = fields.next()?;
            let gid = fields.next()?.trim().parse().ok()?;
            let members = fields
                .next()
                .unwrap_or("")
                .split(',')
                .map(str::trim)
                .filter(|m| !m.is_empty())
                .map(str::to_string)
                .collect();
            (!name.is_empty()).then(|| GroupEntry {
                name: name.to_string(),
                gid,
                members,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn symlinks_never_leave_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::fs::write(root.join("etc/real"), "inside").unwrap();
        symlink("/etc/real", root.join("etc/abs")).unwrap();
        symlink("../../../../etc/real", root.join("etc/dotdot")).unwrap();
        symlink("/../../etc/shadow", root.join("etc/escape")).unwrap();

        assert_eq!(
            resolve_in_root(root, Path::new("/etc/abs")).unwrap(),
            root.join("etc/real")
        );
        assert_eq!(
            resolve_in_root(root, Path::new("/etc/dotdot")).unwrap(),
            root.join("etc/real")
        );
        assert_eq!(
            resolve_in_root(root, Path::new("/etc/escape")).unwrap(),
            root.join("etc/shadow")
        );
        assert_eq!(
            resolve_in_root(root, Path::new("/../../etc/abs")).unwrap(),
            root.join("etc/real")
        );
        assert_eq!(
            read_in_root(root, "/etc/abs").unwrap().as_deref(),
            Some("inside")
        );
        assert_eq!(read_in_root(root, "/etc/escape").unwrap(), None);
        // an image's FIFO is refused, not waited on
        let fifo =
            std::ffi::CString::new(root.join("etc/fifo").into_os_string().into_encoded_bytes())
                .unwrap();
        // SAFETY: a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        assert_eq!(
            read_in_root(root, "/etc/fifo").unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
    }

    #[test]
    fn symlink_loops_are_an_error() {
        let dir = tempfile::tempdir().unwrap();
        symlink("/b", dir.path().join("a")).unwrap();
        symlink("/a", dir.path().join("b")).unwrap();
        let err = resolve_in_root(dir.path(), Path::new("/a")).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ELOOP));
    }

    #[test]
    fn passwd_and_group_parse_skipping_bad_lines() {
        let users = parse_passwd("root:x:0:0:root:/root:/bin/sh\n# comment\nbad\nalice:x:1000:1001::/home/alice:/bin/sh\nbob:x:notanumber:1:::\n");
        assert_eq!(users.len(), 2);
        assert_eq!(users[1].name, "alice");
        assert_eq!((users[1].uid, users[1].gid), (1000, 1001));
        let groups = parse_group("root:x:0:\nwheel:x:10:alice, bob\nnogid:x::\n");
        assert_eq!(groups.len(), 2);
        assert_eq!(groups[1].members, vec!["alice", "bob"]);
        assert!(groups[0].members.is_empty());
    }
}
