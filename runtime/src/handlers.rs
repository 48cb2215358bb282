//! RuntimeClass handlers: which runtime runs a pod (`RunPodSandboxRequest.runtime_handler`).
//!
//! `[runtime.handlers.<name>]` (see `config.rs`) names crius's own path (`builtin`) or an OCI
//! runtime's command line (`oci`: runc, crun, runsc, ...). At start each handler is checked:
//! an `oci` handler whose binary is not an executable file is logged and left out, and the
//! features of each usable one are probed, not assumed: `<binary> features` (the OCI runtime
//! features document, runc 1.1+) says whether it knows the `rro` mount option and user
//! namespaces; a runtime without that command is tried with small trial containers
//! (`trial.rs`), which also leave out, with the runtime's reason, one that cannot create
//! containers on this node. A user-namespaced
//! pod's namespaces and idmapped mounts are made by crius itself, so the runtime only has to
//! join a user namespace by path: it needs no idmapped mount support of its own.
//!
//! A pod's sandbox and every container in it run under the pod's handler.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crius_api::shim::OciRuntime;
use crius_api::v1::{RuntimeHandler, RuntimeHandlerFeatures};

use crate::config::{HandlerConfig, HandlerType, RuntimeConfig};
use crate::error::{Error, Result};
use crate::util::excerpt;

mod probe_cache;
mod trial;

/// Where trial containers are made (the daemon's state directory) and the pause binary they
/// hold.
#[derive(Debug, Clone, Copy)]
pub struct TrialPlace<'a> {
    pub state: &'a Path,
    pub pause: &'a Path,
}

/// A usable handler: its configuration and what it was found to support.
#[derive(Debug, Clone)]
pub struct Handler {
    pub name: String,
    pub config: HandlerConfig,
    /// Whether a mount may be recursively read-only (the `rro` option).
    pub recursive_read_only: bool,
    /// Whether it runs user-namespaced pods.
    pub user_namespaces: bool,
    /// What it can do with CRIU, probed at start (see [`Handler::checkpoint_support`]).
    pub criu: CheckpointSupport,
}

impl Handler {
    /// Handler `name` with what an earlier probe found.
    fn found(name: &str, config: &HandlerConfig, found: probe_cache::Found) -> Handler {
        Handler {
            name: name.to_owned(),
            config: config.clone(),
            recursive_read_only: found.rro,
            user_namespaces: found.user_namespaces,
            criu: found.criu,
        }
    }

    /// What its probe found, to keep.
    fn found_by_probe(&self) -> probe_cache::Found {
        probe_cache::Found {
            rro: self.recursive_read_only,
            user_namespaces: self.user_namespaces,
            criu: self.criu,
        }
    }

    /// The OCI runtime for the shim, `None` for the built-in path.
    pub fn oci_runtime(&self) -> Option<OciRuntime> {
        (self.config.kind == HandlerType::Oci).then(|| OciRuntime {
            binary: self.config.binary.clone(),
            root: (!self.config.root.as_os_str().is_empty()).then(|| self.config.root.clone()),
            options: self.config.options.clone(),
        })
    }

    /// What this handler's runtime can do with CRIU: libcontainer 0.7 checkpoints but has no
    /// restore; an OCI runtime whatever its `checkpoint` and `restore` commands answer to
    /// `--help` at start (runc has both; Debian's crun 1.8 is built without CRIU and knows
    /// neither); gVisor (runsc) has a mechanism of its own that yields no CRIU images.
    pub fn checkpoint_support(&self) -> CheckpointSupport {
        self.criu
    }

    /// Whether privileged containers get the host's devices.
    pub fn host_devices_for_privileged(&self) -> bool {
        !self.config.privileged_without_host_devices
    }

    /// The pod annotations that also go into each container's spec.
    pub fn pod_annotations_for_containers<'a>(
        &self,
        pod: &'a std::collections::HashMap<String, String>,
    ) -> Vec<(&'a String, &'a String)> {
        pod.iter()
            .filter(|(k, _)| matches_any(&self.config.pod_annotations, k))
            .collect()
    }

    /// Whether a container annotation reaches the container's spec.
    pub fn passes_container_annotation(&self, key: &str) -> bool {
        self.config.container_annotations.is_empty()
            || matches_any(&self.config.container_annotations, key)
    }
}

/// What a handler can do with CRIU (see [`Handler::checkpoint_support`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum CheckpointSupport {
    None,
    Checkpoint,
    CheckpointRestore,
}

impl CheckpointSupport {
    /// For `Status` (verbose) and `crius status`.
    pub fn describe(self) -> &'static str {
        match self {
            CheckpointSupport::None => "none",
            CheckpointSupport::Checkpoint => "checkpoint",
            CheckpointSupport::CheckpointRestore => "checkpoint, restore",
        }
    }
}

/// `key` equals a pattern, or starts with the part of a `prefix*` pattern before the `*`.
fn matches_any(patterns: &[String], key: &str) -> bool {
    patterns.iter().any(|p| match p.strip_suffix('*') {
        Some(prefix) => key.starts_with(prefix),
        None => p == key,
    })
}

/// The handlers of this node.
#[derive(Debug, Clone)]
pub struct Handlers {
    default: String,
    usable: BTreeMap<String, Handler>,
    /// Configured but unusable handlers, and why.
    unusable: BTreeMap<String, String>,
}

impl Handlers {
    /// Checks every configured handler; `builtin` is what the built-in path supports (rro,
    /// user namespaces), probed by the caller. With `trials`, an `oci` runtime without a
    /// `features` command is tried with trial containers (in parallel, one thread per handler).
    pub fn probe(
        config: &RuntimeConfig,
        builtin_rro: bool,
        builtin_userns: bool,
        trials: Option<TrialPlace<'_>>,
    ) -> Handlers {
        /// A handler's probe: its outcome, how long it took, whether an earlier probe's
        /// findings were used, and the key to keep new findings under (`None`: not kept).
        struct Probed {
            result: std::result::Result<Handler, String>,
            took: Duration,
            before: bool,
            key: Option<probe_cache::Key>,
        }
        // Only where trial containers may be made, in the state directory.
        let mut cache = trials.map(|place| probe_cache::Cache::load(place.state));
        let probed: Vec<(String, Probed)> = std::thread::scope(|s| {
            let cache = cache.as_ref();
            let jobs: Vec<_> = config
                .handlers
                .iter()
                .map(|(name, h)| {
                    let job = move || {
                        let started = std::time::Instant::now();
                        let key = match (cache, h.kind) {
                            (Some(_), HandlerType::Oci) => {
                                probe_cache::Key::of(h, builtin_rro, builtin_userns)
                            }
                            _ => None,
                        };
                        let kept = key
                            .as_ref()
                            .and_then(|k| cache.and_then(|c| c.get(name, k)));
                        if let Some(found) = kept {
                            return Probed {
                                result: Ok(Handler::found(name, h, found)),
                                took: started.elapsed(),
                                before: true,
                                key: None,
                            };
                        }
                        let result = probe_one(name, h, builtin_rro, builtin_userns, trials);
                        Probed {
                            result,
                            took: started.elapsed(),
                            before: false,
                            key,
                        }
                    };
                    (name.clone(), s.spawn(job))
                })
                .collect();
            jobs.into_iter()
                .map(|(name, job)| {
                    let result = job.join().unwrap_or_else(|_| Probed {
                        result: Err("its probe panicked".to_string()),
                        took: Duration::ZERO,
                        before: false,
                        key: None,
                    });
                    (name, result)
                })
                .collect()
        });
        let mut usable = BTreeMap::new();
        let mut unusable = BTreeMap::new();
        for (name, probe) in probed {
            let Probed {
                result,
                took,
                before,
                key,
            } = probe;
            match result {
                Ok(handler) => {
                    tracing::info!(
                        handler = %name,
                        recursive_read_only = handler.recursive_read_only,
                        user_namespaces = handler.user_namespaces,
                        probe_ms = took.as_millis() as u64,
                        probed_before = before,
                        "runtime handler"
                    );
                    if let (Some(cache), Some(key)) = (cache.as_mut(), key) {
                        cache.put(&name, key, handler.found_by_probe());
                    }
                    usable.insert(name, handler);
                }
                Err(why) => {
                    tracing::warn!(handler = %name, "runtime handler left out: {why}");
                    unusable.insert(name, why);
                }
            }
        }
        if let Some(cache) = cache.as_mut() {
            cache.retain(|name| usable.contains_key(name));
            cache.save();
        }
        Handlers {
            default: config.default_handler.clone(),
            usable,
            unusable,
        }
    }

    /// The handler a pod asked for (`""`: the default one).
    pub fn get(&self, name: &str) -> Result<&Handler> {
        let key = if name.is_empty() { &self.default } else { name };
        if let Some(h) = self.usable.get(key) {
            return Ok(h);
        }
        if let Some(why) = self.unusable.get(key) {
            return Err(Error::FailedPrecondition(format!(
                "runtime_handler {key:?} is configured but not usable on this node: {why}"
            )));
        }
        Err(Error::InvalidArgument(format!(
            "runtime_handler {:?} is not configured (configured: {})",
            excerpt(name),
            self.usable
                .keys()
                .chain(self.unusable.keys())
                .map(String::as_str)
                .collect::<Vec<_>>()
                .join(", ")
        )))
    }

    /// The handler that runs a container restored in a pod of `pod_handler`: that one if it
    /// restores; for the built-in one (libcontainer 0.7 has no restore), the usable `runc`
    /// handler, whose restore takes the built-in handler's checkpoints too, so that the
    /// container runs under runc inside the built-in pod; else none.
    pub fn restorer(&self, pod_handler: &Handler) -> Option<&Handler> {
        match pod_handler.checkpoint_support() {
            CheckpointSupport::CheckpointRestore => self.usable.get(&pod_handler.name),
            CheckpointSupport::Checkpoint => self
                .usable
                .get("runc")
                .filter(|h| h.checkpoint_support() == CheckpointSupport::CheckpointRestore),
            CheckpointSupport::None => None,
        }
    }

    /// Every usable handler by name.
    pub fn usable(&self) -> impl Iterator<Item = &Handler> {
        self.usable.values()
    }

    /// `Status.runtime_handlers`: the default handler under the empty name, then every usable
    /// one by name.
    pub fn status(&self) -> Vec<RuntimeHandler> {
        let entry = |name: &str, h: &Handler| RuntimeHandler {
            name: name.to_owned(),
            features: Some(RuntimeHandlerFeatures {
                recursive_read_only_mounts: h.recursive_read_only,
                user_namespaces: h.user_namespaces,
            }),
        };
        let mut out = Vec::with_capacity(self.usable.len() + 1);
        if let Some(h) = self.usable.get(&self.default) {
            out.push(entry("", h));
        }
        out.extend(self.usable.iter().map(|(name, h)| entry(name, h)));
        out
    }
}

/// One handler's probe: the handler with its features, or why it is not usable.
fn probe_one(
    name: &str,
    h: &HandlerConfig,
    builtin_rro: bool,
    builtin_userns: bool,
    trials: Option<TrialPlace<'_>>,
) -> std::result::Result<Handler, String> {
    let (rro, userns) = match h.kind {
        HandlerType::Builtin => (builtin_rro, builtin_userns),
        HandlerType::Oci => {
            executable(&h.binary)?;
            let (rro, userns) = match (probe_features(&h.binary), trials) {
                (Some(found), _) => found,
                (None, Some(place)) => {
                    let found = trial::run(name, h, place.state, place.pause, builtin_userns)?;
                    (found.rro, found.user_namespaces)
                }
                (None, None) => (false, false),
            };
            (rro && builtin_rro, userns && builtin_userns)
        }
    };
    Ok(Handler {
        name: name.to_owned(),
        config: h.clone(),
        recursive_read_only: rro,
        user_namespaces: userns,
        criu: probe_criu(h),
    })
}

/// What handler `h` can do with CRIU (see [`Handler::checkpoint_support`]).
fn probe_criu(h: &HandlerConfig) -> CheckpointSupport {
    match h.kind {
        HandlerType::Builtin => CheckpointSupport::Checkpoint,
        HandlerType::Oci if h.binary.file_name().and_then(|n| n.to_str()) == Some("runsc") => {
            CheckpointSupport::None
        }
        HandlerType::Oci => {
            let knows = |command: &str| {
                answers(Command::new(&h.binary).args([command, "--help"])).is_some_and(|ok| ok)
            };
            match (knows("checkpoint"), knows("restore")) {
                (true, true) => CheckpointSupport::CheckpointRestore,
                (true, false) => CheckpointSupport::Checkpoint,
                _ => CheckpointSupport::None,
            }
        }
    }
}

/// Runs `cmd` with no input and its output discarded: `Some(success)` when it ends within two
/// seconds, else `None` (it is killed).
fn answers(cmd: &mut Command) -> Option<bool> {
    let mut child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    wait_bounded(&mut child, Duration::from_secs(2))
        .ok()?
        .map(|status| status.success())
}

/// Waits for `child` at most `limit`: `Ok(None)` when it had to be killed (and is reaped).
/// What it wrote to a pipe stays there for the caller (a probe's output is small).
pub(crate) fn wait_bounded(
    child: &mut std::process::Child,
    limit: Duration,
) -> std::io::Result<Option<std::process::ExitStatus>> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Whether `path` is an executable regular file, else why not.
fn executable(path: &Path) -> std::result::Result<(), String> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => Ok(()),
        Ok(_) => Err(format!("{} is not an executable file", path.display())),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// (`rro` known, user namespaces known) from `<binary> features`; `None` when the runtime has
/// no such command (or does not answer with a features document within two seconds).
fn probe_features(binary: &Path) -> Option<(bool, bool)> {
    let mut child = Command::new(binary)
        .arg("features")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    wait_bounded(&mut child, Duration::from_secs(2)).ok()??;
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take()?, &mut out).ok()?;
    features_from(&out)
}

/// (`rro` known, user namespaces known) from an OCI runtime features document; `None` when
/// `json` is not one.
fn features_from(json: &str) -> Option<(bool, bool)> {
    let doc = serde_json::from_str::<serde_json::Value>(json).ok()?;
    doc.as_object()?;
    let rro = doc
        .get("mountOptions")
        .and_then(|m| m.as_array())
        .is_some_and(|opts| opts.iter().any(|o| o.as_str() == Some("rro")));
    let linux = doc.get("linux");
    let user_ns = linux
        .and_then(|l| l.get("namespaces"))
        .and_then(|n| n.as_array())
        .is_some_and(|ns| ns.iter().any(|n| n.as_str() == Some("user")));
    Some((rro, user_ns))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_support_is_probed() {
        assert_eq!(
            probe_criu(&HandlerConfig::builtin()),
            CheckpointSupport::Checkpoint
        );
        assert_eq!(
            probe_criu(&HandlerConfig::oci("/usr/bin/runsc")),
            CheckpointSupport::None
        );
        // Not by name: a runtime that knows neither command supports neither.
        assert_eq!(
            probe_criu(&HandlerConfig::oci("/bin/false")),
            CheckpointSupport::None
        );
        assert_eq!(
            probe_criu(&HandlerConfig::oci("/nonexistent/runc")),
            CheckpointSupport::None
        );
        // `true` answers every command: both.
        assert_eq!(
            probe_criu(&HandlerConfig::oci("/bin/true")),
            CheckpointSupport::CheckpointRestore
        );
    }

    #[test]
    fn features_documents_are_read() {
        assert_eq!(features_from(""), None);
        assert_eq!(features_from("Usage: crun [OPTION...]"), None);
        assert_eq!(features_from("{}"), Some((false, false)));
        assert_eq!(
            features_from(r#"{"mountOptions":["ro","rro"],"linux":{"namespaces":["pid"]}}"#),
            Some((true, false))
        );
        assert_eq!(
            features_from(r#"{"mountOptions":["ro"],"linux":{"namespaces":["user","pid"]}}"#),
            Some((false, true))
        );
    }

    #[test]
    fn annotation_patterns() {
        let p = vec!["dev.gvisor.*".to_owned(), "exact".to_owned()];
        assert!(matches_any(&p, "dev.gvisor.spec.mount.x"));
        assert!(matches_any(&p, "exact"));
        assert!(!matches_any(&p, "exactly"));
        assert!(!matches_any(&p, "dev.other"));
    }

    /// A runtime that answers `features` and `--help` and notes each call in `calls`.
    fn counting_runtime(dir: &Path, calls: &Path, extra: &str) -> std::path::PathBuf {
        let bin = dir.join("counting-runtime");
        let script = format!(
            "#!/bin/sh\necho \"$1\" >> {}\n{extra}\ncase \"$1\" in features) \
             echo '{{\"mountOptions\":[\"rro\"],\"linux\":{{\"namespaces\":[\"user\"]}}}}';; \
             esac\nexit 0\n",
            calls.display()
        );
        std::fs::write(&bin, script).unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        bin
    }

    #[test]
    fn a_restart_uses_what_the_last_probe_found_until_a_binary_changes() {
        let state = tempfile::tempdir().unwrap();
        let calls = state.path().join("calls");
        let bin = counting_runtime(state.path(), &calls, "");
        let mut config = RuntimeConfig::default();
        config.handlers.retain(|name, _| name == "crius");
        config.handlers.insert(
            "counted".into(),
            HandlerConfig {
                kind: HandlerType::Oci,
                binary: bin.clone(),
                ..HandlerConfig::builtin()
            },
        );
        let place = TrialPlace {
            state: state.path(),
            pause: Path::new("/nonexistent/pause"),
        };
        let ran = || {
            std::fs::read_to_string(&calls)
                .unwrap_or_default()
                .lines()
                .count()
        };
        let probe = |config: &RuntimeConfig| Handlers::probe(config, true, true, Some(place));

        let first = probe(&config);
        let probed = ran();
        assert_eq!(probed, 3, "features, checkpoint --help, restore --help");
        let h = first.get("counted").unwrap();
        assert!(h.recursive_read_only && h.user_namespaces);
        assert_eq!(h.checkpoint_support(), CheckpointSupport::CheckpointRestore);

        let second = probe(&config);
        assert_eq!(ran(), probed, "the runtime is not run again");
        let again = second.get("counted").unwrap();
        assert_eq!(again.found_by_probe(), h.found_by_probe());

        // A new binary (here, one line longer) is probed again, and so is one whose node
        // offers less.
        counting_runtime(state.path(), &calls, ":");
        probe(&config);
        assert_eq!(ran(), probed * 2);
        let less = Handlers::probe(&config, true, false, Some(place));
        assert_eq!(ran(), probed * 3);
        assert!(!less.get("counted").unwrap().user_namespaces);

        // A handler no longer configured is forgotten; an unreadable file is no cache.
        config.handlers.remove("counted");
        probe(&config);
        let kept = std::fs::read_to_string(state.path().join("handler-probes.json")).unwrap();
        assert!(!kept.contains("counted"), "{kept}");
        std::fs::write(state.path().join("handler-probes.json"), "not json").unwrap();
        assert!(probe(&config).get("crius").is_ok());
    }

    #[test]
    fn unknown_and_unusable_handlers_are_told_apart() {
        let mut config = RuntimeConfig::default();
        config.handlers.insert(
            "ghost".into(),
            HandlerConfig {
                binary: "/nonexistent/ghost-runtime".into(),
                ..config.handlers["runc"].clone()
            },
        );
        let h = Handlers::probe(&config, true, true, None);
        assert_eq!(h.get("").unwrap().name, "crius");
        let e = h.get("ghost").unwrap_err();
        assert!(matches!(e, Error::FailedPrecondition(_)), "{e}");
        assert!(e.to_string().contains("/nonexistent/ghost-runtime"), "{e}");
        let e = h.get("kata").unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        assert!(e.to_string().contains("\"kata\""), "{e}");
        assert!(e.to_string().contains("crius"), "{e}");
        assert!(h.status().iter().all(|s| s.name != "ghost"));
        assert_eq!(h.status()[0].name, "");
    }
}
