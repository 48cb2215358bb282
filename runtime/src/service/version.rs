//! `Version`: who we are and which CRI version we speak.

use std::sync::Arc;

use crius_api::v1::{VersionRequest, VersionResponse};

use crate::daemon::Daemon;
use crate::error::Result;

/// The runtime name kubelet and crictl show.
pub const RUNTIME_NAME: &str = "crius";
/// The CRI API version this runtime implements.
pub const RUNTIME_API_VERSION: &str = "v1";

pub async fn version(_daemon: &Arc<Daemon>, _req: VersionRequest) -> Result<VersionResponse> {
    Ok(VersionResponse {
        // The version of the kubelet runtime API: "0.1.0" by convention of the CRI.
        version: "0.1.0".to_string(),
        runtime_name: RUNTIME_NAME.to_string(),
        runtime_version: env!("CARGO_PKG_VERSION").to_string(),
        runtime_api_version: RUNTIME_API_VERSION.to_string(),
    })
}
