//! The daemon configuration: one TOML file, every key optional, defaults built in.
//!
//! `DEFAULT_CONFIG` is the text `crius config default` prints; a unit test keeps it equal to
//! `Config::default()`, so the documented defaults cannot drift from the real ones.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Where crius looks for its configuration when `--config` is not given.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/crius/config.toml";

/// The default `[runtime] criu_path`: `criu` in `$PATH`.
pub const DEFAULT_CRIU: &str = "criu";

/// The complete default configuration, with a one-line comment for each key.
pub const DEFAULT_CONFIG: &str = r#"# crius configuration. Every key is optional; the values below are the built-in defaults.

# Persistent data: the database, image content and snapshots, container layers.
root = "/var/lib/crius"
# Runtime state that lasts until reboot: sockets, shims, bundles, netns pins.
state = "/run/crius"
# The gRPC endpoint for kubelet, crictl and critest (unix:// only).
listen = "unix:///run/crius/crius.sock"
# Log level: error, warn, info, debug, trace, or a tracing filter such as "info,crius=debug".
# SIGHUP re-reads it from this file (a --log-level flag wins over the file).
log_level = "info"
# Log lines as "text" or as one JSON object each ("json"), on stderr.
log_format = "text"

[registry]
# Directory of per-registry <host>/hosts.toml files (mirrors, TLS, capabilities), containerd's layout.
config_path = "/etc/crius/certs.d"
# How many blobs are downloaded at the same time, across all pulls.
max_concurrent_downloads = 3
# A download that receives no byte for this many seconds is cancelled.
stall_timeout_secs = 60
# Registry credentials for pulls whose request carries none, in the docker config.json format
# ({"auths": {"<host>": {"auth": "<base64 user:password>"}}}), read at each pull; each entry
# goes only to the registry host it names (a mirror gets only its own). Empty: none.
auth_file = ""

[cni]
# Directory holding the pod network configuration (.conflist, .conf or .json; the first by name wins).
conf_dir = "/etc/cni/net.d"
# Directories searched in order for CNI plugin binaries.
bin_dirs = ["/opt/cni/bin", "/usr/lib/cni"]
# Seconds one CNI plugin call may take before it is killed.
plugin_timeout_secs = 60
# A network config template: when kubelet sends the node's pod CIDR (UpdateRuntimeConfig) and
# conf_dir has no network config, conf_dir/10-crius-pod-cidr.conflist is written from it with
# {{.PodCIDR}}, {{.PodCIDRRanges}} and {{.Routes}} filled in. Empty: no template.
conf_template = ""

[cgroup]
# Who manages pod and container cgroups: "cgroupfs" (crius writes /sys/fs/cgroup itself) or
# "systemd" (each container in a transient scope crius-<id>.scope in the pod's slice, as
# kubelet's cgroupDriver = "systemd" expects; crius refuses to start when systemd does not
# answer at systemd_socket). Must match kubelet's cgroupDriver.
driver = "cgroupfs"
# systemd's private D-Bus socket, used by the "systemd" driver.
systemd_socket = "/run/systemd/private"

[runtime]
# The per-pod shim binary; empty means crius-shim next to the crius binary.
shim_path = ""
# Size in bytes of a pod's /dev/shm tmpfs (unless the pod uses the host IPC namespace).
shm_size = 67108864
# Longest container log line in bytes (containerd's name); longer output is split into partial
# (P) lines of this size. 1 to 16777216.
max_container_log_line_size = 16384
# Volumes an image declares (VOLUME in its config) get no directory of their own and stay part
# of the container's rootfs (containerd's name).
ignore_image_defined_volumes = false
# Seconds crius waits for a pod's shim to create, start or delete a container (work the shim
# does through libcontainer, which it gives up on after 60 s). A create crius stops waiting for
# is removed once the shim has finished it. 1 to 600.
shim_operation_timeout_secs = 75
# The criu binary that checkpoints containers (CheckpointContainer) and restores them (a
# CreateContainer whose image is a checkpoint archive); a bare name is looked up in $PATH.
# libcontainer and the OCI runtimes run it as `criu` from $PATH, with its directory put first.
# With this default failing `criu check`, the criu contrib/criu/install puts in
# /opt/crius/criu/bin (`make run` runs it) is tried next.
criu_path = "criu"
# The handler of pods that name none (kubelet sends "" without a RuntimeClass).
default_handler = "crius"

# RuntimeClass handlers: a RuntimeClass's `handler` names one of these tables. type "builtin" is
# crius's own path (libcontainer, in the pod's shim); type "oci" runs an OCI runtime's command
# line (create, start, kill, delete, exec) from the pod's shim, which still owns logs, exits,
# exec and attach. Keys of an "oci" handler:
#   binary      the runtime's executable (absolute); a handler whose binary is missing is
#               logged at start and left out (RunPodSandbox with it fails)
#   root        its state directory (--root); empty: a directory in the pod's shim state
#   options     global flags put before every operation (e.g. ["--platform=ptrace"])
#   privileged_without_host_devices   privileged containers get no host devices (sandboxed
#               runtimes such as gVisor have no use for them)
#   pod_annotations        pod annotation keys ("prefix*" for a prefix) also given to every
#               container's spec, as gVisor's dev.gvisor.* settings need
#   container_annotations  container annotation keys that reach the container's spec; empty:
#               all of them
# A table of another name adds a handler; one of a name below replaces that handler.
[runtime.handlers.crius]
# crius's own path.
type = "builtin"

[runtime.handlers.runc]
# runc, driven by its command line.
type = "oci"
# Debian's runc.
binary = "/usr/sbin/runc"

[runtime.handlers.crun]
# crun, driven by its command line.
type = "oci"
# Debian's crun.
binary = "/usr/bin/crun"

[runtime.handlers.runsc]
# gVisor, driven by its command line.
type = "oci"
# Debian's runsc.
binary = "/usr/bin/runsc"
# The pod's network namespace through the host kernel's stack. Debian 12's runsc (20221219)
# takes any namespace for the host's on kernels that give every namespace its own
# net.core.rmem_default, and then refuses gVisor's own network stack.
options = ["--network=host"]
# A gVisor sandbox has its own kernel: host devices are no use to it.
privileged_without_host_devices = true
# gVisor's pod-wide settings reach every container.
pod_annotations = ["dev.gvisor.*"]

[stream]
# Address the streaming server for exec, attach and port-forward listens on.
address = "127.0.0.1"
# Port of the streaming server; 0 picks a free port at start.
port = 0
# Seconds a client may take to send a request's line and headers (also the longest idle wait
# between requests); slower connections are closed.
header_timeout_secs = 10
# Connections that have not yet become an exec, attach or port-forward session, at most; more
# are closed at once, so idle or slow clients cannot take crius's file descriptors.
max_pending_connections = 128
# Of those, at most this many from one peer: a user of this node (told apart by the owner of
# its socket) or a remote address, so that no one local user can take every place.
max_pending_per_peer = 32
# An exec, attach or port-forward session with no traffic either way for this long is closed
# (kubelet's --streaming-connection-idle-timeout is 4 hours too).
idle_timeout_secs = 14400
# Serve the stream URLs over TLS (https://) with this PEM certificate chain...
tls_cert_file = ""
# ...and this PEM private key (both or neither; read at start).
tls_key_file = ""
# Serve over TLS with a self-signed certificate made at start when no files are given
# (containerd's enable_tls_streaming). Clients must skip verification, as crictl and kubelet's
# stream proxy do.
enable_tls = false

[images]
# Images kubelet's garbage collection keeps: ImageStatus and ListImages report them pinned, and
# RemoveImage refuses them. Each entry is a reference (tag or digest form, as ListImages shows
# it: "registry.k8s.io/pause:3.10") where "*" stands for any run of characters
# ("registry.k8s.io/*"). SIGHUP applies a change.
pinned = []

[metrics]
# Where Prometheus scrapes crius's metrics (http://<address>/metrics), e.g. "127.0.0.1:1338".
# Empty: no metrics endpoint. SIGHUP applies a change.
address = ""
# The first part of every metric name. "containerd" gives the names of containerd's CRI
# metrics (containerd_cri_sandbox_runtime_create_seconds, ...), so existing dashboards work.
namespace = "crius"

[nri]
# Node Resource Interface: plugins (topology-aware placement, device injection, policies) see
# every pod and container event and may adjust containers before they are created. containerd's
# keys and defaults.
enable = true
# Where external plugins connect (root only).
socket_path = "/var/run/nri/nri.sock"
# Plugins crius starts itself: executables named "<two-digit index>-<name>" in this directory...
plugin_path = "/opt/nri/plugins"
# ...each given "<index>-<name>.conf" or "<name>.conf" from here as its configuration.
plugin_config_path = "/etc/nri/conf.d"
# How long a plugin may take to register, be configured and be synchronized ("5s", "500ms")...
plugin_registration_timeout = "5s"
# ...and to answer one event; a plugin that does not is disconnected.
plugin_request_timeout = "2s"
# Serve no socket: only the plugins of plugin_path.
disable_connections = false
"#;

/// The effective configuration of a running crius.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// The files this configuration was read from; not a key of the file.
    #[serde(skip)]
    pub source: ConfigSource,
    pub root: PathBuf,
    pub state: PathBuf,
    pub listen: String,
    pub log_level: String,
    pub log_format: LogFormat,
    pub registry: RegistryConfig,
    pub cni: CniConfig,
    pub cgroup: CgroupConfig,
    pub runtime: RuntimeConfig,
    pub stream: StreamConfig,
    pub images: ImagesConfig,
    pub metrics: MetricsConfig,
    pub nri: NriConfig,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ImagesConfig {
    pub pinned: Vec<String>,
}

impl ImagesConfig {
    /// The first `pinned` pattern one of `names` matches.
    pub fn pinned_by<'a>(&'a self, names: &[String]) -> Option<&'a str> {
        self.pinned
            .iter()
            .find(|p| names.iter().any(|n| glob_match(p, n)))
            .map(String::as_str)
    }
}

/// Whether `text` matches `pattern`, in which `*` stands for any run of characters.
fn glob_match(pattern: &str, text: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RuntimeConfig {
    pub shim_path: PathBuf,
    pub shm_size: u64,
    pub max_container_log_line_size: u64,
    pub ignore_image_defined_volumes: bool,
    pub shim_operation_timeout_secs: u64,
    pub criu_path: PathBuf,
    pub default_handler: String,
    /// The built-in handlers, each replaced by the configured table of its name, and the
    /// configured others.
    #[serde(deserialize_with = "with_builtin_handlers")]
    pub handlers: BTreeMap<String, HandlerConfig>,
}

fn with_builtin_handlers<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, HandlerConfig>, D::Error> {
    let configured = BTreeMap::<String, HandlerConfig>::deserialize(d)?;
    let mut handlers = RuntimeConfig::default().handlers;
    handlers.extend(configured);
    Ok(handlers)
}

/// How a handler runs its pods' containers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HandlerType {
    /// crius's own path: libcontainer in the shim's helpers.
    Builtin,
    /// An OCI runtime's command line.
    Oci,
}

/// One `[runtime.handlers.<name>]` table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HandlerConfig {
    #[serde(rename = "type")]
    pub kind: HandlerType,
    #[serde(default, skip_serializing_if = "is_empty_path")]
    pub binary: PathBuf,
    #[serde(default, skip_serializing_if = "is_empty_path")]
    pub root: PathBuf,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub privileged_without_host_devices: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pod_annotations: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub container_annotations: Vec<String>,
}

fn is_empty_path(p: &Path) -> bool {
    p.as_os_str().is_empty()
}

impl HandlerConfig {
    pub(crate) fn builtin() -> HandlerConfig {
        HandlerConfig {
            kind: HandlerType::Builtin,
            binary: PathBuf::new(),
            root: PathBuf::new(),
            options: Vec::new(),
            privileged_without_host_devices: false,
            pod_annotations: Vec::new(),
            container_annotations: Vec::new(),
        }
    }

    pub(crate) fn oci(binary: &str) -> HandlerConfig {
        HandlerConfig {
            kind: HandlerType::Oci,
            binary: PathBuf::from(binary),
            ..HandlerConfig::builtin()
        }
    }
}

/// The largest `[runtime] max_container_log_line_size`: a shim holds up to one such line per
/// stream in memory.
pub const MAX_LOG_LINE_LIMIT: u64 = 16 << 20;

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            shim_path: PathBuf::new(),
            shm_size: 64 << 20,
            max_container_log_line_size: 16 * 1024,
            ignore_image_defined_volumes: false,
            shim_operation_timeout_secs: 75,
            criu_path: PathBuf::from(DEFAULT_CRIU),
            default_handler: "crius".to_string(),
            handlers: BTreeMap::from([
                ("crius".to_string(), HandlerConfig::builtin()),
                ("runc".to_string(), HandlerConfig::oci("/usr/sbin/runc")),
                ("crun".to_string(), HandlerConfig::oci("/usr/bin/crun")),
                (
                    "runsc".to_string(),
                    HandlerConfig {
                        privileged_without_host_devices: true,
                        pod_annotations: vec!["dev.gvisor.*".to_string()],
                        options: vec!["--network=host".to_string()],
                        ..HandlerConfig::oci("/usr/bin/runsc")
                    },
                ),
            ]),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RegistryConfig {
    pub config_path: PathBuf,
    pub max_concurrent_downloads: usize,
    pub stall_timeout_secs: u64,
    pub auth_file: PathBuf,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CniConfig {
    pub conf_dir: PathBuf,
    pub bin_dirs: Vec<PathBuf>,
    pub plugin_timeout_secs: u64,
    pub conf_template: PathBuf,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CgroupConfig {
    pub driver: CgroupDriver,
    pub systemd_socket: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum CgroupDriver {
    #[default]
    Cgroupfs,
    Systemd,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StreamConfig {
    pub address: String,
    pub port: u16,
    pub header_timeout_secs: u64,
    pub max_pending_connections: usize,
    pub max_pending_per_peer: usize,
    pub idle_timeout_secs: u64,
    pub tls_cert_file: PathBuf,
    pub tls_key_file: PathBuf,
    pub enable_tls: bool,
}

impl StreamConfig {
    /// Whether the stream URLs are https.
    pub fn tls(&self) -> bool {
        self.enable_tls || !self.tls_cert_file.as_os_str().is_empty()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    pub address: String,
    pub namespace: String,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            address: String::new(),
            namespace: "crius".to_string(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NriConfig {
    pub enable: bool,
    pub socket_path: PathBuf,
    pub plugin_path: PathBuf,
    pub plugin_config_path: PathBuf,
    pub plugin_registration_timeout: String,
    pub plugin_request_timeout: String,
    pub disable_connections: bool,
}

impl Default for NriConfig {
    fn default() -> Self {
        NriConfig {
            enable: true,
            socket_path: PathBuf::from("/var/run/nri/nri.sock"),
            plugin_path: PathBuf::from("/opt/nri/plugins"),
            plugin_config_path: PathBuf::from("/etc/nri/conf.d"),
            plugin_registration_timeout: "5s".to_string(),
            plugin_request_timeout: "2s".to_string(),
            disable_connections: false,
        }
    }
}

impl NriConfig {
    /// `plugin_registration_timeout` (checked when the configuration was read).
    pub fn registration_timeout(&self) -> std::time::Duration {
        parse_duration(&self.plugin_registration_timeout)
            .unwrap_or(std::time::Duration::from_secs(5))
    }

    /// `plugin_request_timeout` (checked when the configuration was read).
    pub fn request_timeout(&self) -> std::time::Duration {
        parse_duration(&self.plugin_request_timeout).unwrap_or(std::time::Duration::from_secs(2))
    }
}

/// `"500ms"`, `"2s"`, `"1m"`: a positive whole number and a unit.
pub fn parse_duration(text: &str) -> Option<std::time::Duration> {
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (n, unit) = text.split_at(split);
    let n: u64 = n.parse().ok().filter(|n| *n > 0)?;
    let ms = match unit {
        "ms" => n,
        "s" => n.checked_mul(1000)?,
        "m" => n.checked_mul(60_000)?,
        _ => return None,
    };
    Some(std::time::Duration::from_millis(ms))
}

impl Default for Config {
    fn default() -> Self {
        Config {
            source: ConfigSource::default(),
            root: PathBuf::from("/var/lib/crius"),
            state: PathBuf::from("/run/crius"),
            listen: "unix:///run/crius/crius.sock".to_string(),
            log_level: "info".to_string(),
            log_format: LogFormat::Text,
            registry: RegistryConfig::default(),
            cni: CniConfig::default(),
            cgroup: CgroupConfig::default(),
            runtime: RuntimeConfig::default(),
            stream: StreamConfig::default(),
            images: ImagesConfig::default(),
            metrics: MetricsConfig::default(),
            nri: NriConfig::default(),
        }
    }
}

impl Default for RegistryConfig {
    fn default() -> Self {
        RegistryConfig {
            config_path: PathBuf::from("/etc/crius/certs.d"),
            max_concurrent_downloads: 3,
            stall_timeout_secs: 60,
            auth_file: PathBuf::new(),
        }
    }
}

impl Default for CniConfig {
    fn default() -> Self {
        CniConfig {
            conf_dir: PathBuf::from("/etc/cni/net.d"),
            bin_dirs: vec![PathBuf::from("/opt/cni/bin"), PathBuf::from("/usr/lib/cni")],
            plugin_timeout_secs: 60,
            conf_template: PathBuf::new(),
        }
    }
}

impl Default for CgroupConfig {
    fn default() -> Self {
        CgroupConfig {
            driver: CgroupDriver::Cgroupfs,
            systemd_socket: PathBuf::from("/run/systemd/private"),
        }
    }
}

impl Default for StreamConfig {
    fn default() -> Self {
        StreamConfig {
            address: "127.0.0.1".to_string(),
            port: 0,
            header_timeout_secs: 10,
            max_pending_connections: 128,
            max_pending_per_peer: 32,
            idle_timeout_secs: 4 * 3600,
            tls_cert_file: PathBuf::new(),
            tls_key_file: PathBuf::new(),
            enable_tls: false,
        }
    }
}

/// Why a configuration could not be loaded. The message names the file, line and key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("read config {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}: {key}: {message}")]
    Parse {
        path: PathBuf,
        line: usize,
        key: String,
        message: String,
    },
    #[error("{path}: {key}: {message}")]
    Invalid {
        path: PathBuf,
        key: &'static str,
        message: String,
    },
}

impl Config {
    /// Loads `path`, then the drop-ins of [`drop_in_dir`] in name order, each key of a later
    /// file replacing the same key of an earlier one. A missing `path` is the defaults when
    /// `required` is false (the default path need not exist); an explicitly named file must
    /// exist. Each file is checked on its own first, so an error names its file and line.
    pub fn load(path: &Path, required: bool) -> Result<Config, ConfigError> {
        let read = |p: &Path| {
            std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                path: p.to_path_buf(),
                source,
            })
        };
        let mut files = Vec::new();
        match std::fs::read_to_string(path) {
            Ok(text) => files.push((path.to_path_buf(), text)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => {}
            Err(source) => {
                return Err(ConfigError::Read {
                    path: path.to_path_buf(),
                    source,
                })
            }
        }
        for p in drop_ins(path)? {
            let text = read(&p)?;
            files.push((p, text));
        }
        let mut merged = toml::Table::new();
        for (p, text) in &files {
            Config::parse(text, p)?;
            if let Ok(table) = toml::from_str::<toml::Table>(text) {
                merge(&mut merged, table);
            }
        }
        let mut config = Config::deserialize(merged).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            line: 0,
            key: String::new(),
            message: format!("the files together: {}", e.message().trim()),
        })?;
        config.validate(path)?;
        config.source = ConfigSource {
            path: Some(path.to_path_buf()),
            files: files.into_iter().map(|(p, _)| p).collect(),
        };
        Ok(config)
    }

    /// Parses TOML text; errors carry `path`, the line and the dotted key at fault.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        toml::from_str(text).map_err(|e| {
            let offset = e.span().map(|s| s.start).unwrap_or(0);
            let (line, key) = locate(text, offset);
            ConfigError::Parse {
                path: path.to_path_buf(),
                line,
                key,
                message: e.message().trim().to_string(),
            }
        })
    }

    /// Checks what the types alone cannot.
    pub fn validate(&self, path: &Path) -> Result<(), ConfigError> {
        let invalid = |key, message: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            key,
            message,
        };
        self.socket_path()
            .map_err(|m| invalid("listen", format!("{m}: {:?}", self.listen)))?;
        if !self.root.is_absolute() {
            return Err(invalid(
                "root",
                format!("must be absolute: {:?}", self.root),
            ));
        }
        if !self.state.is_absolute() {
            return Err(invalid(
                "state",
                format!("must be absolute: {:?}", self.state),
            ));
        }
        if tracing_subscriber::EnvFilter::try_new(&self.log_level).is_err() {
            return Err(invalid(
                "log_level",
                format!("not a level or filter: {:?}", self.log_level),
            ));
        }
        let auth_file = &self.registry.auth_file;
        if !auth_file.as_os_str().is_empty() && !auth_file.is_absolute() {
            return Err(invalid(
                "registry.auth_file",
                format!("must be absolute: {auth_file:?}"),
            ));
        }
        if self.registry.max_concurrent_downloads == 0 {
            return Err(invalid(
                "registry.max_concurrent_downloads",
                "must be at least 1".to_string(),
            ));
        }
        if !(1..=MAX_LOG_LINE_LIMIT).contains(&self.runtime.max_container_log_line_size) {
            return Err(invalid(
                "runtime.max_container_log_line_size",
                format!(
                    "must be 1 to {MAX_LOG_LINE_LIMIT}: {}",
                    self.runtime.max_container_log_line_size
                ),
            ));
        }
        if !(1..=600).contains(&self.runtime.shim_operation_timeout_secs) {
            return Err(invalid(
                "runtime.shim_operation_timeout_secs",
                format!(
                    "must be 1 to 600: {}",
                    self.runtime.shim_operation_timeout_secs
                ),
            ));
        }
        self.validate_handlers()
            .map_err(|(key, m)| invalid(key, m))?;
        if self.stream.header_timeout_secs == 0
            || self.stream.max_pending_connections == 0
            || self.stream.max_pending_per_peer == 0
            || self.stream.idle_timeout_secs == 0
        {
            return Err(invalid(
                "stream",
                "header_timeout_secs, max_pending_connections, max_pending_per_peer and \
                 idle_timeout_secs must be at least 1"
                    .to_string(),
            ));
        }
        if self.stream.address.parse::<std::net::IpAddr>().is_err() {
            return Err(invalid(
                "stream.address",
                format!("not an IP address: {:?}", self.stream.address),
            ));
        }
        let (cert, key) = (&self.stream.tls_cert_file, &self.stream.tls_key_file);
        if cert.as_os_str().is_empty() != key.as_os_str().is_empty() {
            return Err(invalid(
                "stream.tls_cert_file",
                "tls_cert_file and tls_key_file go together: give both or neither".to_string(),
            ));
        }
        if !self.metrics.address.is_empty()
            && self
                .metrics
                .address
                .parse::<std::net::SocketAddr>()
                .is_err()
        {
            return Err(invalid(
                "metrics.address",
                format!(
                    "not an IP address and port such as \"127.0.0.1:1338\": {:?}",
                    crate::util::excerpt(&self.metrics.address)
                ),
            ));
        }
        if let Some(p) = self.images.pinned.iter().find(|p| p.trim().is_empty()) {
            return Err(invalid(
                "images.pinned",
                format!("an empty pattern pins nothing: {p:?}"),
            ));
        }
        for (key, value) in [
            (
                "nri.plugin_registration_timeout",
                &self.nri.plugin_registration_timeout,
            ),
            (
                "nri.plugin_request_timeout",
                &self.nri.plugin_request_timeout,
            ),
        ] {
            if parse_duration(value).is_none_or(|d| d > std::time::Duration::from_secs(3600)) {
                return Err(invalid(
                    key,
                    format!(
                        "a duration such as \"2s\" or \"500ms\" up to an hour: {:?}",
                        crate::util::excerpt(value)
                    ),
                ));
            }
        }
        if !self.nri.socket_path.is_absolute() {
            return Err(invalid(
                "nri.socket_path",
                format!("must be absolute: {:?}", self.nri.socket_path),
            ));
        }
        let ns = &self.metrics.namespace;
        let ns_ok = ns.len() <= 64
            && ns.bytes().next().is_some_and(|b| b.is_ascii_alphabetic())
            && ns.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !ns_ok {
            return Err(invalid(
                "metrics.namespace",
                format!(
                    "1-64 of [a-zA-Z0-9_], starting with a letter: {:?}",
                    crate::util::excerpt(ns)
                ),
            ));
        }
        Ok(())
    }

    fn validate_handlers(&self) -> Result<(), (&'static str, String)> {
        let handlers = &self.runtime.handlers;
        if !handlers.contains_key(&self.runtime.default_handler) {
            return Err((
                "runtime.default_handler",
                format!(
                    "{:?} is not a configured handler (configured: {})",
                    self.runtime.default_handler,
                    handlers.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            ));
        }
        for (name, h) in handlers {
            let ok_name = !name.is_empty()
                && name.len() <= 63
                && name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
            if !ok_name {
                return Err((
                    "runtime.handlers",
                    format!("{name:?}: a handler name is 1-63 of [a-z0-9-] (a DNS label)"),
                ));
            }
            match h.kind {
                HandlerType::Oci if !h.binary.is_absolute() => {
                    return Err((
                        "runtime.handlers",
                        format!("{name}: an oci handler needs an absolute binary"),
                    ))
                }
                HandlerType::Builtin
                    if !h.binary.as_os_str().is_empty()
                        || !h.root.as_os_str().is_empty()
                        || !h.options.is_empty() =>
                {
                    return Err((
                        "runtime.handlers",
                        format!("{name}: a builtin handler takes no binary, root or options"),
                    ))
                }
                _ => {}
            }
            if !h.root.as_os_str().is_empty() && !h.root.is_absolute() {
                return Err((
                    "runtime.handlers",
                    format!("{name}: root must be absolute: {:?}", h.root),
                ));
            }
        }
        Ok(())
    }

    /// The shim binary: the configured one, else `crius-shim` beside the running crius.
    pub fn shim_binary(&self) -> PathBuf {
        if !self.runtime.shim_path.as_os_str().is_empty() {
            return self.runtime.shim_path.clone();
        }
        std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent().map(|d| d.join("crius-shim")))
            .unwrap_or_else(|| PathBuf::from("crius-shim"))
    }

    /// The filesystem path of the `listen` endpoint.
    pub fn socket_path(&self) -> Result<PathBuf, &'static str> {
        let path = self
            .listen
            .strip_prefix("unix://")
            .ok_or("only unix:// endpoints are supported")?;
        let path = Path::new(path);
        if !path.is_absolute() {
            return Err("the socket path must be absolute");
        }
        Ok(path.to_path_buf())
    }

    /// The effective configuration as JSON, for `Status` with `verbose`.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// Where a loaded configuration came from, for `Status` (verbose) and `crius status`: an
/// operator asking why a key has its value needs the files, not only the merged result.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigSource {
    /// The file crius was told to read (`--config`, else the default path); `None` for a
    /// configuration that was not loaded from a file.
    pub path: Option<PathBuf>,
    /// The files actually read, in order: `path` if it exists, then its drop-ins.
    pub files: Vec<PathBuf>,
}

/// The drop-in directory of config file `path`: `config.d` beside it
/// (`/etc/crius/config.d/*.toml` for the default path).
pub fn drop_in_dir(path: &Path) -> PathBuf {
    path.parent().unwrap_or(Path::new("/")).join("config.d")
}

/// The `*.toml` files of [`drop_in_dir`], sorted by name; none if the directory is missing.
fn drop_ins(path: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let dir = drop_in_dir(path);
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
            ) =>
        {
            return Ok(Vec::new())
        }
        Err(source) => return Err(ConfigError::Read { path: dir, source }),
    };
    let mut files: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml") && p.is_file())
        .collect();
    files.sort();
    Ok(files)
}

/// Merges `over` into `base`: tables key by key, anything else replaced.
fn merge(base: &mut toml::Table, over: toml::Table) {
    for (key, value) in over {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

impl fmt::Display for CgroupDriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CgroupDriver::Cgroupfs => "cgroupfs",
            CgroupDriver::Systemd => "systemd",
        })
    }
}

/// The 1-based line of `offset` in `text` and the dotted key written on that line (or the
/// nearest one above it, for a value that spans lines).
fn locate(text: &str, offset: usize) -> (usize, String) {
    let offset = offset.min(text.len());
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let mut table = String::new();
    let mut key = String::new();
    for l in text.lines().take(line).map(str::trim) {
        if l.starts_with('[') {
            table = l.trim_matches(|c| c == '[' || c == ']').trim().to_string();
            key.clear();
        } else if let Some((k, _)) = l.split_once('=') {
            if !l.starts_with('#') {
                key = k.trim().trim_matches('"').to_string();
            }
        }
    }
    // An unknown table name is reported on its header line.
    let key = match (table.is_empty(), key.is_empty()) {
        (true, _) => key,
        (false, true) => table,
        (false, false) => format!("{table}.{key}"),
    };
    (line, if key.is_empty() { "-".to_string() } else { key })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Path::new("/etc/crius/config.toml"))
    }

    #[test]
    fn default_text_is_the_default_config() {
        let parsed = parse(DEFAULT_CONFIG).unwrap();
        assert_eq!(parsed, Config::default());
        parsed.validate(Path::new("x")).unwrap();
    }

    #[test]
    fn every_default_key_has_a_comment() {
        let lines: Vec<&str> = DEFAULT_CONFIG.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            if l.contains(" = ") {
                assert!(lines[i - 1].starts_with('#'), "no comment above {l:?}");
            }
        }
    }

    #[test]
    fn tls_files_go_together_and_metrics_need_an_address_and_a_name() {
        let check = |text: &str| parse(text).and_then(|c| c.validate(Path::new("x")));
        let err = check("[stream]\ntls_cert_file = \"/a.pem\"\n").unwrap_err();
        assert!(err.to_string().contains("stream.tls_cert_file"), "{err}");
        check("[stream]\ntls_cert_file = \"/a.pem\"\ntls_key_file = \"/k.pem\"\n").unwrap();
        let err = check("[metrics]\naddress = \"localhost\"\n").unwrap_err();
        assert!(err.to_string().contains("metrics.address"), "{err}");
        check("[metrics]\naddress = \"[::1]:1338\"\n").unwrap();
        let err = check("[metrics]\nnamespace = \"9lives\"\n").unwrap_err();
        assert!(err.to_string().contains("metrics.namespace"), "{err}");
        let tls = parse("[stream]\nenable_tls = true\n").unwrap();
        assert!(tls.stream.tls() && !Config::default().stream.tls());
    }

    #[test]
    fn pinned_patterns() {
        let images = ImagesConfig {
            pinned: vec![
                "registry.k8s.io/pause:*".into(),
                "*/coredns@sha256:*".into(),
            ],
        };
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            images.pinned_by(&names(&["registry.k8s.io/pause:3.10"])),
            Some("registry.k8s.io/pause:*")
        );
        assert!(images
            .pinned_by(&names(&["docker.io/x/coredns@sha256:ab"]))
            .is_some());
        assert!(images
            .pinned_by(&names(&[
                "registry.k8s.io/pause2:3.10",
                "docker.io/busybox:1"
            ]))
            .is_none());
        assert!(glob_match("a*b*c", "axxbyyc") && !glob_match("a*b*c", "axxcyyb"));
        assert!(glob_match("abc", "abc") && !glob_match("abc", "abcd") && glob_match("*", ""));
        assert!(!glob_match("a*a", "a"));
    }

    #[test]
    fn empty_file_is_all_defaults() {
        assert_eq!(parse("").unwrap(), Config::default());
    }

    #[test]
    fn keys_override_defaults() {
        let c =
            parse("root = \"/x\"\n[cni]\nbin_dirs = [\"/a\"]\n[cgroup]\ndriver = \"systemd\"\n")
                .unwrap();
        assert_eq!(c.root, PathBuf::from("/x"));
        assert_eq!(c.cni.bin_dirs, vec![PathBuf::from("/a")]);
        assert_eq!(c.cni.conf_dir, PathBuf::from("/etc/cni/net.d"));
        assert_eq!(c.cgroup.driver, CgroupDriver::Systemd);
    }

    #[test]
    fn unknown_key_names_file_line_and_key() {
        let err =
            parse("root = \"/x\"\n\n[cni]\nconf_dir = \"/y\"\nbin_dir = [\"/a\"]\n").unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.starts_with("/etc/crius/config.toml:5: cni.bin_dir: unknown field `bin_dir`"),
            "{msg}"
        );
    }

    #[test]
    fn unknown_table_is_named() {
        let msg = parse("[cnii]\nconf_dir = \"/y\"\n")
            .unwrap_err()
            .to_string();
        assert!(msg.contains(":1:") && msg.contains("cnii"), "{msg}");
    }

    #[test]
    fn wrong_type_names_file_line_and_key() {
        let msg = parse("[stream]\naddress = \"127.0.0.1\"\nport = \"80\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            msg.starts_with("/etc/crius/config.toml:3: stream.port: invalid type"),
            "{msg}"
        );
    }

    #[test]
    fn bad_driver_is_refused() {
        let msg = parse("[cgroup]\ndriver = \"cgroupv3\"\n")
            .unwrap_err()
            .to_string();
        assert!(msg.contains(":2: cgroup.driver:"), "{msg}");
    }

    #[test]
    fn validate_rejects_tcp_listen_and_relative_root() {
        let mut c = Config {
            listen: "tcp://127.0.0.1:1".into(),
            ..Config::default()
        };
        let msg = c.validate(Path::new("f")).unwrap_err().to_string();
        assert!(msg.contains("listen") && msg.contains("unix://"), "{msg}");
        c.listen = Config::default().listen;
        c.root = PathBuf::from("rel");
        assert!(c
            .validate(Path::new("f"))
            .unwrap_err()
            .to_string()
            .contains("root"));
    }

    #[test]
    fn missing_default_file_is_defaults_but_named_file_must_exist() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("none.toml");
        let loaded = Config::load(&missing, false).unwrap();
        assert_eq!(loaded.source.path.as_deref(), Some(missing.as_path()));
        assert!(loaded.source.files.is_empty());
        assert_eq!(
            Config {
                source: ConfigSource::default(),
                ..loaded
            },
            Config::default()
        );
        assert!(Config::load(&missing, true).is_err());
    }

    #[test]
    fn drop_ins_merge_in_name_order_and_errors_name_their_file() {
        let dir = tempfile::tempdir().unwrap();
        let main = dir.path().join("config.toml");
        let drop = dir.path().join("config.d");
        std::fs::create_dir(&drop).unwrap();
        std::fs::write(
            &main,
            "log_level = \"debug\"\n[stream]\nport = 1000\nheader_timeout_secs = 5\n",
        )
        .unwrap();
        std::fs::write(drop.join("20-port.toml"), "[stream]\nport = 2000\n").unwrap();
        std::fs::write(drop.join("10-port.toml"), "[stream]\nport = 1500\n").unwrap();
        std::fs::write(drop.join("notes.txt"), "not toml = [").unwrap();
        let c = Config::load(&main, true).unwrap();
        assert_eq!(
            c.source.files,
            [
                main.clone(),
                drop.join("10-port.toml"),
                drop.join("20-port.toml")
            ]
        );
        assert_eq!(c.log_level, "debug");
        assert_eq!(c.stream.port, 2000, "the last drop-in by name wins");
        assert_eq!(c.stream.header_timeout_secs, 5, "tables merge key by key");

        // a drop-in alone, without the main file
        std::fs::remove_file(&main).unwrap();
        assert_eq!(Config::load(&main, false).unwrap().stream.port, 2000);

        std::fs::write(drop.join("30-bad.toml"), "\n[stream]\nbogus = 1\n").unwrap();
        let err = Config::load(&main, false).unwrap_err().to_string();
        assert!(
            err.contains("30-bad.toml:3") && err.contains("bogus"),
            "{err}"
        );
    }
}
