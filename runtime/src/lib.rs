//! crius: a Kubernetes CRI runtime. This crate is the daemon: configuration, the database, the
//! gRPC services and the pod and container lifecycle. See DESIGN.md for the map.

pub mod config;
pub mod daemon;
pub mod error;
pub mod server;
pub mod service;
pub mod spec;
pub mod store;
