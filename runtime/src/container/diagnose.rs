//! Why a create the runtime refused failed, when the request is the cause. libcontainer (and
//! runc, crun) report a command the image lacks or a bind mount of a directory onto a file
//! from deep inside the container's init, as an error crius can only pass on as Internal.
//! After such a failure, and only then (it costs nothing on the way of a create that works),
//! crius looks at the spec and the rootfs itself and, when it finds the cause, answers
//! InvalidArgument naming it.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use oci_spec::runtime::Spec;

use crate::error::Error;
use crate::spec::rootfs::resolve_in_root;
use crate::util::excerpt;

/// `err`, or InvalidArgument with the cause when the spec and the rootfs show one.
pub(super) fn explain(err: Error, spec: &Spec, rootfs: &Path) -> Error {
    if !matches!(err, Error::Internal { .. }) {
        return err;
    }
    match missing_executable(spec, rootfs).or_else(|| mount_type_mismatch(spec, rootfs)) {
        Some(cause) => Error::InvalidArgument(format!(
            "{cause} (the runtime said: {})",
            crate::error::chain(&err)
        )),
        None => err,
    }
}

/// Where the spec mounts something: paths at or below these are not the image's.
fn mount_points(spec: &Spec) -> Vec<PathBuf> {
    spec.mounts()
        .iter()
        .flatten()
        .map(|m| m.destination().clone())
        .collect()
}

/// The command's executable, when the image does not have it (or has it without an
/// executable bit) where the process would look: the path given, or each directory of the
/// process's `PATH`. Nothing is claimed for a path a mount may provide.
fn missing_executable(spec: &Spec, rootfs: &Path) -> Option<String> {
    let process = spec.process().as_ref()?;
    let command = process.args().as_ref()?.first()?;
    let mounts = mount_points(spec);
    let under_a_mount = |p: &Path| mounts.iter().any(|m| p.starts_with(m));
    let candidates: Vec<PathBuf> = if command.contains('/') {
        vec![process.cwd().join(command)]
    } else {
        let path = process
            .env()
            .iter()
            .flatten()
            .find_map(|e| e.strip_prefix("PATH="))?;
        path.split(':')
            .map(Path::new)
            .filter(|d| d.is_absolute())
            .map(|d| d.join(command))
            .collect()
    };
    let mut not_executable = None;
    for candidate in &candidates {
        if under_a_mount(candidate) {
            return None;
        }
        let found = resolve_in_root(rootfs, candidate)
            .ok()
            .and_then(|p| std::fs::metadata(p).ok());
        match found {
            Some(meta) if meta.is_file() && meta.permissions().mode() & 0o111 != 0 => return None,
            Some(meta) if meta.is_file() => not_executable = Some(candidate.clone()),
            _ => {}
        }
    }
    let command = excerpt(command);
    Some(match not_executable {
        Some(path) => format!(
            "config.command: {command} is {} in the image, which is not executable",
            path.display()
        ),
        None if candidates.len() == 1 => {
            format!("config.command: {command} is not in the image")
        }
        None => format!(
            "config.command: {command} is in none of the image's PATH directories ({})",
            candidates
                .iter()
                .filter_map(|c| c.parent())
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(":")
        ),
    })
}

/// A bind mount whose source is a directory where the image has a file at the target, or
/// the other way round: the kernel mounts neither. A target below another mount is that
/// mount's, not the image's, and is left alone.
fn mount_type_mismatch(spec: &Spec, rootfs: &Path) -> Option<String> {
    let mounts = spec.mounts().as_ref()?;
    for (i, m) in mounts.iter().enumerate() {
        let is_bind = m.typ().as_deref() == Some("bind")
            || m.options()
                .iter()
                .flatten()
                .any(|o| o == "bind" || o == "rbind");
        let Some(source) = m.source().as_ref().filter(|_| is_bind) else {
            continue;
        };
        let dest = m.destination();
        if mounts[..i]
            .iter()
            .any(|earlier| dest.starts_with(earlier.destination()))
        {
            continue;
        }
        let Some(target) = resolve_in_root(rootfs, dest)
            .ok()
            .and_then(|p| std::fs::metadata(p).ok())
        else {
            continue;
        };
        let Ok(source_meta) = std::fs::metadata(source) else {
            continue;
        };
        let kind = |dir: bool| {
            if dir {
                "a directory"
            } else {
                "not a directory"
            }
        };
        if source_meta.is_dir() != target.is_dir() {
            return Some(format!(
                "mount {}: host_path {} is {}, but {} in the image is {}",
                dest.display(),
                source.display(),
                kind(source_meta.is_dir()),
                dest.display(),
                kind(target.is_dir()),
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use oci_spec::runtime::{MountBuilder, ProcessBuilder, SpecBuilder};

    fn spec(args: &[&str], env: &[&str], mounts: &[(&str, &str)]) -> Spec {
        let process = ProcessBuilder::default()
            .args(args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .env(env.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .cwd("/")
            .build()
            .unwrap();
        let mounts = mounts
            .iter()
            .map(|(dest, src)| {
                MountBuilder::default()
                    .destination(dest)
                    .typ("bind")
                    .source(src)
                    .options(vec!["rbind".to_string()])
                    .build()
                    .unwrap()
            })
            .collect::<Vec<_>>();
        SpecBuilder::default()
            .process(process)
            .mounts(mounts)
            .build()
            .unwrap()
    }

    /// A rootfs with /bin/busybox (executable), /bin/sh -> /bin/busybox, /etc/passwd (a file,
    /// not executable) and /data (a directory).
    fn rootfs() -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        std::fs::create_dir_all(r.join("bin")).unwrap();
        std::fs::create_dir_all(r.join("etc")).unwrap();
        std::fs::create_dir_all(r.join("data")).unwrap();
        std::fs::write(r.join("bin/busybox"), b"").unwrap();
        std::fs::set_permissions(
            r.join("bin/busybox"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        std::os::unix::fs::symlink("/bin/busybox", r.join("bin/sh")).unwrap();
        std::fs::write(r.join("etc/passwd"), b"root:x:0:0::/:/bin/sh\n").unwrap();
        root
    }

    #[test]
    fn a_command_the_image_lacks_is_named() {
        let root = rootfs();
        let path = ["PATH=/usr/bin:/bin"];
        let found = |args: &[&str], mounts: &[(&str, &str)]| {
            missing_executable(&spec(args, &path, mounts), root.path())
        };
        assert_eq!(
            found(&["sh"], &[]),
            None,
            "through PATH and an absolute symlink"
        );
        assert_eq!(found(&["/bin/sh", "-c", "x"], &[]), None);
        assert_eq!(
            found(&["/no/such/cmd"], &[]).as_deref(),
            Some("config.command: /no/such/cmd is not in the image")
        );
        assert_eq!(
            found(&["nosuch"], &[]).as_deref(),
            Some(
                "config.command: nosuch is in none of the image's PATH directories (/usr/bin:/bin)"
            )
        );
        assert!(found(&["/etc/passwd"], &[]).is_some_and(|m| m.contains("which is not executable")));
        // A script a mount provides is not the image's to lack.
        assert_eq!(found(&["/scripts/run"], &[("/scripts", "/tmp")]), None);
    }

    #[test]
    fn a_directory_bound_onto_a_file_is_named() {
        let root = rootfs();
        let host_dir = tempfile::tempdir().unwrap();
        let host_file = host_dir.path().join("f");
        std::fs::write(&host_file, b"x").unwrap();
        let (dir, file) = (
            host_dir.path().to_str().unwrap(),
            host_file.to_str().unwrap(),
        );
        let mismatch =
            |mounts: &[(&str, &str)]| mount_type_mismatch(&spec(&["sh"], &[], mounts), root.path());
        assert!(mismatch(&[("/etc/passwd", dir)])
            .is_some_and(|m| m.contains("is a directory, but /etc/passwd in the image is not")));
        assert!(mismatch(&[("/data", file)]).is_some_and(|m| m.contains("is not a directory")));
        assert_eq!(mismatch(&[("/etc/passwd", file), ("/data", dir)]), None);
        assert_eq!(
            mismatch(&[("/new/place", dir)]),
            None,
            "a target the image lacks"
        );
        // Below another mount the image's content does not count.
        assert_eq!(mismatch(&[("/etc", dir), ("/etc/passwd", dir)]), None);
    }
}
