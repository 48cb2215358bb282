//! `GetContainerEvents`: a stream per subscriber of the lifecycle events in
//! [`crate::events`], each with the pod's status and its containers' statuses as they are when
//! the event is sent (kubelet's Evented PLEG updates its cache from them); a removed pod's
//! DELETED event carries the status the pod had when it was removed, as containerd's does
//! (kubelet drops the pod from its cache on it).

use std::sync::Arc;

use crius_api::v1::{ContainerEventResponse, GetEventsRequest};
use tokio::sync::broadcast::error::RecvError;

use super::BoxStream;
use crate::daemon::Daemon;
use crate::error::{Error, Result};
use crate::events::Event;

pub async fn get_container_events(
    d: &Arc<Daemon>,
    _req: GetEventsRequest,
) -> Result<BoxStream<ContainerEventResponse>> {
    let rx = d
        .events
        .subscribe()
        .ok_or_else(|| Error::Unavailable("crius is stopping".into()))?;
    let daemon = Arc::clone(d);
    let stream = futures::stream::unfold((rx, daemon), |(mut rx, d)| async move {
        loop {
            match rx.recv().await {
                Ok(event) => {
                    let response = response(&d, event);
                    return Some((Ok(response), (rx, d)));
                }
                Err(RecvError::Lagged(n)) => d.events.lost(n),
                Err(RecvError::Closed) => return None,
            }
        }
    });
    Ok(Box::pin(stream))
}

fn response(d: &Daemon, event: Event) -> ContainerEventResponse {
    let (pod, containers) = match d.sandboxes.get(&event.pod_id) {
        Some(r) => {
            let (status, containers) = super::sandbox::pod_status(d, &r);
            (Some(status), containers)
        }
        // Gone: its DELETED event carries the status it had when it was removed.
        None => (event.last_status.as_deref().cloned(), Vec::new()),
    };
    ContainerEventResponse {
        container_id: event.id,
        container_event_type: event.kind as i32,
        created_at: event.at,
        pod_sandbox_status: pod,
        containers_statuses: containers,
    }
}
