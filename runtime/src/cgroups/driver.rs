//! Which driver manages pod and container cgroups in this process (cgroupfs or systemd), set
//! once at start.

use std::sync::OnceLock;

use crate::config::{CgroupConfig, CgroupDriver};

use super::{manager, CgroupError, Result};

/// Who manages pod and container cgroups in this process, set once at start by [`init`];
/// cgroupfs until then (and in unit tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Driver {
    Cgroupfs,
    Systemd(manager::Systemd),
}

static DRIVER: OnceLock<Driver> = OnceLock::new();

/// The driver [`init`] set up.
pub fn driver() -> &'static Driver {
    DRIVER.get_or_init(|| Driver::Cgroupfs)
}

/// Sets up the configured driver; call once at start, before any pod. With `systemd` this
/// connects to systemd's manager at `[cgroup] systemd_socket`: when nothing answers there
/// crius refuses to start, naming the socket, rather than fail on every pod.
pub fn init(config: &CgroupConfig) -> Result<()> {
    let d = match config.driver {
        CgroupDriver::Cgroupfs => Driver::Cgroupfs,
        CgroupDriver::Systemd => {
            let sd = manager::Systemd::connect(&config.systemd_socket)?;
            tracing::info!(
                socket = %config.systemd_socket.display(),
                root = %sd.root(),
                "cgroup driver systemd"
            );
            Driver::Systemd(sd)
        }
    };
    match DRIVER.set(d.clone()) {
        Ok(()) => Ok(()),
        Err(_) if *driver() == d => Ok(()),
        Err(_) => Err(CgroupError::Invalid(
            "the cgroup driver was already set up differently in this process".to_string(),
        )),
    }
}
