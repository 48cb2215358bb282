//! crius: a Kubernetes CRI runtime. This crate is the daemon: configuration, the database, the
//! gRPC services and the pod and container lifecycle. See `docs/architecture.md` for the map.

pub mod admin;
pub mod apparmor;
pub mod authority;
pub mod boot;
pub mod cgroups;
pub mod cli;
pub mod config;
pub mod container;
pub mod cpu_rates;
pub mod daemon;
pub mod error;
pub mod events;
pub mod handlers;
pub mod heap;
pub mod lanes;
pub mod layout;
pub mod logging;
pub mod mounts;
pub mod notify;
pub mod nri;
pub mod pod;
pub mod pod_cidr;
pub mod records;
pub mod reload;
pub mod server;
pub mod service;
pub mod shims;
pub mod spec;
pub mod store;
pub mod stream;
pub mod telemetry;
pub use crius_common::text_pages;
pub mod trash;
pub mod userns;
pub mod util;

#[cfg(test)]
mod layering;
