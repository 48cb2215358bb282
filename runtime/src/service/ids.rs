//! What each request names, for the RPC span: the pod, container or image it is about.

use crius_api::v1::*;

/// The ids a request carries, as one short string for logs (empty when it names nothing).
pub trait Ids {
    fn ids(&self) -> String {
        String::new()
    }
}

macro_rules! no_ids {
    ($($req:ty),* $(,)?) => { $(impl Ids for $req {})* };
}

macro_rules! ids_from {
    ($($req:ty => $field:ident),* $(,)?) => {
        $(impl Ids for $req {
            fn ids(&self) -> String {
                self.$field.clone()
            }
        })*
    };
}

no_ids!(
    VersionRequest,
    StatusRequest,
    RuntimeConfigRequest,
    UpdateRuntimeConfigRequest,
    ListPodSandboxRequest,
    StreamPodSandboxesRequest,
    ListContainersRequest,
    StreamContainersRequest,
    GetEventsRequest,
    ListContainerStatsRequest,
    StreamContainerStatsRequest,
    ListPodSandboxStatsRequest,
    StreamPodSandboxStatsRequest,
    ListMetricDescriptorsRequest,
    ListPodSandboxMetricsRequest,
    StreamPodSandboxMetricsRequest,
    ListImagesRequest,
    StreamImagesRequest,
    ImageFsInfoRequest,
);

ids_from!(
    StopPodSandboxRequest => pod_sandbox_id,
    RemovePodSandboxRequest => pod_sandbox_id,
    PodSandboxStatusRequest => pod_sandbox_id,
    PodSandboxStatsRequest => pod_sandbox_id,
    UpdatePodSandboxResourcesRequest => pod_sandbox_id,
    PortForwardRequest => pod_sandbox_id,
    CreateContainerRequest => pod_sandbox_id,
    StartContainerRequest => container_id,
    StopContainerRequest => container_id,
    RemoveContainerRequest => container_id,
    ContainerStatusRequest => container_id,
    UpdateContainerResourcesRequest => container_id,
    ReopenContainerLogRequest => container_id,
    ExecSyncRequest => container_id,
    ExecRequest => container_id,
    AttachRequest => container_id,
    ContainerStatsRequest => container_id,
    CheckpointContainerRequest => container_id,
    CheckpointPodRequest => pod_sandbox_id,
);

impl Ids for RestorePodRequest {
    /// The pod to be, as for RunPodSandbox (the checkpoint path may be long).
    fn ids(&self) -> String {
        match self.config.as_ref().and_then(|c| c.metadata.as_ref()) {
            Some(m) => format!("{}/{}", m.namespace, m.name),
            None => String::new(),
        }
    }
}

impl Ids for RunPodSandboxRequest {
    fn ids(&self) -> String {
        match self.config.as_ref().and_then(|c| c.metadata.as_ref()) {
            Some(m) => format!("{}/{}", m.namespace, m.name),
            None => String::new(),
        }
    }
}

fn image_ref(spec: Option<&ImageSpec>) -> String {
    spec.map(|s| s.image.clone()).unwrap_or_default()
}

impl Ids for PullImageRequest {
    fn ids(&self) -> String {
        image_ref(self.image.as_ref())
    }
}

impl Ids for ImageStatusRequest {
    fn ids(&self) -> String {
        image_ref(self.image.as_ref())
    }
}

impl Ids for RemoveImageRequest {
    fn ids(&self) -> String {
        image_ref(self.image.as_ref())
    }
}
