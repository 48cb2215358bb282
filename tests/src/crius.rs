//! A real crius daemon on a temporary root, state dir and socket.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use crius_api::v1::image_service_client::ImageServiceClient;
use crius_api::v1::runtime_service_client::RuntimeServiceClient;
use hyper_util::rt::TokioIo;
use nix::sys::signal::Signal;
use tokio::net::UnixStream;
use tokio::runtime::Handle;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::process::{
    kill_and_reap, log_marker, log_tail, signal, spawn_logged, terminate, wait_bounded,
};
use crate::{binary, Error, Result, TestDir};

/// How long crius gets to create its socket (a debug build opens its database first).
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long [`Crius::stop`] and drop wait after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// A running crius, started by [`Crius::start`], with gRPC clients connected over its socket.
///
/// Layout of its temp dir (`/tmp/crius-daemon-XXXXXX`): `config.toml`, `root/`, `state/` (or
/// `<sub>/root/`, `<sub>/state/` with [`Crius::start_under`]), `crius.sock`, `crius.log` (stdout and stderr of every run, `----- crius-tests: ... -----`
/// lines between runs). The log is printed when the fixture is dropped during a panic.
///
/// Drop sends SIGTERM, then SIGKILL after 10 s, reaps crius, lazily unmounts whatever is still
/// mounted under the temp dir and removes it.
#[derive(Debug)]
pub struct Crius {
    bin: PathBuf,
    child: Option<Child>,
    // Drives the gRPC connection. A runtime of its own, because a test's runtime may be blocked
    // (in `stop`, in drop, in a blocking fixture call) exactly when crius sends GOAWAY on
    // SIGTERM; a connection nobody drives keeps crius waiting for its drain timeout.
    grpc: GrpcRuntime,
    runtime: RuntimeServiceClient<Channel>,
    image: ImageServiceClient<Channel>,
    /// The directory holding `root/` and `state/`: `dir` itself, or a subdirectory of it.
    data: PathBuf,
    /// Variables added to crius's environment (kept for restarts).
    env: Vec<(String, String)>,
    // Dropped last, after `Drop::drop` has stopped the process.
    dir: TestDir,
}

impl Crius {
    /// Starts crius with `config_toml` as its config file (`""` for the built-in defaults) and
    /// waits until its socket accepts connections.
    ///
    /// Command line: `crius --config DIR/config.toml --root DIR/root --state DIR/state --listen
    /// unix://DIR/crius.sock --log-level debug`; the binary comes from [`crate::binary`].
    pub async fn start(config_toml: &str) -> Result<Crius> {
        Crius::start_in(config_toml, None, &[]).await
    }

    /// [`Crius::start`] with `env` added to crius's environment (as a systemd unit's
    /// `Environment=` lines would), e.g. `HTTP_PROXY`.
    pub async fn start_with_env(config_toml: &str, env: &[(&str, &str)]) -> Result<Crius> {
        Crius::start_in(config_toml, None, env).await
    }

    /// [`Crius::start`] with `--root DIR/<sub>/root --state DIR/<sub>/state`, where `DIR/<sub>`
    /// is made with `mode` (exactly, whatever the umask): e.g. `0o700`, as `mktemp -d` makes
    /// its directories, for a root under a parent that only its owner may traverse.
    pub async fn start_under(config_toml: &str, sub: &str, mode: u32) -> Result<Crius> {
        Crius::start_in(config_toml, Some((sub, mode)), &[]).await
    }

    async fn start_in(
        config_toml: &str,
        under: Option<(&str, u32)>,
        env: &[(&str, &str)],
    ) -> Result<Crius> {
        use std::os::unix::fs::PermissionsExt;
        let bin = binary("crius")?;
        let dir = TestDir::new("daemon")?;
        let config = dir.join("config.toml");
        // Each crius its own NRI socket, so parallel tests do not contend for the node's.
        let socket_line = format!("socket_path = \"{}\"\n", dir.join("nri.sock").display());
        let config_toml = if !config_toml.contains("[nri]") {
            format!("{config_toml}\n[nri]\n{socket_line}")
        } else if !config_toml.contains("socket_path") {
            config_toml.replacen("[nri]\n", &format!("[nri]\n{socket_line}"), 1)
        } else {
            config_toml.to_string()
        };
        std::fs::write(&config, config_toml)
            .map_err(|source| Error::io("write crius config", &config, source))?;
        let data = match under {
            None => dir.path().to_path_buf(),
            Some((sub, mode)) => {
                let data = dir.join(sub);
                std::fs::create_dir(&data)
                    .and_then(|()| {
                        std::fs::set_permissions(&data, std::fs::Permissions::from_mode(mode))
                    })
                    .map_err(|source| Error::io("create crius data dir", &data, source))?;
                data
            }
        };
        for sub in ["root", "state"] {
            let path = data.join(sub);
            std::fs::create_dir(&path)
                .map_err(|source| Error::io("create crius dir", &path, source))?;
        }
        let grpc = GrpcRuntime::new()?;
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let (child, channel) = launch(&bin, &dir, &data, &env, grpc.handle()).await?;
        Ok(Crius {
            bin,
            child: Some(child),
            grpc,
            runtime: RuntimeServiceClient::new(channel.clone()),
            image: ImageServiceClient::new(channel),
            data,
            env,
            dir,
        })
    }

    /// A `RuntimeService` client (cheap to clone; all clones share one connection).
    pub fn runtime(&self) -> RuntimeServiceClient<Channel> {
        self.runtime.clone()
    }

    /// An `ImageService` client on the same connection.
    pub fn image(&self) -> ImageServiceClient<Channel> {
        self.image.clone()
    }

    /// PID of the running daemon, `None` after [`Crius::stop`] or [`Crius::kill9`].
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The temp dir holding everything below.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `--root`
    pub fn root(&self) -> PathBuf {
        self.data.join("root")
    }

    /// `--state`
    pub fn state(&self) -> PathBuf {
        self.data.join("state")
    }

    /// The socket path (without `unix://`).
    pub fn socket(&self) -> PathBuf {
        self.dir.join("crius.sock")
    }

    /// The NRI socket (`[nri] socket_path`, unless the test's config names its own).
    pub fn nri_socket(&self) -> PathBuf {
        self.dir.join("nri.sock")
    }

    /// `--config`
    pub fn config_path(&self) -> PathBuf {
        self.dir.join("config.toml")
    }

    /// The log file (stdout and stderr of every run).
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("crius.log")
    }

    /// The log so far (its tail, if long).
    pub fn log(&self) -> String {
        log_tail(&self.log_path())
    }

    /// Kills crius with SIGKILL, as a crash would, and reaps it. Everything it started (shims,
    /// containers) keeps running; the clients fail until [`Crius::restart`].
    pub fn kill9(&mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            kill_and_reap(&mut child, "crius")?;
            log_marker(&self.log_path(), "killed with SIGKILL");
        }
        Ok(())
    }

    /// Sends SIGTERM and waits (up to 10 s) for crius to exit; returns its exit status, or an
    /// error if it did not exit in time (it is then killed).
    pub fn stop(&mut self) -> Result<ExitStatus> {
        let Some(mut child) = self.child.take() else {
            return Err(Error::io(
                "stop crius",
                self.dir(),
                std::io::Error::other("crius is not running"),
            ));
        };
        signal(&mut child, "crius", Signal::SIGTERM)?;
        let status = wait_bounded(&mut child, "crius", STOP_GRACE)?;
        log_marker(&self.log_path(), "stopped with SIGTERM");
        match status {
            Some(status) => Ok(status),
            None => {
                kill_and_reap(&mut child, "crius")?;
                Err(Error::io(
                    "stop crius",
                    self.dir(),
                    std::io::Error::other(format!(
                        "still running {STOP_GRACE:?} after SIGTERM; killed"
                    )),
                ))
            }
        }
    }

    /// Starts crius again on the same dirs, config and socket (stopping it with SIGTERM first if
    /// it is running) and reconnects the clients; get fresh ones from [`Crius::runtime`].
    pub async fn restart(&mut self) -> Result<()> {
        if self.child.is_some() {
            self.stop()?;
        }
        log_marker(&self.log_path(), "restart");
        let (child, channel) = launch(
            &self.bin,
            &self.dir,
            &self.data,
            &self.env,
            self.grpc.handle(),
        )
        .await?;
        self.child = Some(child);
        self.runtime = RuntimeServiceClient::new(channel.clone());
        self.image = ImageServiceClient::new(channel);
        Ok(())
    }
}

impl Drop for Crius {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if let Err(err) = terminate(&mut child, "crius", STOP_GRACE) {
                eprintln!("crius-tests: stop crius: {err}");
            }
        }
        if std::thread::panicking() {
            eprintln!(
                "--- crius log ({}) ---\n{}",
                self.log_path().display(),
                self.log()
            );
        }
    }
}

/// A one-thread runtime for the client side of the gRPC connection.
#[derive(Debug)]
struct GrpcRuntime(Option<tokio::runtime::Runtime>);

impl GrpcRuntime {
    fn new() -> Result<GrpcRuntime> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("crius-tests-grpc")
            .enable_all()
            .build()
            .map_err(|source| Error::io("start the gRPC client runtime", "", source))?;
        Ok(GrpcRuntime(Some(runtime)))
    }

    fn handle(&self) -> &Handle {
        match &self.0 {
            Some(runtime) => runtime.handle(),
            None => unreachable!("the runtime is only taken in drop"),
        }
    }
}

impl Drop for GrpcRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            // Tests drop fixtures inside async code, where dropping a runtime panics;
            // shutting it down in the background is allowed there.
            runtime.shutdown_background();
        }
    }
}

/// Spawns crius on `dir` (root and state in `data`) and connects to its socket; the connection
/// runs on `grpc`.
async fn launch(
    bin: &Path,
    dir: &TestDir,
    data: &Path,
    env: &[(String, String)],
    grpc: &Handle,
) -> Result<(Child, Channel)> {
    let socket = dir.join("crius.sock");
    let log = dir.join("crius.log");
    let mut command = Command::new(bin);
    command
        .arg("--config")
        .arg(dir.join("config.toml"))
        .arg("--root")
        .arg(data.join("root"))
        .arg("--state")
        .arg(data.join("state"))
        .arg("--listen")
        .arg(format!("unix://{}", socket.display()))
        .args(["--log-level", "debug"])
        .env("RUST_BACKTRACE", "1")
        .envs(env.iter().map(|(k, v)| (k, v)));
    let mut child = spawn_logged(command, "crius", &log)?;

    match wait_for_socket(&mut child, &socket, grpc).await {
        Ok(channel) => Ok((child, channel)),
        Err(reason) => {
            let _ = kill_and_reap(&mut child, "crius");
            Err(Error::Start {
                name: "crius",
                reason,
                log: log_tail(&log),
            })
        }
    }
}

/// Polls until the socket accepts a connection, then opens the gRPC channel on it and waits for
/// a `Version` answer: crius binds its socket before it opens its database and recovers, so a
/// connection alone does not mean it serves (what a test checks right after a start or restart
/// may not be done yet).
///
/// A failed `Version` (a dropped connection) does not end the wait while crius runs: after a
/// `kill -9` the old socket can still be listening for a moment in a child the killed crius had
/// forked and not yet exec'd (its descriptors close at the exec, resetting what queued there),
/// and a crius that fails a start-up check after it claimed its socket drops what queued on it
/// as it ends, before it prints why: its exit status and log are then the answer.
async fn wait_for_socket(
    child: &mut Child,
    socket: &Path,
    grpc: &Handle,
) -> std::result::Result<Channel, String> {
    let deadline = Instant::now() + START_TIMEOUT;
    let mut last_error: Option<String> = None;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(match last_error {
                Some(reason) => format!("exited with {status} ({reason})"),
                None => format!("exited with {status}"),
            });
        }
        if UnixStream::connect(socket).await.is_ok() {
            let socket = socket.to_path_buf();
            let serving = async move {
                let channel = connect(&socket).await?;
                let mut client = RuntimeServiceClient::new(channel.clone());
                let request = crius_api::v1::VersionRequest::default();
                match tokio::time::timeout(START_TIMEOUT, client.version(request)).await {
                    Ok(Ok(_)) => Ok(channel),
                    Ok(Err(status)) => Err(Error::Serve(format!("Version: {status}"))),
                    Err(_) => Err(Error::Serve(format!(
                        "no answer to Version within {START_TIMEOUT:?}"
                    ))),
                }
            };
            match grpc.spawn(serving).await {
                Ok(Ok(channel)) => return Ok(channel),
                Ok(Err(err)) => last_error = Some(format!("{err:?}")),
                Err(join) => last_error = Some(format!("connect task failed: {join}")),
            }
        }
        if Instant::now() >= deadline {
            return Err(last_error.unwrap_or_else(|| {
                format!(
                    "{} did not accept connections within {START_TIMEOUT:?}",
                    socket.display()
                )
            }));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A tonic channel over a unix socket (the URI is a placeholder; the connector ignores it).
///
/// The channel's connection task runs on the runtime this is called on.
pub async fn connect(socket: &Path) -> Result<Channel> {
    let path = socket.to_path_buf();
    let endpoint = Endpoint::from_static("http://crius.sock");
    endpoint
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { UnixStream::connect(path).await.map(TokioIo::new) }
        }))
        .await
        .map_err(|source| Error::Connect {
            socket: socket.to_path_buf(),
            source,
        })
}
