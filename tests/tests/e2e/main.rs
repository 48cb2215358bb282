//! crius's end-to-end tests: one binary, one module per area, so the fixtures of [`common`] and
//! the library are compiled and linked once rather than once per file. A test is `e2e
//! <module>::<name>`: `cargo test -p crius-tests --test e2e pods::` runs one area, `… --test
//! e2e -- --exact pods::pod_lifecycle_on_the_host_network` one test. Tests of all areas run in
//! parallel threads of one process: none may change the process (its working directory, umask,
//! environment, signal dispositions), and each [`common::Env`] takes a network of its own
//! ([`common::NetworkLease`]). Run as root; the gated ones (`node_vm`, `soak`) pass at once
//! unless their environment variables are set.

mod common;

mod cgroup_parent;
mod checkpoint;
mod checkpoint_pod;
mod containers;
mod crash_random;
mod crash_windows;
mod crius_status;
mod events;
mod exec_seccomp;
mod fixtures;
mod fuzz_requests;
mod grpc_clients;
mod hostname;
mod image_volumes;
mod images_archive;
mod images_containerd;
mod images_pinned;
mod images_pulls;
mod install;
mod kubelet;
mod log_reload;
mod metrics;
mod node_vm;
mod nri;
mod pods;
mod prometheus;
mod registry_credentials;
mod registry_proxy;
mod restart;
mod runtime_handlers;
mod security;
mod signals;
mod slow_shim;
mod soak;
mod stream_limits;
mod stream_tls;
mod streaming;
mod systemd_driver;
mod userns;
mod userns_root;
mod validation;
mod working_dir;
