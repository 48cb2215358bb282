//! AppArmor on the node: whether the kernel enforces it, which profiles it holds, and crius's
//! own default profile (`contrib/apparmor/crius-default`, embedded), loaded at start.
//!
//! Which profile a container runs under is chosen in `spec::security::apparmor_profile`; the
//! OCI runtime applies it (libcontainer's init, runc, crun), and the shim's exec helper applies
//! the container's to every exec'd process.

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The name of crius's default profile (containerd's is `cri-containerd.apparmor.d`, CRI-O's
/// `crio-default`).
pub const DEFAULT_PROFILE: &str = "crius-default";
/// Its text.
pub const DEFAULT_PROFILE_TEXT: &str = include_str!("../../contrib/apparmor/crius-default");
/// One line per profile the kernel holds: `<name> (<mode>)`.
const PROFILES: &str = "/sys/kernel/security/apparmor/profiles";
/// Where `apparmor_parser` is looked for after `PATH` (Debian installs it in /usr/sbin).
const PARSER_DIRS: &[&str] = &["/usr/sbin", "/sbin"];

/// What became of the default profile at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DefaultProfile {
    /// The kernel holds this crius's text of it.
    Loaded,
    /// The node has no `apparmor_parser`: as containerd does then, containers that would get
    /// the default run unconfined (crius warns at start).
    NoParser,
    /// `apparmor_parser` refused it or could not be run: RuntimeDefault is refused.
    Failed(String),
}

static DEFAULT: OnceLock<DefaultProfile> = OnceLock::new();

/// Whether the kernel enforces AppArmor and its securityfs interface is mounted.
pub fn enabled() -> bool {
    Path::new(PROFILES).exists()
        && std::fs::read_to_string("/sys/module/apparmor/parameters/enabled")
            .is_ok_and(|s| s.trim() == "Y")
}

/// What [`load_default`] found at start; `None` before it ran (or without AppArmor).
pub fn default_profile() -> Option<&'static DefaultProfile> {
    DEFAULT.get()
}

/// The names in the text of the kernel's profile list.
fn profile_names(text: &str) -> impl Iterator<Item = &str> {
    text.lines()
        .map(|l| l.rsplit_once(" (").map_or(l, |(name, _)| name))
        .filter(|n| !n.is_empty())
}

/// Whether the kernel holds a profile named `name`.
pub fn is_loaded(name: &str) -> io::Result<bool> {
    let text = std::fs::read_to_string(PROFILES)?;
    let found = profile_names(&text).any(|n| n == name);
    Ok(found)
}

fn find_parser() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(PARSER_DIRS.iter().map(PathBuf::from))
        .map(|d| d.join("apparmor_parser"))
        .find(|p| p.is_file())
}

/// Loads crius's default profile unless the kernel holds this very text already, and records
/// the outcome for [`default_profile`]. The text last loaded is kept at
/// `<state>/apparmor/crius-default`: the state directory lives until reboot, as the kernel's
/// policy does, so a copy equal to the embedded text and a profile of that name in the kernel
/// mean it is current; a newer crius with another text replaces it (`apparmor_parser
/// --replace`). Call only where [`enabled`] is true.
pub fn load_default(state: &Path) -> &'static DefaultProfile {
    let outcome = load(state);
    match &outcome {
        DefaultProfile::Loaded => {}
        DefaultProfile::NoParser => tracing::warn!(
            "AppArmor is enabled but apparmor_parser is not installed: containers that ask for \
             RuntimeDefault (or no profile) run unconfined; install the apparmor package"
        ),
        DefaultProfile::Failed(why) => tracing::error!(
            "AppArmor profile {DEFAULT_PROFILE} could not be loaded ({why}): containers that \
             ask for RuntimeDefault are refused"
        ),
    }
    DEFAULT.get_or_init(|| outcome)
}

fn load(state: &Path) -> DefaultProfile {
    let dir = state.join("apparmor");
    let kept = dir.join(DEFAULT_PROFILE);
    let current = std::fs::read_to_string(&kept).is_ok_and(|t| t == DEFAULT_PROFILE_TEXT);
    if current && is_loaded(DEFAULT_PROFILE).unwrap_or(false) {
        return DefaultProfile::Loaded;
    }
    let Some(parser) = find_parser() else {
        return DefaultProfile::NoParser;
    };
    let staged = dir.join(format!("{DEFAULT_PROFILE}.new"));
    let written =
        std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&staged, DEFAULT_PROFILE_TEXT));
    if let Err(e) = written {
        return DefaultProfile::Failed(format!("write {}: {e}", staged.display()));
    }
    let started = std::time::Instant::now();
    let out = Command::new(&parser)
        .args(["--replace", "--skip-cache"])
        .arg(&staged)
        .output();
    let outcome = match out {
        Err(e) => DefaultProfile::Failed(format!("run {}: {e}", parser.display())),
        Ok(o) if !o.status.success() => DefaultProfile::Failed(format!(
            "{} {}: {}",
            parser.display(),
            o.status,
            crate::util::excerpt(String::from_utf8_lossy(&o.stderr).trim())
        )),
        Ok(_) => match std::fs::rename(&staged, &kept) {
            Ok(()) => {
                tracing::info!(
                    took_ms = started.elapsed().as_millis() as u64,
                    "AppArmor profile {DEFAULT_PROFILE} loaded"
                );
                DefaultProfile::Loaded
            }
            Err(e) => DefaultProfile::Failed(format!("rename {}: {e}", staged.display())),
        },
    };
    let _ = std::fs::remove_file(&staged);
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_names_from_the_kernel_list() {
        let text = "crius-default (enforce)\n/usr/bin/man (enforce)\nwith (paren) (complain)\n\
                    lsb_release (enforce)\n";
        let names: Vec<_> = profile_names(text).collect();
        assert_eq!(
            names,
            [
                "crius-default",
                "/usr/bin/man",
                "with (paren)",
                "lsb_release"
            ]
        );
    }

    #[test]
    fn the_default_profile_names_itself() {
        assert!(DEFAULT_PROFILE_TEXT.contains(&format!("profile {DEFAULT_PROFILE} flags=")));
        assert!(DEFAULT_PROFILE_TEXT.contains(&format!("peer={DEFAULT_PROFILE},")));
        assert!(!DEFAULT_PROFILE_TEXT.contains("#include"));
    }
}
