//! `crius status`: what a running crius says about itself, answering an operator's first
//! questions (is it up, since when, read from which files, with how many pods and containers)
//! without crictl or a JSON parser.
//!
//! Everything comes over the CRI socket: `Version`, `Status` with `verbose` (whose `info`
//! carries the pid, start time and configuration files, see `service::status`),
//! `ListPodSandbox` and `ListContainers`. So the command works wherever the socket is
//! reachable, and a crius that does not answer shows up as an error, not stale numbers.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use crius_api::v1::runtime_service_client::RuntimeServiceClient;
use crius_api::v1::{
    ContainerState, ListContainersRequest, ListPodSandboxRequest, PodSandboxState,
    RuntimeCondition, RuntimeHandler, StatusRequest, VersionRequest,
};

/// How long `crius status` waits for all its calls together: a crius that takes longer is
/// not answering, which is worth saying rather than hanging a shell.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// The largest list answer accepted: kubelet allows 16 MiB; a node with tens of thousands of
/// exited containers may come close, and tonic's default (4 MiB) would fail before that.
const MAX_MESSAGE: usize = 64 << 20;

/// What a running crius reported.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub socket: PathBuf,
    pub runtime_name: String,
    pub runtime_version: String,
    pub runtime_api_version: String,
    /// From `Status` `info` (absent from a runtime that does not send it).
    pub pid: Option<u32>,
    pub uptime: Option<Duration>,
    pub config_path: Option<PathBuf>,
    pub config_files: Vec<PathBuf>,
    pub conditions: Vec<RuntimeCondition>,
    pub handlers: Vec<RuntimeHandler>,
    /// Pods by state, in the CRI's order of states.
    pub pods: Vec<(&'static str, usize)>,
    /// Containers by state, in the CRI's order of states.
    pub containers: Vec<(&'static str, usize)>,
    /// Image pulls under way.
    pub pulls: Vec<Pull>,
    /// NRI: off (`None`), else its socket (or why none) and the connected plugins
    /// (`<index>-<name>`, in event order).
    pub nri: Option<(String, Vec<String>)>,
    /// The node's layout as crius sees it: `cgroup v2 (systemd driver), AppArmor crius-default
    /// loaded`; `None` from a crius that does not report it.
    pub node: Option<String>,
}

/// An image pull under way, as a verbose Status reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct Pull {
    pub image: String,
    pub done_bytes: u64,
    /// 0 until the pull has read its manifest.
    pub total_bytes: u64,
    pub elapsed: Duration,
}

impl fmt::Display for Pull {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mb = |b: u64| b as f64 / 1e6;
        write!(f, "{} {:.1}", self.image, mb(self.done_bytes))?;
        match self
            .done_bytes
            .saturating_mul(100)
            .checked_div(self.total_bytes)
        {
            Some(percent) => write!(f, " of {:.1} MB ({percent}%)", mb(self.total_bytes))?,
            None => write!(f, " MB")?,
        }
        write!(f, ", {}", human(self.elapsed))
    }
}

/// Asks the crius serving `socket`, giving up after [`TIMEOUT`].
pub async fn query(socket: &Path) -> anyhow::Result<Report> {
    tokio::time::timeout(TIMEOUT, query_unbounded(socket))
        .await
        .with_context(|| format!("{}: no answer within {TIMEOUT:?}", socket.display()))?
}

async fn query_unbounded(socket: &Path) -> anyhow::Result<Report> {
    let channel = super::grpc_channel(socket)
        .await
        .with_context(|| format!("connect to {} (is crius running?)", socket.display()))?;
    let mut rt = RuntimeServiceClient::new(channel).max_decoding_message_size(MAX_MESSAGE);
    let version = rt
        .version(VersionRequest::default())
        .await
        .map_err(|e| failed("Version", &e))?
        .into_inner();
    let status = rt
        .status(StatusRequest { verbose: true })
        .await
        .map_err(|e| failed("Status", &e))?
        .into_inner();
    let pods = rt
        .list_pod_sandbox(ListPodSandboxRequest::default())
        .await
        .map_err(|e| failed("ListPodSandbox", &e))?
        .into_inner()
        .items;
    let containers = rt
        .list_containers(ListContainersRequest::default())
        .await
        .map_err(|e| failed("ListContainers", &e))?
        .into_inner()
        .containers;

    let info = &status.info;
    let json = |key: &str| {
        info.get(key)
            .and_then(|v| serde_json::from_str::<serde_json::Value>(v).ok())
    };
    let started_at = json("startedAt")
        .and_then(|v| v.as_u64())
        .map(|nanos| UNIX_EPOCH + Duration::from_nanos(nanos));
    let config_files = json("configFiles")
        .and_then(|v| {
            v.as_array().map(|files| {
                files
                    .iter()
                    .filter_map(|f| f.as_str().map(PathBuf::from))
                    .collect()
            })
        })
        .unwrap_or_default();
    let pulls = json("pulls")
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default()
        .iter()
        .map(|p| Pull {
            image: p["image"].as_str().unwrap_or("").to_string(),
            done_bytes: p["doneBytes"].as_u64().unwrap_or(0),
            total_bytes: p["totalBytes"].as_u64().unwrap_or(0),
            elapsed: Duration::try_from_secs_f64(p["elapsedSeconds"].as_f64().unwrap_or(0.0))
                .unwrap_or_default(),
        })
        .collect();
    let nri = json("nri").and_then(|v| {
        (v["enabled"] == true).then(|| {
            let plugins = v["plugins"]
                .as_array()
                .map(|ps| {
                    ps.iter()
                        .map(|p| {
                            format!(
                                "{}-{}",
                                p["index"].as_str().unwrap_or(""),
                                p["name"].as_str().unwrap_or("")
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            (v["socket"].as_str().unwrap_or("").to_string(), plugins)
        })
    });
    let node = json("node").map(|v| {
        format!(
            "cgroup {} ({} driver), AppArmor {}",
            v["cgroup"].as_str().unwrap_or("?"),
            v["cgroupDriver"].as_str().unwrap_or("?"),
            v["apparmor"].as_str().unwrap_or("?")
        )
    });
    Ok(Report {
        node,
        socket: socket.to_path_buf(),
        pulls,
        nri,
        runtime_name: version.runtime_name,
        runtime_version: version.runtime_version,
        runtime_api_version: version.runtime_api_version,
        pid: json("pid")
            .and_then(|v| v.as_u64())
            .and_then(|p| u32::try_from(p).ok()),
        // A start "in the future" (the clock was set back) counts as no uptime known.
        uptime: started_at.and_then(|t| SystemTime::now().duration_since(t).ok()),
        config_path: json("configPath").and_then(|v| v.as_str().map(PathBuf::from)),
        config_files,
        conditions: status.status.map(|s| s.conditions).unwrap_or_default(),
        handlers: status.runtime_handlers,
        pods: count_by(
            pods.iter().map(|p| p.state),
            &[
                (PodSandboxState::SandboxReady as i32, "ready"),
                (PodSandboxState::SandboxNotready as i32, "not ready"),
            ],
        ),
        containers: count_by(
            containers.iter().map(|c| c.state),
            &[
                (ContainerState::ContainerCreated as i32, "created"),
                (ContainerState::ContainerRunning as i32, "running"),
                (ContainerState::ContainerExited as i32, "exited"),
                (ContainerState::ContainerUnknown as i32, "unknown"),
            ],
        ),
    })
}

/// A failed call as `RPC: code: message` (tonic's own text carries metadata and details).
fn failed(rpc: &str, status: &tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{rpc}: {:?}: {}", status.code(), status.message())
}

/// How many of `states` are each of `names` (state value, name); a value not named (from a
/// newer CRI) counts as "unknown".
fn count_by(
    states: impl Iterator<Item = i32>,
    names: &[(i32, &'static str)],
) -> Vec<(&'static str, usize)> {
    let mut counts: Vec<(&'static str, usize)> = names.iter().map(|&(_, n)| (n, 0)).collect();
    for state in states {
        let name = names
            .iter()
            .find(|(v, _)| *v == state)
            .map_or("unknown", |&(_, n)| n);
        match counts.iter_mut().find(|(n, _)| *n == name) {
            Some((_, count)) => *count += 1,
            None => counts.push((name, 1)),
        }
    }
    counts
}

/// `3 (2 running, 1 exited)`, or `0`.
fn counts(by_state: &[(&str, usize)]) -> String {
    let total: usize = by_state.iter().map(|(_, n)| n).sum();
    let parts: Vec<String> = by_state
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(name, n)| format!("{n} {name}"))
        .collect();
    if parts.is_empty() {
        total.to_string()
    } else {
        format!("{total} ({})", parts.join(", "))
    }
}

/// `2d 3h 4m 5s`, leading zero units left out.
fn human(d: Duration) -> String {
    let s = d.as_secs();
    let units = [(s / 86400, "d"), (s / 3600 % 24, "h"), (s / 60 % 60, "m")];
    let mut out: Vec<String> = units
        .iter()
        .skip_while(|(n, _)| *n == 0)
        .map(|(n, u)| format!("{n}{u}"))
        .collect();
    out.push(format!("{}s", s % 60));
    out.join(" ")
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} (CRI {})",
            self.runtime_name, self.runtime_version, self.runtime_api_version
        )?;
        if let Some(pid) = self.pid {
            write!(f, ", pid {pid}")?;
        }
        if let Some(uptime) = self.uptime {
            write!(f, ", up {}", human(uptime))?;
        }
        writeln!(f)?;
        writeln!(f, "socket:      {}", self.socket.display())?;
        if let Some(node) = &self.node {
            writeln!(f, "node:        {node}")?;
        }
        let config = match (&self.config_path, self.config_files.is_empty()) {
            (_, false) => self
                .config_files
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            (Some(path), true) => format!("{} (absent: built-in defaults)", path.display()),
            (None, true) => "not reported".to_string(),
        };
        writeln!(f, "config:      {config}")?;
        let conditions: Vec<String> = self
            .conditions
            .iter()
            .map(|c| {
                if c.status {
                    c.r#type.clone()
                } else if c.message.is_empty() {
                    format!("{}=false ({})", c.r#type, c.reason)
                } else {
                    format!("{}=false ({}: {})", c.r#type, c.reason, c.message)
                }
            })
            .collect();
        writeln!(f, "conditions:  {}", conditions.join(", "))?;
        writeln!(f, "pods:        {}", counts(&self.pods))?;
        writeln!(f, "containers:  {}", counts(&self.containers))?;
        let handlers: Vec<String> = self
            .handlers
            .iter()
            .map(|h| {
                let name = if h.name.is_empty() {
                    "(default)"
                } else {
                    &h.name
                };
                let features = h.features.as_ref().map_or(Vec::new(), |f| {
                    [
                        (f.recursive_read_only_mounts, "recursive read-only mounts"),
                        (f.user_namespaces, "user namespaces"),
                    ]
                    .into_iter()
                    .filter_map(|(on, what)| on.then_some(what))
                    .collect()
                });
                if features.is_empty() {
                    name.to_string()
                } else {
                    format!("{name} [{}]", features.join(", "))
                }
            })
            .collect();
        writeln!(f, "handlers:    {}", handlers.join(", "))?;
        let pulls: Vec<String> = self.pulls.iter().map(Pull::to_string).collect();
        match pulls.is_empty() {
            true => writeln!(f, "pulls:       none")?,
            false => writeln!(f, "pulls:       {}", pulls.join("; "))?,
        }
        match &self.nri {
            None => writeln!(f, "nri:         off"),
            Some((socket, plugins)) if plugins.is_empty() => {
                writeln!(f, "nri:         {socket}, no plugin connected")
            }
            Some((socket, plugins)) => {
                writeln!(f, "nri:         {socket}, plugins {}", plugins.join(", "))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crius_api::v1::RuntimeHandlerFeatures;

    #[test]
    fn states_are_counted_in_cri_order_and_strangers_are_unknown() {
        let names = [(0, "ready"), (1, "not ready")];
        assert_eq!(
            count_by([1, 0, 1, 7].into_iter(), &names),
            [("ready", 1), ("not ready", 2), ("unknown", 1)]
        );
        assert_eq!(counts(&count_by([].into_iter(), &names)), "0");
        assert_eq!(
            counts(&count_by([1, 1].into_iter(), &names)),
            "2 (2 not ready)"
        );
    }

    #[test]
    fn uptime_leaves_out_leading_zero_units() {
        assert_eq!(human(Duration::from_secs(5)), "5s");
        assert_eq!(human(Duration::from_secs(3600)), "1h 0m 0s");
        assert_eq!(human(Duration::from_secs(2 * 86400 + 61)), "2d 0h 1m 1s");
    }

    #[test]
    fn report_prints_one_line_per_question() {
        let report = Report {
            socket: "/run/crius/crius.sock".into(),
            runtime_name: "crius".into(),
            runtime_version: "0.1.0".into(),
            runtime_api_version: "v1".into(),
            pid: Some(42),
            uptime: Some(Duration::from_secs(3725)),
            config_path: Some("/etc/crius/config.toml".into()),
            config_files: vec![],
            conditions: vec![
                RuntimeCondition {
                    r#type: "RuntimeReady".into(),
                    status: true,
                    ..Default::default()
                },
                RuntimeCondition {
                    r#type: "NetworkReady".into(),
                    status: false,
                    reason: "NetworkPluginNotReady".into(),
                    message: "no network config".into(),
                },
            ],
            handlers: vec![RuntimeHandler {
                name: String::new(),
                features: Some(RuntimeHandlerFeatures {
                    recursive_read_only_mounts: true,
                    user_namespaces: false,
                }),
            }],
            pods: vec![("ready", 1), ("not ready", 0)],
            containers: vec![("created", 0), ("running", 2), ("exited", 1)],
            pulls: vec![
                Pull {
                    image: "docker.io/library/nginx:1".into(),
                    done_bytes: 12_500_000,
                    total_bytes: 50_000_000,
                    elapsed: Duration::from_secs(7),
                },
                Pull {
                    image: "quay.io/x:2".into(),
                    done_bytes: 0,
                    total_bytes: 0,
                    elapsed: Duration::from_secs(1),
                },
            ],
            nri: Some(("/var/run/nri/nri.sock".into(), vec!["10-logger".into()])),
            node: Some("cgroup v2 (systemd driver), AppArmor crius-default loaded".into()),
        };
        assert_eq!(
            report.to_string(),
            "crius 0.1.0 (CRI v1), pid 42, up 1h 2m 5s\n\
             socket:      /run/crius/crius.sock\n\
             node:        cgroup v2 (systemd driver), AppArmor crius-default loaded\n\
             config:      /etc/crius/config.toml (absent: built-in defaults)\n\
             conditions:  RuntimeReady, NetworkReady=false (NetworkPluginNotReady: no network config)\n\
             pods:        1 (1 ready)\n\
             containers:  3 (2 running, 1 exited)\n\
             handlers:    (default) [recursive read-only mounts]\n\
             pulls:       docker.io/library/nginx:1 12.5 of 50.0 MB (25%), 7s; quay.io/x:2 0.0 MB, 1s\n\
             nri:         /var/run/nri/nri.sock, plugins 10-logger\n"
        );
    }
}
