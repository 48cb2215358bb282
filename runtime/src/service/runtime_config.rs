//! `RuntimeConfig`: the cgroup driver, so kubelet can check it matches its own.
//! `UpdateRuntimeConfig`: the node's pod CIDR (see [`crate::pod_cidr`]).

use std::sync::Arc;

use crius_api::v1::{
    CgroupDriver, LinuxRuntimeConfiguration, RuntimeConfigRequest, RuntimeConfigResponse,
    UpdateRuntimeConfigRequest, UpdateRuntimeConfigResponse,
};

use crate::config;
use crate::daemon::Daemon;
use crate::error::{Error, Result};

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

pub async fn update_runtime_config(
    daemon: &Arc<Daemon>,
    req: UpdateRuntimeConfigRequest,
) -> Result<UpdateRuntimeConfigResponse> {
    let cidr = req
        .runtime_config
        .and_then(|c| c.network_config)
        .map(|n| n.pod_cidr)
        .unwrap_or_default();
    if cidr.is_empty() {
        return Ok(UpdateRuntimeConfigResponse {});
    }
    let ranges = crate::pod_cidr::parse(&cidr).map_err(|why| {
        Error::InvalidArgument(format!("runtime_config.network_config.pod_cidr: {why}"))
    })?;
    daemon.set_pod_cidr(&cidr, &ranges)?;
    Ok(UpdateRuntimeConfigResponse {})
}
