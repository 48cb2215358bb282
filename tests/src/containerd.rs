//! A real containerd (Debian's package) on its own socket, root and state under a temp dir, with
//! its CRI plugin off: the source of `crius images import --from-containerd` and the
//! comparison of the import benchmark. Images get into it with `ctr` ([`Containerd::ctr`]).
//!
//! Drop sends SIGTERM (SIGKILL after 10 s), reaps it, lazily unmounts anything left under its
//! dir and removes the dir.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

use crate::process::{log_tail, spawn_logged, terminate};
use crate::{unmount_all_under, Error, Result, TestDir};

const CONTAINERD: &str = "/usr/bin/containerd";
const CTR: &str = "/usr/bin/ctr";

/// A running containerd.
#[derive(Debug)]
pub struct Containerd {
    child: Option<Child>,
    log: PathBuf,
    dir: TestDir,
}

impl Containerd {
    /// Starts containerd and waits until `ctr version` answers.
    pub fn start() -> Result<Containerd> {
        if !Path::new(CONTAINERD).exists() || !Path::new(CTR).exists() {
            return Err(Error::MissingProgram {
                program: CONTAINERD,
                package: "containerd",
            });
        }
        let dir = TestDir::new("containerd")?;
        let config = dir.join("config.toml");
        // No CRI (it would want CNI and a sandbox image), no /opt/containerd, no tracing.
        let text = format!(
            "version = 2\nroot = \"{root}\"\nstate = \"{state}\"\n\
             disabled_plugins = [\"io.containerd.grpc.v1.cri\", \"io.containerd.internal.v1.opt\", \
             \"io.containerd.internal.v1.tracing\", \"io.containerd.tracing.processor.v1.otlp\"]\n\
             [grpc]\n  address = \"{sock}\"\n[ttrpc]\n  address = \"{sock}.ttrpc\"\n",
            root = dir.join("root").display(),
            state = dir.join("state").display(),
            sock = dir.join("containerd.sock").display(),
        );
        std::fs::write(&config, text)
            .map_err(|source| Error::io("write containerd config", &config, source))?;
        let log = dir.join("containerd.log");
        let mut command = Command::new(CONTAINERD);
        command.arg("--config").arg(&config);
        let child = spawn_logged(command, "containerd", &log)?;
        let containerd = Containerd {
            child: Some(child),
            log,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if containerd.ctr(&["version"])?.status.success() {
                return Ok(containerd);
            }
            if Instant::now() > deadline {
                return Err(Error::io(
                    format!(
                        "containerd did not answer in 30 s: {}",
                        log_tail(&containerd.log)
                    ),
                    &containerd.log,
                    std::io::Error::from(std::io::ErrorKind::TimedOut),
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Its gRPC socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.join("containerd.sock")
    }

    /// Its root directory (content store, snapshots, metadata).
    pub fn root(&self) -> PathBuf {
        self.dir.join("root")
    }

    /// Runs `ctr --address <socket> ARGS…` and returns its output.
    pub fn ctr(&self, args: &[&str]) -> Result<Output> {
        Command::new(CTR)
            .arg("--address")
            .arg(self.socket())
            .args(args)
            .output()
            .map_err(|source| Error::io("run ctr", CTR, source))
    }

    /// [`Containerd::ctr`] that must succeed; returns stdout.
    pub fn ctr_ok(&self, args: &[&str]) -> Result<String> {
        let out = self.ctr(args)?;
        if !out.status.success() {
            return Err(Error::io(
                format!(
                    "ctr {args:?}: {}{}",
                    String::from_utf8_lossy(&out.stderr),
                    String::from_utf8_lossy(&out.stdout)
                ),
                CTR,
                std::io::Error::other("failed"),
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// containerd's log so far.
    pub fn log(&self) -> String {
        log_tail(&self.log)
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if let Err(err) = terminate(&mut child, "containerd", Duration::from_secs(10)) {
                eprintln!("crius-tests: stop containerd: {err}");
            }
        }
        if std::thread::panicking() {
            eprintln!("--- containerd log ---\n{}", self.log());
        }
        if let Err(err) = unmount_all_under(self.dir.path()) {
            eprintln!("crius-tests: unmount under containerd's dir: {err}");
        }
    }
}
