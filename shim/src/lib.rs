//! crius-shim: the per-pod supervisor of containers.
//!
//! One shim runs per pod, single-threaded and without an async runtime (libcontainer clones
//! processes from its caller, which is only safe without other threads). crius starts it with
//! an ordinary spawn; it detaches ([`daemon`]), becomes a child subreaper and serves the control
//! protocol of [`crius_api::shim`] on `<state-dir>/control.sock` from one event loop
//! ([`server`]). It creates, starts, signals and deletes the pod's containers and runs exec
//! processes through youki's libcontainer ([`libct`], always from short-lived forked helpers
//! for create and exec: [`fork_helper`]); owns their stdio and writes the CRI log format
//! ([`cri_log`]); reaps every exit and records it durably ([`exit_record`], with OOM kills from
//! [`oom`]). It outlives crius: containers keep running and logging while crius restarts.
//!
//! State directory layout (`<state>/shims/<pod-id>/`): `control.sock`, `shim.pid`, `shim.log`
//! (unless `--log`), `runc/` (libcontainer's state), `containers/<id>/exit.json`,
//! `exec/<n>.json` (process specs of running execs).

pub mod cri_log;
pub mod daemon;
pub mod exit_record;
pub mod fork_helper;
pub mod libct;
pub mod oom;
pub mod server;
pub mod shim_log;
pub mod signals;
pub mod time;

/// The static, `no_std` build of `crius-pause` (a few KiB), written out by
/// `crius-shim --install-pause <path>` for crius to bind-mount into pod sandboxes.
pub const PAUSE_STATIC: &[u8] = include_bytes!(env!("CRIUS_PAUSE_STATIC"));
