//! `RuntimeConfig`: the cgroup driver, so kubelet can check it matches its own.

use std::sync::Arc;

use crius_api::v1::{
    CgroupDriver, LinuxRuntimeConfiguration, RuntimeConfigRequest, RuntimeConfigResponse,
};

use crate::config;
use crate::daemon::Daemon;
use crate::error::Result;

pub async fn runtime_config(
    daemon: &Arc<Daemon>,
    _req: RuntimeConfigRequest,
) -> Result<RuntimeConfigResponse> {
    let driver = match daemon.config.cgroup.driver {
        config::CgroupDriver::Cgroupfs => CgroupDriver::Cgroupfs,
        config::CgroupDriver::Systemd => CgroupDriver::Systemd,
    };
    Ok(RuntimeConfigResponse {
        linux: Some(LinuxRuntimeConfiguration {
            cgroup_driver: driver as i32,
        }),
    })
}
