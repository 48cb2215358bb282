//! The NRI socket and the plugins crius starts: each connection is registered, configured,
//! synchronized and then added to the plugins events go to.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crius_api::nri::{api, ttrpc};
use prost::Message;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;

use super::link::{Incoming, Link, CODE_FAILED_PRECONDITION, CODE_UNIMPLEMENTED};
use super::{lock, Domain, Nri, Plugin, NRI_VERSION};
use crate::util::FileId;

/// Plugins in one `Synchronize` message at most, so no message nears ttrpc's 4 MiB.
const SYNC_CHUNK: usize = 64;

pub(super) fn start(nri: Arc<Nri>, domain: Arc<dyn Domain>) {
    if !nri.config.disable_connections {
        match listen(&nri.config.socket_path) {
            Ok((listener, bound)) => {
                *lock(&nri.socket_state) = nri.config.socket_path.display().to_string();
                *lock(&nri.bound) = Some(bound);
                let (nri, domain) = (Arc::clone(&nri), Arc::clone(&domain));
                tokio::spawn(async move {
                    loop {
                        match listener.accept().await {
                            Ok((stream, _)) => {
                                let (nri, domain) = (Arc::clone(&nri), Arc::clone(&domain));
                                tokio::spawn(serve(nri, domain, stream, None));
                            }
                            Err(e) => {
                                tracing::warn!("nri: accept: {e}");
                                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                            }
                        }
                    }
                });
            }
            Err(why) => {
                tracing::error!("nri: external plugins cannot connect: {why}");
                *lock(&nri.socket_state) = format!("not served: {why}");
            }
        }
    } else {
        *lock(&nri.socket_state) = "connections disabled".into();
    }
    for (index, name, path) in preinstalled(&nri.config.plugin_path) {
        if let Err(e) = launch(Arc::clone(&nri), Arc::clone(&domain), &index, &name, &path) {
            tracing::error!(plugin = %format!("{index}-{name}"), "nri: start {}: {e}", path.display());
        }
    }
}

/// A socket file crius bound: its path, and what tells that file from a later one there.
pub(super) struct Bound {
    path: PathBuf,
    id: FileId,
}

impl Bound {
    /// Removes the file if it is still the one bound.
    pub(super) fn remove(self) {
        match std::fs::symlink_metadata(&self.path) {
            Ok(m) if FileId::of(&m) == self.id => {
                if let Err(e) = std::fs::remove_file(&self.path) {
                    tracing::warn!(socket = %self.path.display(), "nri: remove the socket: {e}");
                }
            }
            Ok(_) => tracing::info!(
                socket = %self.path.display(),
                "nri: the socket file was replaced since crius bound it; left in place"
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(socket = %self.path.display(), "nri: the socket: {e}"),
        }
    }
}

/// Binds the socket; a stale file is replaced, one another process serves is not.
fn listen(path: &Path) -> Result<(UnixListener, Bound), String> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    }
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(format!("{} is served by another process", path.display()));
        }
        std::fs::remove_file(path).map_err(|e| format!("remove stale {}: {e}", path.display()))?;
    }
    let listener = UnixListener::bind(path).map_err(|e| format!("bind {}: {e}", path.display()))?;
    // A socket that cannot be made root's only, or whose file could not be told apart later,
    // is not served, and its file not left behind.
    let id = owner_only(path).inspect_err(|_| {
        let _ = std::fs::remove_file(path);
    })?;
    let bound = Bound {
        path: path.to_path_buf(),
        id,
    };
    Ok((listener, bound))
}

/// Makes the socket file at `path` root's only (plugins change what containers run with) and
/// returns what identifies it.
fn owner_only(path: &Path) -> Result<FileId, String> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("chmod {}: {e}", path.display()))?;
    let m = std::fs::symlink_metadata(path).map_err(|e| format!("stat {}: {e}", path.display()))?;
    Ok(FileId::of(&m))
}

/// The executables of `dir` named `<two digits>-<name>`, in index order.
fn preinstalled(dir: &Path) -> Vec<(String, String, PathBuf)> {
    use std::os::unix::fs::PermissionsExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<_> = entries
        .flatten()
        .filter_map(|e| {
            let file = e.file_name().to_string_lossy().into_owned();
            let (index, name) = parse_plugin_file(&file)?;
            let meta = std::fs::metadata(e.path()).ok()?;
            (meta.is_file() && meta.permissions().mode() & 0o111 != 0)
                .then(|| (index, name, e.path()))
        })
        .collect();
    out.sort();
    out
}

/// `"10-logger"` → `("10", "logger")`.
pub(super) fn parse_plugin_file(file: &str) -> Option<(String, String)> {
    let (index, name) = file.split_once('-')?;
    (valid_index(index) && !name.is_empty()).then(|| (index.to_string(), name.to_string()))
}

fn valid_index(index: &str) -> bool {
    index.len() == 2 && index.bytes().all(|b| b.is_ascii_digit())
}

/// Starts a pre-installed plugin with one end of a socket pair as its fd 3.
fn launch(
    nri: Arc<Nri>,
    domain: Arc<dyn Domain>,
    index: &str,
    name: &str,
    path: &Path,
) -> std::io::Result<()> {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
    let theirs = OwnedFd::from(theirs);
    let fd = theirs.as_raw_fd();
    let mut cmd = tokio::process::Command::new(path);
    cmd.env("NRI_PLUGIN_SOCKET", "3")
        .env("NRI_PLUGIN_NAME", name)
        .env("NRI_PLUGIN_IDX", index)
        .stdin(std::process::Stdio::null());
    // SAFETY: only async-signal-safe calls (dup2, fcntl) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if fd == 3 {
                let flags = libc::fcntl(3, libc::F_GETFD);
                if flags < 0 || libc::fcntl(3, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::dup2(fd, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    drop(theirs);
    ours.set_nonblocking(true)?;
    let stream = UnixStream::from_std(ours)?;
    let id = format!("{index}-{name}");
    tokio::spawn(async move {
        match child.wait().await {
            Ok(status) => tracing::info!(plugin = %id, "nri: plugin exited: {status}"),
            Err(e) => tracing::warn!(plugin = %id, "nri: wait for plugin: {e}"),
        }
    });
    tokio::spawn(serve(
        nri,
        domain,
        stream,
        Some((index.to_string(), name.to_string())),
    ));
    Ok(())
}

/// Registers, configures and synchronizes one plugin, then answers its requests until it
/// goes.
async fn serve(
    nri: Arc<Nri>,
    domain: Arc<dyn Domain>,
    stream: UnixStream,
    launched: Option<(String, String)>,
) {
    let (link, requests) = Link::start(stream);
    let plugin = match handshake(&nri, &domain, &link, requests, launched).await {
        Ok(p) => p,
        Err(why) => {
            tracing::warn!("nri: plugin refused: {why}");
            link.shutdown().await;
            return;
        }
    };
    tracing::info!(plugin = %plugin.id(), "nri: plugin connected");
    link.closed().await;
    nri.drop_plugin(&plugin, "connection closed");
}

async fn handshake(
    nri: &Arc<Nri>,
    domain: &Arc<dyn Domain>,
    link: &Arc<Link>,
    mut requests: mpsc::Receiver<Incoming>,
    launched: Option<(String, String)>,
) -> Result<Arc<Plugin>, String> {
    let timeout = nri.registration_timeout;
    let registered = register(link, &mut requests, launched.clone());
    let (index, name) = tokio::time::timeout(timeout, registered)
        .await
        .map_err(|_| format!("no RegisterPlugin within {timeout:?}"))??;
    // From now on the plugin's requests are answered as they come, also while it is being
    // configured and synchronized (it may ask for updates from inside those calls).
    let (answer_link, answer_domain) = (Arc::clone(link), Arc::clone(domain));
    tokio::spawn(async move {
        while let Some(req) = requests.recv().await {
            answer(&answer_link, &answer_domain, req).await;
        }
    });
    let id = format!("{index}-{name}");
    if nri.plugins().iter().any(|p| p.id() == id) {
        return Err(format!("plugin {id} is already connected"));
    }
    let config = plugin_config(&nri.config.plugin_config_path, &index, &name);
    let configure = api::ConfigureRequest {
        config,
        runtime_name: "crius".into(),
        runtime_version: env!("CARGO_PKG_VERSION").into(),
        registration_timeout: millis(nri.registration_timeout),
        request_timeout: millis(nri.request_timeout),
        nri_version: NRI_VERSION.into(),
    };
    let resp: api::ConfigureResponse = link
        .call("Configure", &configure, timeout)
        .await
        .map_err(|e| format!("{id}: Configure: {e}"))?;
    let all = (1 << (api::Event::Last as i32 - 1)) - 1;
    let events = if resp.events == 0 {
        all
    } else {
        resp.events & all
    };

    // Under the write side of the sync lock: no pod or container is being made, so the
    // snapshot is complete and every later one reaches this plugin as an event.
    let _sync = nri.sync.write().await;
    let (pods, containers) = domain.snapshot();
    let chunks = sync_chunks(pods, containers);
    let last = chunks.len() - 1;
    let mut updates = Vec::new();
    for (i, (pods, containers)) in chunks.into_iter().enumerate() {
        let req = api::SynchronizeRequest {
            pods,
            containers,
            more: i < last,
        };
        let resp: api::SynchronizeResponse = link
            .call("Synchronize", &req, timeout)
            .await
            .map_err(|e| format!("{id}: Synchronize: {e}"))?;
        updates.extend(resp.update);
    }
    if !updates.is_empty() {
        let failed = Arc::clone(domain).update_containers(updates).await;
        if !failed.is_empty() {
            tracing::warn!(plugin = %id, "nri: {} synchronization updates failed", failed.len());
        }
    }
    let plugin = Arc::new(Plugin {
        name,
        index,
        events,
        link: Arc::clone(link),
        launched: launched.is_some(),
    });
    nri.add_plugin(Arc::clone(&plugin));
    Ok(plugin)
}

/// Waits for `RegisterPlugin`, answering anything else with an error.
async fn register(
    link: &Link,
    requests: &mut mpsc::Receiver<Incoming>,
    launched: Option<(String, String)>,
) -> Result<(String, String), String> {
    while let Some(req) = requests.recv().await {
        if req.request.method != "RegisterPlugin" {
            link.answer(
                req.stream_id,
                Err(status(CODE_FAILED_PRECONDITION, "plugin not registered")),
            )
            .await;
            continue;
        }
        let reg = match api::RegisterPluginRequest::decode(req.request.payload.as_slice()) {
            Ok(r) => r,
            Err(e) => {
                let msg = format!("undecodable RegisterPlugin: {e}");
                link.answer(req.stream_id, Err(status(CODE_FAILED_PRECONDITION, &msg)))
                    .await;
                return Err(msg);
            }
        };
        let (index, name) = match &launched {
            // crius named the plugin it started; what it says of itself must agree
            Some((index, name)) => (index.clone(), name.clone()),
            None => (reg.plugin_idx.clone(), reg.plugin_name.clone()),
        };
        let problem = if !valid_index(&index) {
            Some(format!(
                "plugin_idx {:?} must be two digits",
                crate::util::excerpt(&index)
            ))
        } else if name.is_empty() || name.len() > 128 || name.contains(['/', '\0']) {
            Some(format!(
                "plugin_name {:?} must be 1 to 128 characters without '/'",
                crate::util::excerpt(&name)
            ))
        } else {
            None
        };
        if let Some(msg) = problem {
            link.answer(req.stream_id, Err(status(CODE_FAILED_PRECONDITION, &msg)))
                .await;
            return Err(msg);
        }
        link.answer(req.stream_id, Ok(api::Empty {}.encode_to_vec()))
            .await;
        return Ok((index, name));
    }
    Err("connection closed before RegisterPlugin".into())
}

/// Answers a registered plugin's request to the `Runtime` service.
async fn answer(link: &Link, domain: &Arc<dyn Domain>, req: Incoming) {
    let result = match req.request.method.as_str() {
        "UpdateContainers" => {
            match api::UpdateContainersRequest::decode(req.request.payload.as_slice()) {
                Ok(r) => {
                    if !r.evict.is_empty() {
                        tracing::warn!("nri: eviction requests are not supported; ignored");
                    }
                    let failed = Arc::clone(domain).update_containers(r.update).await;
                    Ok(api::UpdateContainersResponse { failed }.encode_to_vec())
                }
                Err(e) => Err(status(
                    CODE_FAILED_PRECONDITION,
                    &format!("undecodable UpdateContainers: {e}"),
                )),
            }
        }
        "RegisterPlugin" => Err(status(
            CODE_FAILED_PRECONDITION,
            "plugin already registered",
        )),
        other => Err(status(
            CODE_UNIMPLEMENTED,
            &format!("method {:?} is not served", crate::util::excerpt(other)),
        )),
    };
    link.answer(req.stream_id, result).await;
}

fn status(code: i32, message: &str) -> ttrpc::Status {
    ttrpc::Status {
        code,
        message: message.to_string(),
    }
}

fn millis(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// `<index>-<name>.conf`, else `<name>.conf`, in the config dir; empty when neither exists.
fn plugin_config(dir: &Path, index: &str, name: &str) -> String {
    [format!("{index}-{name}.conf"), format!("{name}.conf")]
        .iter()
        .find_map(|f| std::fs::read_to_string(dir.join(f)).ok())
        .unwrap_or_default()
}

/// The snapshot cut into messages of at most [`SYNC_CHUNK`] pods and containers each; at
/// least one (empty) message.
fn sync_chunks(
    pods: Vec<api::PodSandbox>,
    containers: Vec<api::Container>,
) -> Vec<(Vec<api::PodSandbox>, Vec<api::Container>)> {
    let mut out = Vec::new();
    let mut pods = pods.into_iter().peekable();
    let mut containers = containers.into_iter().peekable();
    loop {
        let p: Vec<_> = pods.by_ref().take(SYNC_CHUNK).collect();
        let room = SYNC_CHUNK - p.len();
        let c: Vec<_> = containers.by_ref().take(room).collect();
        let done = pods.peek().is_none() && containers.peek().is_none();
        if !p.is_empty() || !c.is_empty() || out.is_empty() {
            out.push((p, c));
        }
        if done {
            return out;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_bound_socket_is_removed_and_a_replaced_one_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nri.sock");
        let (listener, bound) = listen(&path).unwrap();
        drop(listener);
        bound.remove();
        assert!(!path.exists(), "the socket crius bound is left");

        // Bound again (the stale file's replacement), then replaced by someone else's file.
        let (listener, bound) = listen(&path).unwrap();
        drop(listener);
        let other = dir.path().join("other");
        std::fs::write(&other, "another's").unwrap();
        std::fs::rename(&other, &path).unwrap();
        bound.remove();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "another's");
    }

    #[test]
    fn plugin_files_need_a_two_digit_index() {
        assert_eq!(
            parse_plugin_file("10-logger"),
            Some(("10".into(), "logger".into()))
        );
        assert_eq!(
            parse_plugin_file("05-a-b"),
            Some(("05".into(), "a-b".into()))
        );
        assert_eq!(parse_plugin_file("1-logger"), None);
        assert_eq!(parse_plugin_file("logger"), None);
        assert_eq!(parse_plugin_file("10-"), None);
    }

    #[test]
    fn the_snapshot_goes_in_bounded_messages() {
        let pods = vec![api::PodSandbox::default(); 100];
        let containers = vec![api::Container::default(); 30];
        let chunks = sync_chunks(pods, containers);
        assert_eq!(chunks.len(), 3);
        assert_eq!((chunks[0].0.len(), chunks[0].1.len()), (64, 0));
        assert_eq!((chunks[1].0.len(), chunks[1].1.len()), (36, 28));
        assert_eq!((chunks[2].0.len(), chunks[2].1.len()), (0, 2));
        assert_eq!(sync_chunks(Vec::new(), Vec::new()).len(), 1);
    }
}
