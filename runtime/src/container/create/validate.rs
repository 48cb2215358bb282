//! What a `CreateContainer` request must be before anything is looked up: names, paths, NUL
//! bytes, resources, the image field, the log path; and, once the pod's handler is known,
//! what that handler supports.

use std::path::{Path, PathBuf};

use crius_api::v1::{ContainerConfig, Mount};

use crate::error::{Error, Result};
use crate::handlers::Handler;
use crate::util::{check_name, check_no_nul, excerpt};

/// Longest path a mount may name (PATH_MAX).
const MAX_PATH_BYTES: usize = 4096;

/// What below `/proc` a CRI mount may cover: the files lxcfs-style tools replace with views of
/// the container's own limits (runc allows the same). Anything else there would hide or fake
/// the kernel's view of the container.
const PROC_MOUNTS_ALLOWED: &[&str] = &[
    "/proc/cpuinfo",
    "/proc/diskstats",
    "/proc/meminfo",
    "/proc/stat",
    "/proc/swaps",
    "/proc/uptime",
    "/proc/loadavg",
    "/proc/slabinfo",
    "/proc/net/dev",
    "/proc/sys/kernel/ns_last_pid",
];

/// The request alone: its name, strings without NUL, resources, mounts, image and log path.
pub(super) fn request(config: &ContainerConfig) -> Result<()> {
    let name = config
        .metadata
        .as_ref()
        .map(|m| m.name.as_str())
        .unwrap_or("");
    check_name("config.metadata.name", name).map_err(Error::InvalidArgument)?;
    check_strings(config)?;
    if let Some(r) = config.linux.as_ref().and_then(|l| l.resources.as_ref()) {
        crate::cgroups::check_resources("config.linux.resources", r)?;
    }
    for (i, m) in config.mounts.iter().enumerate() {
        check_mount_paths(i, m)?;
    }
    let image = config
        .image
        .as_ref()
        .map(|i| i.image.as_str())
        .unwrap_or("");
    if image.is_empty() {
        return Err(Error::InvalidArgument(
            "config.image.image is required".into(),
        ));
    }
    if config.log_path.starts_with('/') || config.log_path.split('/').any(|c| c == "..") {
        return Err(Error::InvalidArgument(format!(
            "config.log_path {:?} must be relative to the pod's log_directory",
            config.log_path
        )));
    }
    Ok(())
}

/// No NUL in the command, arguments, environment or working directory.
fn check_strings(config: &ContainerConfig) -> Result<()> {
    check_no_nul("config.command", config.command.iter().map(String::as_str))
        .and_then(|()| check_no_nul("config.args", config.args.iter().map(String::as_str)))
        .and_then(|()| {
            check_no_nul(
                "config.envs.key",
                config.envs.iter().map(|e| e.key.as_str()),
            )
        })
        .and_then(|()| check_no_nul("config.working_dir", [config.working_dir.as_str()]))
        .map_err(Error::InvalidArgument)?;
    if let Some(i) = config.envs.iter().position(|e| e.value.contains(&0)) {
        return Err(Error::InvalidArgument(format!(
            "config.envs[{i}].value of {:?} contains a NUL byte",
            excerpt(&config.envs[i].key)
        )));
    }
    Ok(())
}

/// The paths of `config.mounts[i]`: no NUL, at most PATH_MAX, and no mount over `/proc` but
/// the files [`PROC_MOUNTS_ALLOWED`] names.
fn check_mount_paths(i: usize, m: &Mount) -> Result<()> {
    for (field, value) in [
        ("container_path", &m.container_path),
        ("host_path", &m.host_path),
    ] {
        if value.contains('\0') || value.len() > MAX_PATH_BYTES {
            return Err(Error::InvalidArgument(format!(
                "config.mounts[{i}].{field} {:?} is not a path (NUL, or longer than {MAX_PATH_BYTES} bytes)",
                excerpt(value)
            )));
        }
    }
    let dest = Path::new(&m.container_path);
    let clean: PathBuf = dest
        .components()
        .filter(|c| !matches!(c, std::path::Component::CurDir))
        .collect();
    if clean.starts_with("/proc") && !PROC_MOUNTS_ALLOWED.iter().any(|p| clean == Path::new(p)) {
        return Err(Error::InvalidArgument(format!(
            "config.mounts[{i}].container_path {:?}: nothing may be mounted over /proc but {}",
            excerpt(&m.container_path),
            PROC_MOUNTS_ALLOWED.join(", ")
        )));
    }
    Ok(())
}

/// What the pod's handler must support for this request: recursive read-only mounts.
pub(super) fn for_handler(config: &ContainerConfig, handler: &Handler) -> Result<()> {
    if handler.recursive_read_only {
        return Ok(());
    }
    match config.mounts.iter().position(|m| m.recursive_read_only) {
        Some(i) => Err(Error::InvalidArgument(format!(
            "config.mounts[{i}].recursive_read_only: runtime handler {:?} does not \
             support recursive read-only mounts",
            handler.name
        ))),
        None => Ok(()),
    }
}
