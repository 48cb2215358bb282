//! The daemon's shared state: configuration, database and the domain services every RPC
//! handler reaches through `&Daemon`.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use crius_cni::{Network, NetworkOptions};
use crius_image::{ImageStore, StoreConfig};

use crate::config::Config;
use crate::error::{Error, Result};
use crate::records::{ContainerRecord, Records, Released, SandboxRecord};
use crate::shims::Shims;
use crate::store::{Store, Table};
use crate::util::{kernel_at_least, Locks};

/// Everything a running crius owns. One per process, shared behind an `Arc`.
pub struct Daemon {
    pub(crate) config: Config,
    /// Pod and container records, name reservations.
    pub(crate) store: Store,
    /// Images: pull, records, snapshots, leases held by containers.
    pub(crate) images: ImageStore,
    /// The node's pod network (CNI).
    pub(crate) network: Network,
    pub(crate) sandboxes: Records<SandboxRecord>,
    pub(crate) containers: Records<ContainerRecord>,
    /// Exited containers whose runtime state and mounts are already given back.
    pub(crate) released: Released,
    pub(crate) shims: Shims,
    /// One lock per pod and per container id.
    pub(crate) locks: Locks,
    /// The static pause binary, bind-mounted into every pod's infra container.
    pub(crate) pause_binary: std::path::PathBuf,
    /// The HTTP server behind the URLs of Exec, Attach and PortForward.
    pub(crate) streams: Arc<crate::stream::StreamServer>,
    pub(crate) started_at: SystemTime,
    /// Whether user-namespaced pods work here, else why not; probed once at start.
    userns: std::sync::OnceLock<std::result::Result<(), String>>,
    /// A background retry of network releases that failed is under way.
    pub(crate) network_release_pending: std::sync::atomic::AtomicBool,
    /// The runtime handlers, checked at start after the user namespace probe.
    handlers: std::sync::OnceLock<crate::handlers::Handlers>,
    /// What the node is, for the specs: probed at start, after the AppArmor profile's load.
    host: std::sync::OnceLock<crate::spec::HostFacts>,
    /// The last CPU sample of each pod and container cgroup, for usage_nano_cores.
    pub(crate) cpu_rates: crate::cpu_rates::CpuRates,
    /// Lifecycle events for GetContainerEvents subscribers.
    pub(crate) events: crate::events::Events,
    /// The Prometheus endpoint (`[metrics] address`).
    pub(crate) metrics_endpoint: crate::telemetry::server::Endpoint,
    /// `[images] pinned` in force (SIGHUP replaces it).
    pinned: std::sync::RwLock<crate::config::ImagesConfig>,
    /// NRI plugins and the lock ordering their synchronization against lifecycle calls.
    pub(crate) nri: Arc<crate::nri::Nri>,
}

impl Daemon {
    /// The configuration crius started with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The runtime handlers (probed at start; before that, without probing the built-in
    /// path's features).
    pub fn handlers(&self) -> &crate::handlers::Handlers {
        self.handlers.get_or_init(|| {
            crate::handlers::Handlers::probe(&self.config.runtime, false, false, None)
        })
    }

    /// The node's facts the specs follow (probed at start; before that, on first use).
    pub(crate) fn host(&self) -> &crate::spec::HostFacts {
        self.host.get_or_init(crate::spec::HostFacts::probe)
    }

    /// The handler a pod that asked for `name` runs under, as metrics label it (the default
    /// handler's name for "").
    pub fn handler_label(&self, name: &str) -> String {
        if name.is_empty() {
            self.config.runtime.default_handler.clone()
        } else {
            name.to_string()
        }
    }

    /// The `[images] pinned` pattern that pins `record`, if one does.
    pub fn pinned_by(&self, record: &crius_image::ImageRecord) -> Option<String> {
        let pinned = self.pinned.read().unwrap_or_else(|e| e.into_inner());
        let names: Vec<String> = record
            .repo_tags
            .iter()
            .chain(&record.repo_digests)
            .cloned()
            .collect();
        pinned.pinned_by(&names).map(str::to_string)
    }

    /// Whether user-namespaced pods work on this node (false until probed at start).
    pub fn userns_supported(&self) -> bool {
        self.userns_support().is_ok()
    }

    /// `Ok` when user-namespaced pods work on this node, else why not.
    pub fn userns_support(&self) -> std::result::Result<(), &str> {
        match self.userns.get() {
            Some(Ok(())) => Ok(()),
            Some(Err(why)) => Err(why),
            None => Err("crius has not finished starting"),
        }
    }
}

impl std::fmt::Debug for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daemon")
            .field("root", &self.config.root)
            .field("state", &self.config.state)
            .finish_non_exhaustive()
    }
}

impl Daemon {
    /// Opens the database and the image store under `config.root` and prepares the state
    /// directory.
    pub fn open(config: Config) -> anyhow::Result<Arc<Daemon>> {
        crate::cgroups::init(&config.cgroup)?;
        std::fs::create_dir_all(&config.state)
            .with_context(|| format!("create state directory {}", config.state.display()))?;
        let store = Store::open(&config.root)?;
        let images = ImageStore::open(StoreConfig {
            root: config.root.clone(),
            registry_config_dir: Some(config.registry.config_path.clone()),
            max_concurrent_downloads: config.registry.max_concurrent_downloads,
            no_progress_timeout: Duration::from_secs(config.registry.stall_timeout_secs),
            auth_file: non_empty(&config.registry.auth_file),
            ..StoreConfig::default()
        })
        .with_context(|| format!("open image store in {}", config.root.display()))?;
        let network = Network::new(NetworkOptions {
            conf_dir: config.cni.conf_dir.clone(),
            bin_dirs: config.cni.bin_dirs.clone(),
            // Under root, not state: host-local's IP store survives a reboot, so what DEL
            // needs to release those IPs must too.
            cache_dir: config.root.join("cni"),
            plugin_timeout: Duration::from_secs(config.cni.plugin_timeout_secs),
            ..NetworkOptions::default()
        });
        let sandboxes = Records::load(&store, Table::Sandboxes)?;
        let containers = Records::load(&store, Table::Containers)?;
        let shims = Shims::new(
            config.shim_binary(),
            &config.state,
            config.runtime.max_container_log_line_size,
            Duration::from_secs(config.runtime.shim_operation_timeout_secs),
        );
        let pause_binary = config.state.join("bin").join("crius-pause");
        let images_config = config.images.clone();
        let nri = Arc::new(crate::nri::Nri::new(&config.nri));
        Ok(Arc::new(Daemon {
            config,
            store,
            images,
            network,
            sandboxes,
            containers,
            shims,
            locks: Locks::default(),
            pause_binary,
            streams: Arc::default(),
            started_at: SystemTime::now(),
            userns: std::sync::OnceLock::new(),
            network_release_pending: std::sync::atomic::AtomicBool::new(false),
            cpu_rates: Default::default(),
            released: Default::default(),
            handlers: std::sync::OnceLock::new(),
            host: std::sync::OnceLock::new(),
            events: crate::events::Events::default(),
            metrics_endpoint: Default::default(),
            pinned: std::sync::RwLock::new(images_config),
            nri,
        }))
    }

    /// What runs once before serving: the pause binary in place (on crius's own exec tmpfs,
    /// `mounts::prepare_exec_dir`), and the pods and containers of the database matched with
    /// what is really there.
    pub async fn start(self: &Arc<Self>) -> anyhow::Result<()> {
        if let Some(bin) = self.pause_binary.parent() {
            crate::mounts::prepare_exec_dir(bin, crate::mounts::mount_exec_tmpfs)
                .map_err(|e| anyhow::anyhow!("{}", crate::error::chain(&e)))?;
        }
        if crate::apparmor::enabled() {
            let state = self.config.state.clone();
            tokio::task::spawn_blocking(move || {
                crate::apparmor::load_default(&state);
            })
            .await
            .context("load the AppArmor profile")?;
        }
        let host = tokio::task::spawn_blocking(crate::spec::HostFacts::probe)
            .await
            .context("probe the node")?;
        tracing::debug!(?host, "node probed");
        let _ = self.host.set(host);
        self.shims
            .install_pause(&self.pause_binary)
            .await
            .map_err(|e| anyhow::anyhow!("{}", crate::error::chain(&e)))?;
        let (root, state) = (self.config.root.clone(), self.config.state.clone());
        let pause = self.pause_binary.clone();
        let userns =
            tokio::task::spawn_blocking(move || crate::userns::probe(&root, &state, &pause))
                .await
                .unwrap_or_else(|e| Err(e.to_string()));
        if let Err(why) = &userns {
            tracing::warn!("user-namespaced pods are not supported here: {why}");
        }
        let _ = self.userns.set(userns);
        let (runtime, userns) = (self.config.runtime.clone(), self.userns_supported());
        let (state, pause) = (self.config.state.clone(), self.pause_binary.clone());
        let probing = std::time::Instant::now();
        let handlers = tokio::task::spawn_blocking(move || {
            let place = crate::handlers::TrialPlace {
                state: &state,
                pause: &pause,
            };
            crate::handlers::Handlers::probe(&runtime, kernel_at_least(5, 12), userns, Some(place))
        })
        .await
        .context("probe the runtime handlers")?;
        tracing::info!(
            took_ms = probing.elapsed().as_millis() as u64,
            "runtime handlers probed"
        );
        let _ = self.handlers.set(handlers);
        self.network_from_kept_cidr();
        // Before any removal can put something there: what a killed crius left is deleted.
        for base in [&self.config.root, &self.config.state] {
            crate::trash::empty_at_start(base)
                .map_err(|e| anyhow::anyhow!("{}", crate::error::chain(&e)))?;
        }
        self.remove_unrecorded_containers();
        self.release_orphan_leases().await;
        self.flush_store_later();
        // After a reboot the shims went with the boot: every record of it is settled at once.
        let boot = crate::boot::Boot::read(&self.config.root);
        match &boot {
            Ok(boot) if boot.restarted() => {
                tracing::warn!(
                    previous = boot.previous.as_deref().unwrap_or(""),
                    current = %boot.current,
                    "the node restarted since crius last ran: its containers ended with it"
                );
                self.settle_containers_after_reboot(boot);
                self.settle_pods_after_reboot();
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("read the boot id: {e}; the shims are asked instead"),
        }
        self.recover_containers().await;
        self.recover_pods().await;
        if let Ok(boot) = &boot {
            if let Err(e) = boot.keep() {
                tracing::warn!("keep the boot id under {}: {e}", self.config.root.display());
            }
        }
        self.start_nri();
        self.streams
            .start(&self.config.stream)
            .await
            .map_err(|e| anyhow::anyhow!("{}", crate::error::chain(&e)))?;
        self.serve_metrics(&self.config.metrics).await?;
        // Blobs and snapshots a killed crius left unreferenced (a pull cut short, an image
        // removed mid-way) are freed in the background; serving does not wait for it.
        let images = self.images.clone();
        tokio::spawn(async move {
            if let Err(e) = images.gc().await {
                tracing::warn!("image garbage collection at start: {e}");
            }
        });
        Ok(())
    }

    /// Keeps unflushed writes (a container's create and start, see `Store::put_unflushed`)
    /// from waiting on disk for long: [`crate::store::FLUSH_WITHIN`] after one, an empty
    /// durable commit carries it and every write since (unless a call's own durable commit has
    /// meanwhile, which makes this one cheap). On a blocking thread, off every call's path.
    fn flush_store_later(self: &Arc<Self>) {
        let unflushed = self.store.unflushed_writes();
        let daemon = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                unflushed.notified().await;
                tokio::time::sleep(crate::store::FLUSH_WITHIN).await;
                let daemon = daemon.clone();
                let flushed =
                    tokio::task::spawn_blocking(move || daemon.upgrade().map(|d| d.store.flush()))
                        .await;
                match flushed {
                    Ok(Some(Ok(()))) => {}
                    Ok(Some(Err(e))) => tracing::warn!("flush the database: {e}"),
                    Ok(None) | Err(_) => return,
                }
            }
        });
    }

    /// Releases the image leases of containers crius does not have: a lease's removal is not
    /// synced (`ImageStore::release`), so after a power loss one may be back, holding
    /// snapshots of a removed container.
    async fn release_orphan_leases(&self) {
        let holders = match self.images.lease_holders() {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!("list image leases: {e}");
                return;
            }
        };
        for holder in holders {
            // `<id>` or an image volume's `<id>.vol<i>`
            let id = holder
                .split_once(".vol")
                .map_or(holder.as_str(), |(id, _)| id);
            if self.containers.get(id).is_some() {
                continue;
            }
            tracing::info!(holder = %holder, "releasing the image lease of a container that is gone");
            if let Err(e) = self.images.release(&holder).await {
                tracing::warn!(holder = %holder, "release image lease: {e}");
            }
        }
    }

    /// Applies what a re-read configuration changes that can change while crius runs: the
    /// metrics endpoint and the registry settings. Returns the keys applied (the caller names
    /// the rest as waiting for a restart).
    pub async fn apply_live(self: &Arc<Self>, new: &Config) -> Vec<&'static str> {
        let mut applied = Vec::new();
        let metrics_was = self
            .metrics_endpoint
            .bound()
            .map(|a| a.to_string())
            .unwrap_or_default();
        match self.serve_metrics(&new.metrics).await {
            Ok(bound) => {
                let now = bound.map(|a| a.to_string()).unwrap_or_default();
                if now != metrics_was {
                    tracing::info!(from = %metrics_was, to = %now, "SIGHUP: metrics endpoint changed");
                }
                applied.extend(["metrics.address", "metrics.namespace"]);
            }
            Err(e) => tracing::warn!("SIGHUP: metrics endpoint unchanged: {e:#}"),
        }
        let registry = crius_image::RegistrySettings {
            config_dir: Some(new.registry.config_path.clone()),
            max_concurrent_downloads: new.registry.max_concurrent_downloads,
            no_progress_timeout: Duration::from_secs(new.registry.stall_timeout_secs),
            auth_file: non_empty(&new.registry.auth_file),
        };
        if registry != self.images.registry_settings() {
            tracing::info!(?registry, "SIGHUP: registry settings changed for new pulls");
            self.images.set_registry_settings(registry);
        }
        let pinned = new.images.clone();
        let mut in_force = self.pinned.write().unwrap_or_else(|e| e.into_inner());
        if *in_force != pinned {
            tracing::info!(patterns = ?pinned.pinned, "SIGHUP: pinned images changed");
            *in_force = pinned;
        }
        drop(in_force);
        applied.extend([
            "images.pinned",
            "registry.config_path",
            "registry.max_concurrent_downloads",
            "registry.stall_timeout_secs",
            "registry.auth_file",
        ]);
        applied
    }

    /// Whether pods can get a network: `Ok` when a usable CNI configuration is present, else
    /// why not.
    pub async fn network_ready(&self) -> Result<()> {
        self.network
            .status()
            .map(|_| ())
            .map_err(|e| Error::FailedPrecondition(crate::error::chain(&e)))
    }
}

/// `None` for an empty path (a key left at its default).
fn non_empty(path: &std::path::Path) -> Option<std::path::PathBuf> {
    (!path.as_os_str().is_empty()).then(|| path.to_path_buf())
}
