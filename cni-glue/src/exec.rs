//! Running one plugin binary per the CNI execution protocol (spec section 2).
//!
//! The plugin gets the daemon's environment plus the `CNI_*` parameters, its request
//! configuration on stdin, and must answer on stdout. It runs in its own process group so that
//! on timeout the plugin *and* the delegated plugins it started (IPAM) are killed together, by
//! the group id, which is the plugin's PID.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::error::{Error, Result};

/// A CNI operation (`CNI_COMMAND`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Status,
    Gc,
    Version,
}

impl Command {
    pub fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Status => "STATUS",
            Command::Gc => "GC",
            Command::Version => "VERSION",
        }
    }

    /// Whether the command concerns one attachment (and so gets the container parameters).
    fn is_attachment(self) -> bool {
        matches!(self, Command::Add | Command::Del | Command::Check)
    }
}

/// The per-attachment parameters (spec section 3, "Attachment Parameters").
#[derive(Debug, Clone, Default)]
pub struct AttachmentParams {
    pub container_id: String,
    pub netns: String,
    pub ifname: String,
    pub args: Vec<(String, String)>,
}

/// Finds and runs plugins.
#[derive(Debug, Clone)]
pub struct Exec {
    pub bin_dirs: Vec<PathBuf>,
    pub timeout: Duration,
}

#[derive(Deserialize)]
struct CniErrorJson {
    #[serde(default)]
    code: u32,
    #[serde(default)]
    msg: String,
    #[serde(default)]
    details: String,
}

impl Exec {
    /// The first `<bin_dir>/<plugin>` that is an executable file.
    pub fn find(&self, plugin: &str) -> Result<PathBuf> {
        use std::os::unix::fs::PermissionsExt;
        for dir in &self.bin_dirs {
            let p = dir.join(plugin);
            if let Ok(md) = std::fs::metadata(&p) {
                if md.is_file() && md.permissions().mode() & 0o111 != 0 {
                    return Ok(p);
                }
            }
        }
        Err(Error::PluginNotFound {
            plugin: plugin.to_string(),
            dirs: self.bin_dirs.clone(),
        })
    }

    fn cni_path(&self) -> String {
        self.bin_dirs
            .iter()
            .map(|d| d.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(":")
    }

    /// Runs `plugin` for `command` with `stdin` as its configuration; returns its stdout.
    pub async fn run(
        &self,
        plugin: &str,
        command: Command,
        params: &AttachmentParams,
        stdin: &[u8],
    ) -> Result<Vec<u8>> {
        let binary = self.find(plugin)?;
        run_binary(
            &binary,
            plugin,
            command,
            params,
            &self.cni_path(),
            stdin,
            self.timeout,
        )
        .await
    }
}

/// `CNI_ARGS`: `K=V` pairs joined by `;`.
pub fn format_args(args: &[(String, String)]) -> String {
    args.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(";")
}

async fn run_binary(
    binary: &Path,
    plugin: &str,
    command: Command,
    params: &AttachmentParams,
    cni_path: &str,
    stdin: &[u8],
    timeout: Duration,
) -> Result<Vec<u8>> {
    let name = command.as_str();
    let exec_err = |source| Error::PluginExec {
        plugin: plugin.to_string(),
        command: name,
        source,
    };
    let mut cmd = tokio::process::Command::new(binary);
    cmd.env("CNI_COMMAND", name).env("CNI_PATH", cni_path);
    // Parameters left over in the daemon's own environment must not leak into this call.
    for var in ["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS"] {
        cmd.env_remove(var);
    }
    if command.is_attachment() {
        cmd.env("CNI_CONTAINERID", &params.container_id)
            .env("CNI_NETNS", &params.netns)
            .env("CNI_IFNAME", &params.ifname)
            .env("CNI_ARGS", format_args(&params.args));
    }
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);

    let mut child = cmd.spawn().map_err(exec_err)?;
    let pid = child.id();
    let mut child_in = child.stdin.take();
    let mut child_out = child.stdout.take();
    let mut child_err = child.stderr.take();

    let outcome = tokio::time::timeout(timeout, async {
        let feed = async {
            if let Some(mut w) = child_in.take() {
                // A plugin may exit without reading stdin (EPIPE); its exit status tells.
                let _ = w.write_all(stdin).await;
            }
        };
        let mut out = Vec::new();
        let mut err = Vec::new();
        let read_out = async {
            if let Some(r) = child_out.as_mut() {
                r.read_to_end(&mut out).await?;
            }
            std::io::Result::Ok(())
        };
        let read_err = async {
            if let Some(r) = child_err.as_mut() {
                r.read_to_end(&mut err).await?;
            }
            std::io::Result::Ok(())
        };
        let ((), ro, re) = tokio::join!(feed, read_out, read_err);
        ro?;
        re?;
        let status = child.wait().await?;
        std::io::Result::Ok((status, out, err))
    })
    .await;

    let (status, stdout, stderr) = match outcome {
        Ok(r) => r.map_err(exec_err)?,
        Err(_) => {
            if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) {
                // The plugin leads its own process group: kill it and its delegates.
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            let _ = child.start_kill();
            let _ = child.wait().await;
            return Err(Error::PluginTimeout {
                plugin: plugin.to_string(),
                command: name,
                timeout,
            });
        }
    };

    let stderr_text = String::from_utf8_lossy(&stderr).trim().to_string();
    if status.success() {
        if !stderr_text.is_empty() {
            tracing::debug!(plugin, command = name, stderr = %stderr_text, "CNI plugin stderr");
        }
        return Ok(stdout);
    }
    // The error structure is on stdout per the spec; some plugins print it on stderr.
    for bytes in [&stdout, &stderr] {
        if let Ok(e) = serde_json::from_slice::<CniErrorJson>(bytes) {
            if e.code != 0 || !e.msg.is_empty() {
                return Err(Error::Plugin {
                    plugin: plugin.to_string(),
                    command: name,
                    code: e.code,
                    msg: e.msg,
                    details: e.details,
                });
            }
        }
    }
    let mut text = stderr_text;
    if text.is_empty() {
        text = String::from_utf8_lossy(&stdout).trim().to_string();
    }
    Err(Error::PluginExit {
        plugin: plugin.to_string(),
        command: name,
        status: status.to_string(),
        stderr: text,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn script(dir: &Path, name: &str, body: &str) {
        let p = dir.join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn exec(dir: &Path, timeout: Duration) -> Exec {
        Exec {
            bin_dirs: vec![PathBuf::from("/nonexistent-crius"), dir.to_path_buf()],
            timeout,
        }
    }

    #[test]
    fn args_format() {
        let a = vec![
            ("IgnoreUnknown".to_string(), "1".to_string()),
            ("K8S_POD_NAME".to_string(), "p".to_string()),
        ];
        assert_eq!(format_args(&a), "IgnoreUnknown=1;K8S_POD_NAME=p");
    }

    #[tokio::test]
    async fn passes_env_and_stdin() {
        let dir = tempfile::tempdir().unwrap();
        script(
            dir.path(),
            "echoer",
            r#"read -r line; printf '{"cmd":"%s","id":"%s","netns":"%s","if":"%s","args":"%s","path":"%s","in":%s}' "$CNI_COMMAND" "$CNI_CONTAINERID" "$CNI_NETNS" "$CNI_IFNAME" "$CNI_ARGS" "$CNI_PATH" "$line""#,
        );
        let e = exec(dir.path(), Duration::from_secs(10));
        let params = AttachmentParams {
            container_id: "c1".into(),
            netns: "/run/x".into(),
            ifname: "eth0".into(),
            args: vec![("A".into(), "b".into())],
        };
        let out = e
            .run("echoer", Command::Add, &params, b"{\"k\":1}\n")
            .await
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["cmd"], "ADD");
        assert_eq!(v["id"], "c1");
        assert_eq!(v["netns"], "/run/x");
        assert_eq!(v["if"], "eth0");
        assert_eq!(v["args"], "A=b");
        assert_eq!(
            v["path"],
            format!("/nonexistent-crius:{}", dir.path().display())
        );
        assert_eq!(v["in"]["k"], 1);

        // STATUS/GC get no attachment parameters.
        let out = e
            .run("echoer", Command::Status, &params, b"{}\n")
            .await
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["cmd"], "STATUS");
        assert_eq!(v["id"], "");
    }

    #[tokio::test]
    async fn reports_cni_errors() {
        let dir = tempfile::tempdir().unwrap();
        script(
            dir.path(),
            "failer",
            r#"echo '{"cniVersion":"1.0.0","code":7,"msg":"bad config","details":"subnet too small"}'; exit 1"#,
        );
        script(dir.path(), "crasher", "echo boom >&2; exit 3");
        let e = exec(dir.path(), Duration::from_secs(10));
        let p = AttachmentParams::default();
        let err = e.run("failer", Command::Add, &p, b"{}").await.unwrap_err();
        assert_eq!(err.cni_code(), Some(7));
        assert_eq!(
            err.to_string(),
            "plugin failer (ADD) failed: code 7: bad config (subnet too small)"
        );
        let err = e.run("crasher", Command::Del, &p, b"{}").await.unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("crasher (DEL) exited") && text.contains("boom"),
            "{text}"
        );
        let err = e.run("absent", Command::Add, &p, b"{}").await.unwrap_err();
        assert!(matches!(err, Error::PluginNotFound { .. }), "{err}");
    }

    #[tokio::test]
    async fn kills_on_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("pid");
        // The plugin starts a "delegate" that would hold stdout open forever.
        script(
            dir.path(),
            "sleeper",
            &format!("sleep 30 & echo $! > {}; sleep 30", pidfile.display()),
        );
        let e = exec(dir.path(), Duration::from_millis(300));
        let start = std::time::Instant::now();
        let err = e
            .run("sleeper", Command::Add, &AttachmentParams::default(), b"{}")
            .await
            .unwrap_err();
        assert!(matches!(err, Error::PluginTimeout { .. }), "{err}");
        assert!(start.elapsed() < Duration::from_secs(10));
        let pid: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // The delegate was killed with the group (it may linger as a zombie of init briefly).
        let gone = (0..50).any(|_| {
            let alive = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map(|s| !s.contains(") Z "))
                .unwrap_or(false);
            if alive {
                std::thread::sleep(Duration::from_millis(20));
            }
            !alive
        });
        assert!(gone, "delegate {pid} survived");
    }
}
