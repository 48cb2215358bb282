//! Serving the CRI on the unix socket: claiming the socket, the gRPC server, and the orderly
//! stop on SIGTERM/SIGINT.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use crius_api::v1::image_service_server::ImageServiceServer;
use crius_api::v1::runtime_service_server::RuntimeServiceServer;
use tokio::net::UnixListener;
use tokio::signal::unix::{signal, SignalKind};
use tokio_stream::wrappers::UnixListenerStream;
use tokio_stream::StreamExt as _;

use crate::authority::AuthorityFix;
use crate::daemon::Daemon;
use crate::service::CriService;

/// How long in-flight calls may run on after a stop signal before the daemon exits anyway.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// kubelet sends and accepts messages up to 16 MiB; tonic's default of 4 MiB is too small for a
/// node with many containers.
const MAX_MESSAGE_SIZE: usize = 16 * 1024 * 1024;

/// How long a start waits for the socket's lock before it says another crius serves. A crius
/// killed while it was starting a process (a CNI plugin, a shim) leaves that child holding a
/// copy of the lock until it execs; on a loaded node the child may wait for a CPU first, and a
/// restart within that moment would be refused. The database's lock is released with it.
const LOCK_WAIT: Duration = Duration::from_secs(2);

/// The claimed socket: the listener, and the lock that proves no other crius serves it.
pub struct Socket {
    listener: UnixListener,
    path: PathBuf,
    _lock: File,
}

impl Socket {
    /// Claims `path`: takes an exclusive lock beside it (a second crius fails here and says
    /// so, after `LOCK_WAIT`), replaces a stale socket file, binds, and sets mode 0660.
    pub fn claim(path: &Path) -> anyhow::Result<Socket> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("create socket directory {}", parent.display()))?;
        }
        let lock_path = lock_path(path);
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .with_context(|| format!("open socket lock {}", lock_path.display()))?;
        let began = std::time::Instant::now();
        loop {
            // SAFETY: flock on a descriptor we own; no memory is involved.
            let rc = unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if rc == 0 {
                break;
            }
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(err).with_context(|| format!("lock {}", lock_path.display()));
            }
            if began.elapsed() >= LOCK_WAIT {
                bail!(
                    "another crius is already serving {} (lock {} is held)",
                    path.display(),
                    lock_path.display()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(path)
                .with_context(|| format!("remove stale socket {}", path.display()))?,
            Ok(_) => bail!("{} exists and is not a socket", path.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("stat {}", path.display())),
        }
        let listener =
            UnixListener::bind(path).with_context(|| format!("listen on {}", path.display()))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
            .with_context(|| format!("chmod 0660 {}", path.display()))?;
        Ok(Socket {
            listener,
            path: path.to_path_buf(),
            _lock: lock,
        })
    }
}

fn lock_path(socket: &Path) -> PathBuf {
    let mut name = socket.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}

/// The stop signals, caught from before the socket exists so that a signal sent as soon as
/// the socket appears is never the default (fatal) action.
pub struct StopSignals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl StopSignals {
    /// Installs the handlers; call inside the tokio runtime before [`Socket::claim`].
    pub fn install() -> anyhow::Result<StopSignals> {
        Ok(StopSignals {
            term: signal(SignalKind::terminate()).context("install SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("install SIGINT handler")?,
        })
    }
}

/// Serves both CRI services on `socket` until SIGTERM or SIGINT, then stops accepting,
/// lets in-flight calls finish for up to [`SHUTDOWN_GRACE`], and removes the socket file and
/// the NRI socket's.
/// Pods and containers are not touched: they belong to their shims.
pub async fn serve(
    daemon: Arc<Daemon>,
    socket: Socket,
    mut signals: StopSignals,
) -> anyhow::Result<()> {
    let streams = Arc::clone(&daemon.streams);
    // What the stop closes (the event streams) and removes (the NRI socket).
    let stopping = Arc::clone(&daemon);
    let service = CriService::new(daemon);
    let runtime = RuntimeServiceServer::new(service.clone())
        .max_decoding_message_size(MAX_MESSAGE_SIZE)
        .max_encoding_message_size(MAX_MESSAGE_SIZE);
    let images = ImageServiceServer::new(service)
        .max_decoding_message_size(MAX_MESSAGE_SIZE)
        .max_encoding_message_size(MAX_MESSAGE_SIZE);

    // grpc.health.v1: the server ("") and both CRI services serve until the orderly stop.
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<RuntimeServiceServer<CriService>>()
        .await;
    health.set_serving::<ImageServiceServer<CriService>>().await;

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let Socket {
        listener,
        path,
        _lock,
    } = socket;
    // Every client's header blocks go through the authority fix: a socket path as `:authority`
    // would otherwise reset every call (authority.rs).
    let incoming = UnixListenerStream::new(listener).map(|conn| conn.map(AuthorityFix::new));
    let server = tonic::transport::Server::builder()
        .add_service(runtime)
        .add_service(images)
        .add_service(health_service)
        .serve_with_incoming_shutdown(incoming, async {
            stop_rx.await.ok();
        });
    tokio::pin!(server);
    tracing::info!(socket = %path.display(), "serving the CRI");
    // The socket is bound and listening: calls queue from now on, so systemd may start kubelet.
    crate::notify::notify(&format!(
        "READY=1\nSTATUS=serving the CRI on {}",
        path.display()
    ));

    let result = tokio::select! {
        r = &mut server => r.context("grpc server"),
        _ = signals.term.recv() => {
            stopping.events.close();
            stop(&mut server, stop_tx, &health, "SIGTERM").await
        }
        _ = signals.int.recv() => {
            stopping.events.close();
            stop(&mut server, stop_tx, &health, "SIGINT").await
        }
    };
    streams.stop();
    if let Err(e) = std::fs::remove_file(&path) {
        tracing::warn!(socket = %path.display(), "remove socket: {e}");
    }
    stopping.nri.remove_socket();
    result
}

async fn stop<F>(
    server: &mut std::pin::Pin<&mut F>,
    stop_tx: tokio::sync::oneshot::Sender<()>,
    health: &tonic_health::server::HealthReporter,
    signal: &str,
) -> anyhow::Result<()>
where
    F: std::future::Future<Output = Result<(), tonic::transport::Error>>,
{
    tracing::info!("{signal}: no new calls; waiting for those in flight");
    crate::notify::notify("STOPPING=1\nSTATUS=stopping: waiting for calls in flight");
    for service in ["", "runtime.v1.RuntimeService", "runtime.v1.ImageService"] {
        health
            .set_service_status(service, tonic_health::ServingStatus::NotServing)
            .await;
    }
    let _ = stop_tx.send(());
    match tokio::time::timeout(SHUTDOWN_GRACE, server.as_mut()).await {
        Ok(r) => r.context("grpc server"),
        Err(_) => {
            tracing::warn!(
                "calls still in flight after {}s; exiting without them",
                SHUTDOWN_GRACE.as_secs()
            );
            Ok(())
        }
    }
}
