//! NRI, the Node Resource Interface: plugins that connect to crius's NRI socket (or that
//! crius starts from `[nri] plugin_path`) see every pod and container lifecycle event and may
//! adjust a container before it is created.
//!
//! The protocol is containerd/nri's (`proto/nri/api.proto`), spoken with crius's own ttrpc
//! framing ([`wire`], [`link`]). A plugin registers (name, two-digit index), is configured
//! (the events it wants), then synchronized with every pod and container that exists; only
//! then does it receive events, in index order with the others.
//!
//! No event is lost or repeated between a plugin's snapshot and its first live event: the
//! calls that make pods and containers (`RunPodSandbox`, `CreateContainer`) hold [`Nri::block_sync`]
//! for their whole run, and a plugin is synchronized under the write side of the same lock.
//!
//! A plugin that does not answer within `plugin_request_timeout` is disconnected; a failed or
//! timed-out `RunPodSandbox`, `CreateContainer`, `StartContainer` or `UpdateContainer` fails
//! that call (and what it made is undone), while errors of the stop and remove events are
//! only logged. With no plugin connected an event costs one lock-free check.

pub mod adjust;
pub mod convert;
pub mod link;
pub mod wire;

mod domain;
mod server;

use std::collections::HashSet;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use crius_api::nri::api;

use crate::config::NriConfig;
use crate::error::{Error, Result};
use link::{CallError, Link};

/// The NRI version whose protocol crius speaks, told to plugins in `Configure`.
pub const NRI_VERSION: &str = "v0.12.1";

/// A registered, synchronized plugin.
pub struct Plugin {
    pub name: String,
    pub index: String,
    /// Bit `e - 1` set: the plugin wants event `e`.
    events: i32,
    link: Arc<Link>,
    /// crius started it from `plugin_path`.
    pub launched: bool,
}

impl Plugin {
    fn wants(&self, event: api::Event) -> bool {
        let bit = event as i32 - 1;
        (0..31).contains(&bit) && self.events & (1 << bit) != 0
    }

    /// `<index>-<name>`, as plugins are known in logs and errors.
    pub fn id(&self) -> String {
        format!("{}-{}", self.index, self.name)
    }
}

/// What [`Nri`] needs of the daemon: the pods and containers a new plugin is synchronized
/// with, and updates of containers' resources that plugins ask for.
pub trait Domain: Send + Sync {
    /// Every pod and container crius has, in NRI form.
    fn snapshot(&self) -> (Vec<api::PodSandbox>, Vec<api::Container>);
    /// Applies plugins' updates to other containers' resources; returns those that failed.
    fn update_containers(
        self: Arc<Self>,
        updates: Vec<api::ContainerUpdate>,
    ) -> futures::future::BoxFuture<'static, Vec<api::ContainerUpdate>>;
}

/// The plugins and the lock that orders their synchronization against lifecycle calls.
pub struct Nri {
    config: NriConfig,
    registration_timeout: Duration,
    request_timeout: Duration,
    plugins: RwLock<Vec<Arc<Plugin>>>,
    sync: tokio::sync::RwLock<()>,
    /// Containers and pods plugins have been told exist and not yet that they are removed.
    known: Mutex<HashSet<String>>,
    /// Containers and pods whose stop plugins have been told of (once each).
    stopped: Mutex<std::collections::HashMap<String, Arc<tokio::sync::OnceCell<()>>>>,
    /// Where the socket is, or why there is none, for Status.
    socket_state: Mutex<String>,
    /// The socket file this crius bound, removed when crius stops.
    bound: Mutex<Option<server::Bound>>,
}

/// A guard that keeps plugins from being synchronized while it lives.
pub type SyncGuard<'a> = Option<tokio::sync::RwLockReadGuard<'a, ()>>;

impl Nri {
    pub fn new(config: &NriConfig) -> Nri {
        Nri {
            registration_timeout: config.registration_timeout(),
            request_timeout: config.request_timeout(),
            config: config.clone(),
            plugins: RwLock::new(Vec::new()),
            sync: tokio::sync::RwLock::new(()),
            known: Mutex::new(HashSet::new()),
            stopped: Mutex::new(std::collections::HashMap::new()),
            socket_state: Mutex::new(if config.enable {
                "not started".into()
            } else {
                "disabled".into()
            }),
            bound: Mutex::new(None),
        }
    }

    /// Whether NRI is on (`[nri] enable`).
    pub fn enabled(&self) -> bool {
        self.config.enable
    }

    /// Whether any plugin is connected; events are built only then.
    pub fn active(&self) -> bool {
        !self.read_plugins().is_empty()
    }

    /// Connected plugins, in the order events reach them.
    pub fn plugins(&self) -> Vec<Arc<Plugin>> {
        self.read_plugins().clone()
    }

    /// The socket's path or why it is not served.
    pub fn socket_state(&self) -> String {
        lock(&self.socket_state).clone()
    }

    /// Removes the socket file this crius bound, as crius stops: like the CRI socket, none is
    /// left for a crius that is gone. A file another process has put there since is kept.
    pub fn remove_socket(&self) {
        if let Some(bound) = lock(&self.bound).take() {
            bound.remove();
        }
    }

    /// Held by calls that make pods or containers, so a plugin's snapshot and its live events
    /// neither miss nor repeat one.
    pub async fn block_sync(&self) -> SyncGuard<'_> {
        if self.config.enable {
            Some(self.sync.read().await)
        } else {
            None
        }
    }

    /// Starts serving the socket and the plugins of `plugin_path`.
    pub fn start(self: &Arc<Self>, domain: Arc<dyn Domain>, known: Vec<String>) {
        if !self.config.enable {
            return;
        }
        lock(&self.known).extend(known);
        server::start(Arc::clone(self), domain);
    }

    fn read_plugins(&self) -> std::sync::RwLockReadGuard<'_, Vec<Arc<Plugin>>> {
        self.plugins.read().unwrap_or_else(|e| e.into_inner())
    }

    fn add_plugin(&self, plugin: Arc<Plugin>) {
        let mut plugins = self.plugins.write().unwrap_or_else(|e| e.into_inner());
        plugins.push(plugin);
        plugins.sort_by(|a, b| (&a.index, &a.name).cmp(&(&b.index, &b.name)));
    }

    fn drop_plugin(&self, plugin: &Plugin, why: &str) {
        let mut plugins = self.plugins.write().unwrap_or_else(|e| e.into_inner());
        let before = plugins.len();
        plugins.retain(|p| !Arc::ptr_eq(&p.link, &plugin.link));
        if plugins.len() != before {
            tracing::warn!(plugin = %plugin.id(), "nri: plugin disconnected: {why}");
        }
        plugin.link.close();
    }

    /// Calls `method` on every plugin that wants `event`, in order. A plugin that times out
    /// or is gone is disconnected. Returns each answer with the plugin's id.
    async fn deliver<Req: prost::Message, Resp: prost::Message + Default>(
        &self,
        event: api::Event,
        method: &str,
        req: &Req,
    ) -> Vec<(String, std::result::Result<Resp, CallError>)> {
        let mut out = Vec::new();
        for plugin in self.plugins() {
            if !plugin.wants(event) {
                continue;
            }
            let result = plugin.link.call(method, req, self.request_timeout).await;
            if let Err(e @ (CallError::Timeout(_) | CallError::Closed)) = &result {
                self.drop_plugin(&plugin, &e.to_string());
                let link = Arc::clone(&plugin.link);
                tokio::spawn(async move { link.shutdown().await });
            }
            out.push((plugin.id(), result));
        }
        out
    }

    /// A `StateChange` event; the first plugin error when `fatal`, else errors are logged.
    async fn state_change(
        &self,
        event: api::Event,
        pod: &api::PodSandbox,
        container: Option<&api::Container>,
        fatal: bool,
    ) -> Result<()> {
        let req = api::StateChangeEvent {
            event: event as i32,
            pod: Some(pod.clone()),
            container: container.cloned(),
        };
        for (plugin, result) in self
            .deliver::<_, api::Empty>(event, "StateChange", &req)
            .await
        {
            if let Err(e) = result {
                let msg = format!("NRI plugin {plugin} failed {}: {e}", event_name(event));
                if fatal {
                    return Err(plugin_error(msg, &e));
                }
                tracing::warn!("{msg}");
            }
        }
        Ok(())
    }

    /// Records that pod or container `id` exists, made while no plugin was connected (a
    /// plugin that connects later hears of its stop and removal).
    pub fn note_created(&self, id: &str) {
        if self.config.enable {
            lock(&self.known).insert(id.to_string());
        }
    }

    /// `RunPodSandbox`: every plugin must accept the pod.
    pub async fn run_pod_sandbox(&self, pod: &api::PodSandbox) -> Result<()> {
        if !self.config.enable {
            return Ok(());
        }
        if !self.active() {
            lock(&self.known).insert(pod.id.clone());
            return Ok(());
        }
        self.state_change(api::Event::RunPodSandbox, pod, None, true)
            .await?;
        lock(&self.known).insert(pod.id.clone());
        Ok(())
    }

    /// `StopPodSandbox`, once per pod.
    pub async fn stop_pod_sandbox(&self, id: &str, pod: impl FnOnce() -> api::PodSandbox) {
        if !self.is_known(id) {
            return;
        }
        self.stop_cell(id)
            .get_or_init(|| async {
                if self.active() {
                    let _ = self
                        .state_change(api::Event::StopPodSandbox, &pod(), None, false)
                        .await;
                }
            })
            .await;
    }

    /// `RemovePodSandbox`.
    pub async fn remove_pod_sandbox(&self, id: &str, pod: impl FnOnce() -> api::PodSandbox) {
        if !self.config.enable || !lock(&self.known).remove(id) {
            return;
        }
        lock(&self.stopped).remove(id);
        if self.active() {
            let _ = self
                .state_change(api::Event::RemovePodSandbox, &pod(), None, false)
                .await;
        }
    }

    /// `UpdatePodSandbox`: a plugin error fails the update.
    pub async fn update_pod_sandbox(
        &self,
        pod: api::PodSandbox,
        overhead: Option<api::LinuxResources>,
        resources: Option<api::LinuxResources>,
    ) -> Result<()> {
        let req = api::UpdatePodSandboxRequest {
            pod: Some(pod),
            overhead_linux_resources: overhead,
            linux_resources: resources,
        };
        for (plugin, result) in self
            .deliver::<_, api::UpdatePodSandboxResponse>(
                api::Event::UpdatePodSandbox,
                "UpdatePodSandbox",
                &req,
            )
            .await
        {
            result.map_err(|e| {
                plugin_error(
                    format!("NRI plugin {plugin} failed UpdatePodSandbox: {e}"),
                    &e,
                )
            })?;
        }
        Ok(())
    }

    /// `PostUpdatePodSandbox`: errors logged.
    pub async fn post_update_pod_sandbox(&self, pod: api::PodSandbox) {
        let _ = self
            .state_change(api::Event::PostUpdatePodSandbox, &pod, None, false)
            .await;
    }

    /// `CreateContainer`: the plugins' adjustments merged (a field two plugins set is an
    /// error naming both), and the updates they ask for other containers.
    pub async fn create_container(
        &self,
        pod: &api::PodSandbox,
        container: &api::Container,
    ) -> Result<(adjust::Merged, Vec<api::ContainerUpdate>)> {
        let mut merged = adjust::Merged::default();
        let mut updates = Vec::new();
        if !self.config.enable {
            return Ok((merged, updates));
        }
        if self.active() {
            let req = api::CreateContainerRequest {
                pod: Some(pod.clone()),
                container: Some(container.clone()),
            };
            let answers = self
                .deliver::<_, api::CreateContainerResponse>(
                    api::Event::CreateContainer,
                    "CreateContainer",
                    &req,
                )
                .await;
            for (plugin, result) in answers {
                let resp = result.map_err(|e| {
                    plugin_error(
                        format!("NRI plugin {plugin} failed CreateContainer: {e}"),
                        &e,
                    )
                })?;
                if let Some(a) = resp.adjust {
                    merged.add(&plugin, a).map_err(Error::FailedPrecondition)?;
                }
                updates.extend(resp.update);
                if !resp.evict.is_empty() {
                    tracing::warn!(plugin, "nri: eviction requests are not supported; ignored");
                }
            }
        }
        lock(&self.known).insert(container.id.clone());
        Ok((merged, updates))
    }

    /// `PostCreateContainer`, `PostStartContainer`, `PostUpdateContainer`: errors logged.
    pub async fn post(
        &self,
        event: api::Event,
        pod: impl FnOnce() -> api::PodSandbox,
        container: impl FnOnce() -> api::Container,
    ) {
        if self.active() {
            let _ = self
                .state_change(event, &pod(), Some(&container()), false)
                .await;
        }
    }

    /// `StartContainer`: a plugin error fails the start.
    pub async fn start_container(
        &self,
        pod: impl FnOnce() -> api::PodSandbox,
        container: impl FnOnce() -> api::Container,
    ) -> Result<()> {
        if !self.active() {
            return Ok(());
        }
        self.state_change(api::Event::StartContainer, &pod(), Some(&container()), true)
            .await
    }

    /// `UpdateContainer`: the resources plugins want instead (the last update naming the
    /// container wins), and their updates of other containers.
    pub async fn update_container(
        &self,
        pod: impl FnOnce() -> api::PodSandbox,
        container: impl FnOnce() -> api::Container,
        resources: api::LinuxResources,
    ) -> Result<Vec<api::ContainerUpdate>> {
        if !self.active() {
            return Ok(Vec::new());
        }
        let req = api::UpdateContainerRequest {
            pod: Some(pod()),
            container: Some(container()),
            linux_resources: Some(resources),
        };
        let mut updates = Vec::new();
        for (plugin, result) in self
            .deliver::<_, api::UpdateContainerResponse>(
                api::Event::UpdateContainer,
                "UpdateContainer",
                &req,
            )
            .await
        {
            let resp = result.map_err(|e| {
                plugin_error(
                    format!("NRI plugin {plugin} failed UpdateContainer: {e}"),
                    &e,
                )
            })?;
            updates.extend(resp.update);
        }
        Ok(updates)
    }

    /// `StopContainer`, once per container (an explicit stop and the container's own exit
    /// both report it); returns the updates plugins ask for other containers.
    pub async fn stop_container(
        &self,
        id: &str,
        pod: impl FnOnce() -> api::PodSandbox,
        container: impl FnOnce() -> api::Container,
    ) -> Vec<api::ContainerUpdate> {
        let mut updates = Vec::new();
        if !self.is_known(id) {
            return updates;
        }
        self.stop_cell(id)
            .get_or_init(|| async {
                if !self.active() {
                    return;
                }
                let req = api::StopContainerRequest {
                    pod: Some(pod()),
                    container: Some(container()),
                };
                for (plugin, result) in self
                    .deliver::<_, api::StopContainerResponse>(
                        api::Event::StopContainer,
                        "StopContainer",
                        &req,
                    )
                    .await
                {
                    match result {
                        Ok(resp) => updates.extend(resp.update),
                        Err(e) => tracing::warn!("NRI plugin {plugin} failed StopContainer: {e}"),
                    }
                }
            })
            .await;
        updates
    }

    /// `RemoveContainer` (after `StopContainer`, if that was not delivered yet).
    pub async fn remove_container(
        &self,
        id: &str,
        pod: impl Fn() -> api::PodSandbox,
        container: impl Fn() -> api::Container,
    ) -> Vec<api::ContainerUpdate> {
        if !self.is_known(id) {
            return Vec::new();
        }
        let updates = self.stop_container(id, &pod, &container).await;
        lock(&self.known).remove(id);
        lock(&self.stopped).remove(id);
        if self.active() {
            let _ = self
                .state_change(
                    api::Event::RemoveContainer,
                    &pod(),
                    Some(&container()),
                    false,
                )
                .await;
        }
        updates
    }

    fn is_known(&self, id: &str) -> bool {
        self.config.enable && lock(&self.known).contains(id)
    }

    fn stop_cell(&self, id: &str) -> Arc<tokio::sync::OnceCell<()>> {
        Arc::clone(lock(&self.stopped).entry(id.to_string()).or_default())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn event_name(e: api::Event) -> &'static str {
    match e {
        api::Event::RunPodSandbox => "RunPodSandbox",
        api::Event::StopPodSandbox => "StopPodSandbox",
        api::Event::RemovePodSandbox => "RemovePodSandbox",
        api::Event::CreateContainer => "CreateContainer",
        api::Event::PostCreateContainer => "PostCreateContainer",
        api::Event::StartContainer => "StartContainer",
        api::Event::PostStartContainer => "PostStartContainer",
        api::Event::UpdateContainer => "UpdateContainer",
        api::Event::PostUpdateContainer => "PostUpdateContainer",
        api::Event::StopContainer => "StopContainer",
        api::Event::RemoveContainer => "RemoveContainer",
        api::Event::UpdatePodSandbox => "UpdatePodSandbox",
        api::Event::PostUpdatePodSandbox => "PostUpdatePodSandbox",
        _ => "an event",
    }
}

/// A plugin's refusal is FailedPrecondition; a plugin that did not answer, Unavailable.
fn plugin_error(msg: String, e: &CallError) -> Error {
    match e {
        CallError::Timeout(_) => Error::DeadlineExceeded(msg),
        CallError::Closed => Error::Unavailable(msg),
        _ => Error::FailedPrecondition(msg),
    }
}
