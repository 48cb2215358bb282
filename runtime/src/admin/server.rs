//! Serving the admin socket (protocol in [`super`]). Each connection is checked for a root (or
//! same-user) peer, then handled on its own task; the blocking reads and writes of an archive
//! run on the blocking pool, the store's async work on the runtime.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use tokio::net::{UnixListener, UnixStream};

use super::{
    read_line, write_line, BlobView, ChunkReader, ChunkWriter, ExportSummary, ImportSummary,
    ImportedImage, PullView, Request, Response,
};
use crate::daemon::Daemon;

/// A client that sends or takes nothing for this long is dropped (an import holds the image
/// store's collection gate while it reads).
const IDLE: Duration = Duration::from_secs(60);

/// Binds `path` (mode 0600, replacing a stale socket) and serves it in the background for as
/// long as the runtime runs.
pub fn serve(daemon: Arc<Daemon>, path: &Path) -> anyhow::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(path)
            .with_context(|| format!("remove stale socket {}", path.display()))?,
        Ok(_) => bail!("{} exists and is not a socket", path.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("stat {}", path.display())),
    }
    // Made 0600 right after the bind (not through the process umask, which every thread of
    // the daemon shares). In the instant between, a connection from another user would still
    // be refused: `connection` checks each peer's credentials.
    let listener =
        UnixListener::bind(path).with_context(|| format!("listen on {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("chmod 0600 {}", path.display()))?;
    tracing::info!(socket = %path.display(), "serving the admin socket");
    tokio::spawn(async move {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    let daemon = daemon.clone();
                    tokio::spawn(async move {
                        if let Err(e) = connection(daemon, stream).await {
                            tracing::warn!("admin connection: {e:#}");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!("admin socket accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    });
    Ok(())
}

async fn connection(daemon: Arc<Daemon>, stream: UnixStream) -> anyhow::Result<()> {
    let peer = stream.peer_cred().context("peer credentials")?;
    // SAFETY: geteuid has no preconditions.
    let own = unsafe { libc::geteuid() };
    if peer.uid() != 0 && peer.uid() != own {
        bail!("refused a connection from uid {}", peer.uid());
    }
    let stream = stream.into_std().context("admin stream")?;
    stream.set_nonblocking(false).context("admin stream")?;
    stream
        .set_read_timeout(Some(IDLE))
        .context("admin stream")?;
    stream
        .set_write_timeout(Some(IDLE))
        .context("admin stream")?;
    let (stream, request) = blocking(move || {
        let mut stream = stream;
        let request: Request = read_line(&mut stream)?;
        Ok((stream, request))
    })
    .await
    .context("read the request")?;
    tracing::info!(?request, "admin request");
    let images = daemon.images.clone();
    let response = match request {
        Request::Import => {
            let input = ChunkReader::new(stream.try_clone().context("admin stream")?);
            match images.import(input).await {
                Ok(report) => Response::Imported(ImportSummary {
                    images: report
                        .images
                        .iter()
                        .map(|r| ImportedImage {
                            id: r.id.clone(),
                            repo_tags: r.repo_tags.clone(),
                            repo_digests: r.repo_digests.clone(),
                        })
                        .collect(),
                    skipped_platforms: report.skipped_platforms,
                    archive_bytes: report.archive_bytes,
                    layers_unpacked: report.layers_unpacked,
                    seconds: report.seconds,
                }),
                Err(e) => error(&e),
            }
        }
        Request::Export { images: names } => {
            let out = ChunkWriter::new(stream.try_clone().context("admin stream")?);
            let result = images.export(&names, out).await;
            // The end of the archive (whole or not), then the outcome.
            let ended = blocking({
                let stream = stream.try_clone().context("admin stream")?;
                move || ChunkWriter::new(stream).finish().map(drop)
            })
            .await;
            match (result, ended) {
                (Ok(report), Ok(())) => Response::Exported(ExportSummary {
                    images: report.images,
                    blobs: report.blobs,
                    blob_bytes: report.blob_bytes,
                }),
                (Err(e), _) => error(&e),
                (Ok(_), Err(e)) => return Err(e).context("send the archive"),
            }
        }
        Request::Pulls => Response::Pulls {
            pulls: images
                .pulls_in_progress()
                .into_iter()
                .map(|p| PullView {
                    image: p.image,
                    done_bytes: p.done_bytes,
                    total_bytes: p.total_bytes,
                    elapsed_ms: millis(p.elapsed),
                    blobs: p
                        .blobs
                        .into_iter()
                        .map(|b| BlobView {
                            digest: b.digest,
                            done_bytes: b.done_bytes,
                            total_bytes: b.total_bytes,
                            receiving_ms: millis(b.receiving),
                            stalled_ms: millis(b.stalled),
                        })
                        .collect(),
                })
                .collect(),
        },
    };
    if let Response::Error { message } = &response {
        tracing::warn!("admin request failed: {message}");
    }
    blocking(move || {
        let mut stream = stream;
        write_line(&mut stream, &response)
    })
    .await
    .context("send the answer")
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn error(e: &crius_image::Error) -> Response {
    Response::Error {
        message: crius_common::error_chain(e),
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(std::io::Error::other)?
}
