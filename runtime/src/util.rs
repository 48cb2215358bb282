//! Small helpers shared by the lifecycle code: ids, clocks, per-object locks, atomic writes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

/// A new 64-hex-digit id, as kubelet expects for pods and containers.
pub fn new_id() -> std::io::Result<String> {
    random_hex(32)
}

/// `len` random bytes from the kernel, as hex digits. Fails rather than settle for anything
/// less than random: ids and stream tokens must not be guessable.
pub fn random_hex(len: usize) -> std::io::Result<String> {
    let mut bytes = vec![0u8; len];
    getrandom::fill(&mut bytes).map_err(std::io::Error::other)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The longest name, namespace or uid crius accepts in metadata: Kubernetes' own limit for
/// object names (a DNS subdomain). Longer values only fail later and deeper (a CNI plugin's
/// argument list, a cgroup path).
pub const MAX_NAME_BYTES: usize = 253;

/// Checks a metadata field that names an object: present, at most [`MAX_NAME_BYTES`], and
/// without `/` or NUL (it becomes part of paths and CNI arguments).
pub fn check_name(field: &str, value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err(format!("{field} is required"));
    }
    if value.len() > MAX_NAME_BYTES {
        return Err(format!(
            "{field} {:?} is longer than {MAX_NAME_BYTES} bytes",
            excerpt(value)
        ));
    }
    if value.contains(['/', '\0']) {
        return Err(format!(
            "{field}: invalid value {:?} (no '/' or NUL)",
            excerpt(value)
        ));
    }
    Ok(())
}

/// Checks strings that become a process's argv or environment: NUL cannot pass `execve`, and
/// the kernel would refuse the process deep inside the runtime. `field` names the list.
pub fn check_no_nul<'a>(
    field: &str,
    values: impl IntoIterator<Item = &'a str>,
) -> Result<(), String> {
    for (i, v) in values.into_iter().enumerate() {
        if v.contains('\0') {
            return Err(format!("{field}[{i}] {:?} contains a NUL byte", excerpt(v)));
        }
    }
    Ok(())
}

/// How many bytes of a request's value an error message or log line quotes.
pub const EXCERPT_BYTES: usize = 64;

/// A value from a request as error messages quote it: whole if short, else its first
/// [`EXCERPT_BYTES`] bytes (cut on a character boundary) and its length, so a megabyte-long
/// field never reaches a status or a log line.
pub fn excerpt(value: &str) -> std::borrow::Cow<'_, str> {
    if value.len() <= EXCERPT_BYTES {
        return value.into();
    }
    let mut end = EXCERPT_BYTES;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &value[..end], value.len()).into()
}

/// Reads the regular file at `path` (symlinks followed) of at most `limit` bytes. Anything
/// else there (a FIFO, a device such as /dev/zero, a directory) or a larger file is an error
/// of kind `InvalidData`, found without blocking on it or reading it whole: the path comes
/// from a request or an image.
pub fn read_regular(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    use std::io::{Error, ErrorKind, Read};
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(Error::new(ErrorKind::InvalidData, "not a regular file"));
    }
    let too_big = || Error::new(ErrorKind::InvalidData, format!("larger than {limit} bytes"));
    if meta.len() > limit {
        return Err(too_big());
    }
    let mut data = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(limit + 1).read_to_end(&mut data)?;
    if data.len() as u64 > limit {
        return Err(too_big());
    }
    Ok(data)
}

/// Now, in nanoseconds since the Unix epoch (the unit of every CRI timestamp).
pub fn now_nanos() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// Writes `data` to `path` so that a reader sees the old content or the new, never a part,
/// and a crash leaves one of them whole (the content is synced before the rename).
pub fn write_atomic(path: &Path, data: &[u8]) -> std::io::Result<()> {
    crius_common::fs::write_atomic(path, data, None, crius_common::fs::Durability::Data)
}

/// What tells a file from another put at its path later: device, inode, size, modification
/// and change time (an inode number alone does not: a freed one is soon given to the next
/// file; a change time cannot be set back, so any rewrite, replacement or `chmod` shows).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FileId {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl FileId {
    pub fn of(m: &std::fs::Metadata) -> FileId {
        use std::os::unix::fs::MetadataExt;
        FileId {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }
}

/// One async lock per object id, so that calls about one pod or container run in turn while
/// calls about others go on. Entries are dropped when nobody holds or waits for them.
#[derive(Default)]
pub struct Locks {
    map: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// Held while an operation on one id runs.
pub struct LockGuard<'a> {
    locks: &'a Locks,
    id: String,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Locks {
    pub async fn lock(&self, id: &str) -> LockGuard<'_> {
        let m = {
            let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
            map.entry(id.to_string()).or_default().clone()
        };
        let guard = m.lock_owned().await;
        LockGuard {
            locks: self,
            id: id.to_string(),
            guard: Some(guard),
        }
    }
}

impl LockGuard<'_> {
    /// The id this guard holds: operations that need the lock take the guard, not the id.
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl Drop for LockGuard<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut map = self.locks.map.lock().unwrap_or_else(|p| p.into_inner());
        // Two references: the map's and none other means nobody waits for it.
        if map.get(&self.id).is_some_and(|m| Arc::strong_count(m) == 1) {
            map.remove(&self.id);
        }
    }
}

/// Whether the running kernel's release (`/proc/sys/kernel/osrelease`) is at least
/// `major.minor`; false when it cannot be read.
pub fn kernel_at_least(major: u32, minor: u32) -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut parts = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(a), Some(b)) => (a, b) >= (major, minor),
        _ => false,
    }
}

/// Opens `path` as a directory (an `O_PATH` descriptor) below `root`, resolving `..` and
/// symlinks as if `root` were `/` (openat2's `RESOLVE_IN_ROOT`): an image's symlink cannot
/// lead out of the container's rootfs.
fn open_dir_in_root(root: &std::fs::File, path: &Path) -> std::io::Result<std::os::fd::OwnedFd> {
    openat2_in_root(
        root,
        path,
        libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
    )
}

/// Opens `path` with open(2) `flags` below the directory `root`, which stands for `/` while
/// `..` and symlinks are resolved (openat2's `RESOLVE_IN_ROOT`).
pub fn open_in_root(
    root: &Path,
    path: &Path,
    flags: libc::c_int,
) -> std::io::Result<std::os::fd::OwnedFd> {
    openat2_in_root(&std::fs::File::open(root)?, path, flags)
}

fn openat2_in_root(
    root: &std::fs::File,
    path: &Path,
    flags: libc::c_int,
) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::{AsRawFd, FromRawFd};
    use std::os::unix::ffi::OsStrExt;
    let rel = if path.as_os_str().is_empty() {
        std::ffi::CString::new(".")
    } else {
        std::ffi::CString::new(path.as_os_str().as_bytes())
    }
    .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: open_how is plain data; all-zero is its "no flags" value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = flags as u64;
    how.resolve = libc::RESOLVE_IN_ROOT;
    // SAFETY: openat2 reads the NUL-terminated path and the open_how we own, of the size we
    // pass; the descriptor it returns is ours.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            root.as_raw_fd(),
            rel.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd was just returned to us by the kernel and nothing else owns it.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}

/// Creates directory `path` (absolute, as the container sees it) and its missing parents inside
/// the rootfs at `root`, mode 0755, owned by `owner` (the container's root on the node) when
/// given. Symlinks in the image resolve inside `root`, never to the node's files. runc does
/// this for a missing working directory; so does crius.
pub fn mkdir_in_root(root: &Path, path: &Path, owner: Option<(u32, u32)>) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;
    let root_dir = std::fs::File::open(root)?;
    let mut prefix = PathBuf::new();
    for comp in path.components() {
        let name = match comp {
            std::path::Component::Normal(n) => n,
            std::path::Component::ParentDir => std::ffi::OsStr::new(".."),
            _ => continue,
        };
        let next = prefix.join(name);
        match open_dir_in_root(&root_dir, &next) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                let parent = open_dir_in_root(&root_dir, &prefix)?;
                let cname = std::ffi::CString::new(name.as_bytes())
                    .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
                // SAFETY: mkdirat on a directory descriptor we own with a NUL-terminated name.
                if unsafe { libc::mkdirat(parent.as_raw_fd(), cname.as_ptr(), 0o755) } != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if let Some((uid, gid)) = owner {
                    // SAFETY: as above; the entry was just made by us and is no symlink.
                    let rc = unsafe {
                        libc::fchownat(
                            parent.as_raw_fd(),
                            cname.as_ptr(),
                            uid,
                            gid,
                            libc::AT_SYMLINK_NOFOLLOW,
                        )
                    };
                    if rc != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
            }
            Err(e) => return Err(e),
        }
        prefix = next;
    }
    Ok(())
}

/// How long each step of an operation took, for a debug log line (`run phases`, `create
/// phases`) that the lifecycle bench reads for its per-phase breakdown.
pub struct Phases {
    last: std::time::Instant,
    took: Vec<(&'static str, std::time::Duration)>,
}

impl Phases {
    pub fn start() -> Phases {
        Phases {
            last: std::time::Instant::now(),
            took: Vec::with_capacity(8),
        }
    }

    /// Adds step `name` that took `took` beside the others (one of several run at once).
    pub fn add(&mut self, name: &'static str, took: std::time::Duration) {
        self.took.push((name, took));
    }

    /// Ends the step called `name` now.
    pub fn mark(&mut self, name: &'static str) {
        let now = std::time::Instant::now();
        self.took.push((name, now - self.last));
        self.last = now;
    }

    /// How long all steps took together.
    pub fn total(&self) -> std::time::Duration {
        self.took.iter().map(|(_, d)| *d).sum()
    }

    /// Adds the steps of `inner` (a part of this operation timed on its own) after these.
    pub fn extend(&mut self, inner: Phases) {
        self.took.extend(inner.took);
    }
}

impl std::fmt::Display for Phases {
    /// `rootfs=0.41ms image_config=0.10ms ...`
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (name, d)) in self.took.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{name}={:.2}ms", d.as_secs_f64() * 1e3)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn read_regular_reads_only_bounded_regular_files() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, b"0123456789").unwrap();
        assert_eq!(read_regular(&file, 10).unwrap(), b"0123456789");
        let kind = |p: &Path, limit: u64| read_regular(p, limit).unwrap_err().kind();
        assert_eq!(kind(&file, 9), std::io::ErrorKind::InvalidData);
        assert_eq!(kind(dir.path(), 100), std::io::ErrorKind::InvalidData);
        assert_eq!(
            kind(Path::new("/dev/zero"), 100),
            std::io::ErrorKind::InvalidData
        );
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert_eq!(
            kind(&fifo, 100),
            std::io::ErrorKind::InvalidData,
            "without blocking"
        );
        assert_eq!(
            kind(&dir.path().join("none"), 100),
            std::io::ErrorKind::NotFound
        );
    }

    use super::*;

    #[test]
    fn this_kernel_has_mount_setattr() {
        // the e2e tests run on 6.x
        assert!(kernel_at_least(5, 12));
        assert!(!kernel_at_least(999, 0));
    }

    #[test]
    fn ids_are_64_hex_and_distinct() {
        let a = new_id().unwrap();
        let b = new_id().unwrap();
        assert_eq!(a.len(), 64);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn atomic_write_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[tokio::test]
    async fn locks_serialise_one_id_and_are_freed() {
        let locks = Locks::default();
        let g = locks.lock("a").await;
        let _other = locks.lock("b").await;
        drop(g);
        let _again = locks.lock("a").await;
        drop(_again);
        drop(_other);
        assert!(locks.map.lock().unwrap().is_empty());
    }
}
