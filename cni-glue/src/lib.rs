//! CNI for crius: pinned network namespaces, network config discovery, CNI plugin execution
//! (spec versions 0.3.x, 0.4.0, 1.0.0 and 1.1.0), typed results, and an attachment cache that
//! makes DEL reliable. Knows nothing about gRPC or pods beyond what CNI needs.
//!
//! # Use from the pod sandbox code
//!
//! ```no_run
//! # async fn run() -> crius_cni::Result<()> {
//! use crius_cni::{netns, Network, NetworkOptions, PodNetwork, Bandwidth};
//! use std::path::Path;
//!
//! let network = Network::new(NetworkOptions::default());
//!
//! // Status: NetworkReady is `network.status().is_ok()`; the error text is the reason.
//!
//! // RunPodSandbox (unless host network):
//! let annotations = std::collections::BTreeMap::new();
//! let ns = netns::create(Path::new("/run/crius/netns"), "sandbox-id")?;
//! let pod = PodNetwork {
//!     id: "sandbox-id".into(),
//!     name: "web".into(),
//!     namespace: "default".into(),
//!     uid: "pod-uid".into(),
//!     netns_path: ns.clone(),
//!     bandwidth: Bandwidth::from_annotations(&annotations)?,
//!     annotations,
//!     ..Default::default()
//! };
//! match network.setup(&pod).await {
//!     Ok(result) => println!("pod IPs {:?}", result.pod_ips()), // IPv4 first
//!     Err(e) => {
//!         // setup already undid what it could; teardown finishes the job (idempotent).
//!         let _ = network.teardown(&pod.id).await;
//!         netns::remove(&ns)?;
//!         return Err(e);
//!     }
//! }
//!
//! // StopPodSandbox / RemovePodSandbox: DEL first (it needs nothing but the id), then the netns.
//! // On a DEL error keep the sandbox marked and call teardown again on the next Stop/Remove.
//! network.teardown("sandbox-id").await?;
//! netns::remove(&ns)?;
//! # Ok(()) }
//! ```
//!
//! * [`Network::setup`] runs ADD for the configured network (ifname `eth0`; first, if
//!   [`NetworkOptions::loopback`] is set, for a built-in network with the `loopback` plugin),
//!   chained plugins in order, each with `prevResult` and the `runtimeConfig` capabilities it declared (`portMappings`, `bandwidth`, `dns`,
//!   `io.kubernetes.cri.pod-annotations`, `cgroupPath`).
//! * [`Network::teardown`] runs DEL for what the cache recorded, in reverse order, with the ADD
//!   result as `prevResult`, and forgets a record only after its DEL succeeded.
//! * [`Network::status`] only checks that a config is present (cheap, for CRI `Status`).
//! * [`Network::check`], [`Network::plugin_status`], [`Network::gc`] map to CHECK, STATUS and GC
//!   where the config's version has them (CHECK ≥ 0.4.0, STATUS/GC ≥ 1.1.0).
//! * [`Network::cached_result`] gives the recorded ADD result back after a daemon restart.
//! * [`netns`] creates, removes and enters pinned network namespaces without ever changing the
//!   namespace of a thread it does not own.
//!
//! Every plugin call is killed (with the delegated plugins it started) after
//! [`NetworkOptions::plugin_timeout`]. Plugin errors come back as [`Error::Plugin`] with the
//! plugin's name, CNI code, `msg` and `details`.

pub mod cache;
pub mod capabilities;
pub mod config;
mod error;
pub mod exec;
mod host_local;
pub mod netns;
mod network;
pub mod result;

pub use capabilities::{Bandwidth, DnsConfig, PortMapping};
pub use config::{ConfDir, NetworkConfigList, PluginConfig, Version};
pub use error::{Error, Result};
pub use network::{Network, NetworkOptions, NetworkStatus, PodNetwork, LOOPBACK_NETWORK};
pub use result::{AddResult, Dns, Interface, IpConfig, IpNet, Route};
