//! crius-shim: the per-pod supervisor of containers.
//!
//! One shim runs per pod, single-threaded and without an async runtime. crius starts it with
//! an ordinary spawn; it detaches ([`daemon`]), becomes a child subreaper and serves the control
//! protocol of [`crius_api::shim`] on `<state-dir>/control.sock` from one event loop
//! ([`server`]). It owns the stdio of the pod's containers and writes the CRI log format
//! ([`cri_log`]), runs exec processes and collects their output, reaps every exit and records
//! it in a file that outlives the shim and crius, though not a machine crash ([`exit_record`],
//! with OOM kills from [`oom`]). It outlives crius: containers keep running and logging while
//! crius restarts.
//!
//! The long-lived `crius-shim` binary does not link libcontainer: creates and execs run in
//! short-lived `crius-shim-helper` processes ([`helper`], [`libct`]; an exec joins the container
//! itself, with its seccomp filter, see [`exec`]). That keeps libcontainer's
//! side effects on its caller (working directory, dumpable flag, `oom_score_adj`) out of the
//! shim and its large code and relocations out of the shim's resident memory. What needs no
//! libcontainer code the shim does itself, saving a helper's exec on every pod and container
//! start and stop: it starts a created container through libcontainer's notify socket and
//! state file ([`libct_state`]), signals a whole cgroup and removes the cgroup of an exited
//! container ([`cgroup`]). Hooks, systemd or Intel RDT state, and anything unexpected in
//! libcontainer's files still go to a helper.
//!
//! A container may instead be run by an OCI runtime's command line (runc, crun, runsc: a
//! pod's RuntimeClass handler), the same helpers running the runtime ([`oci_cli`]); then
//! every start, kill of the cgroup and delete goes through a helper, and the shim still owns
//! stdio, logs, exits and attach.
//!
//! State directory layout (`<state>/shims/<pod-id>/`): `control.sock`, `shim.pid`, `shim.log`
//! (unless `--log`), `runc/` (libcontainer's state), `oci/<runtime>/` (an OCI runtime's `--root`, unless configured), `containers/<id>/exit.json`,
//! `exec/<n>.json` (process specs of running execs).

pub mod cgroup;
pub mod cri_log;
pub mod daemon;
pub mod exec;
pub mod exit_record;
pub mod helper;
pub mod libct;
pub mod libct_state;
pub mod oci_cli;
pub mod oom;
pub mod server;
pub mod shim_log;
pub mod signals;
pub mod time;

/// The static, `no_std` build of `crius-pause` (a few KiB), written out by
/// `crius-shim --install-pause <path>` for crius to bind-mount into pod sandboxes.
pub const PAUSE_STATIC: &[u8] = include_bytes!(env!("CRIUS_PAUSE_STATIC"));
