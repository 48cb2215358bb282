//! GetContainerEvents: every subscriber sees the lifecycle of pods and containers in order,
//! each event with the pod's status and its containers' statuses (a removed pod's DELETED
//! event with the status it left with); a subscriber that never reads holds up nobody. Real crius, registry, CNI and containers. Network 19.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use crate::common::Env;
use crius_api::v1::*;
use tokio_stream::StreamExt as _;
use tonic::Streaming;

type Seen = Vec<(i32, String)>;

/// Reads events from `stream` until `n` have come (at most 20 s).
async fn take(
    stream: &mut Streaming<ContainerEventResponse>,
    n: usize,
) -> Vec<ContainerEventResponse> {
    let mut out = Vec::new();
    while out.len() < n {
        let next = tokio::time::timeout(Duration::from_secs(20), stream.next())
            .await
            .unwrap_or_else(|_| panic!("only {} of {n} events came: {out:?}", out.len()))
            .unwrap()
            .unwrap();
        out.push(next);
    }
    out
}

fn kinds(events: &[ContainerEventResponse]) -> Seen {
    events
        .iter()
        .map(|e| (e.container_event_type, e.container_id.clone()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_see_the_lifecycle_in_order() {
    let mut env = Env::with_image().await;
    let subscribe = |env: &Env| {
        let mut rt = env.rt();
        async move {
            rt.get_container_events(GetEventsRequest {})
                .await
                .unwrap()
                .into_inner()
        }
    };
    let mut first = subscribe(&env).await;
    let mut second = subscribe(&env).await;
    // Subscribed, and never read from.
    let _idle = subscribe(&env).await;

    let pod_config = env.pod_config("evented", false);
    let pod = env.run_pod(pod_config.clone()).await;
    let c = env
        .create_start(
            &pod,
            &pod_config,
            env.container_config("brief", &["sh", "-c", "sleep 0.3"]),
        )
        .await;
    env.wait_exited(&c, Duration::from_secs(20)).await;
    env.remove(&c).await;
    // One that goes with its pod.
    let kept = env
        .create_start(
            &pod,
            &pod_config,
            env.container_config("kept", &["sleep", "1000"]),
        )
        .await;
    env.stop_pod(&pod).await;
    env.remove_pod(&pod).await;

    use ContainerEventType as T;
    let want: Seen = vec![
        (T::ContainerCreatedEvent as i32, pod.clone()),
        (T::ContainerStartedEvent as i32, pod.clone()),
        (T::ContainerCreatedEvent as i32, c.clone()),
        (T::ContainerStartedEvent as i32, c.clone()),
        (T::ContainerStoppedEvent as i32, c.clone()),
        (T::ContainerDeletedEvent as i32, c.clone()),
        (T::ContainerCreatedEvent as i32, kept.clone()),
        (T::ContainerStartedEvent as i32, kept.clone()),
        (T::ContainerStoppedEvent as i32, kept.clone()),
        (T::ContainerStoppedEvent as i32, pod.clone()),
        (T::ContainerDeletedEvent as i32, kept.clone()),
        (T::ContainerDeletedEvent as i32, pod.clone()),
    ];
    for stream in [&mut first, &mut second] {
        let events = take(stream, want.len()).await;
        assert_eq!(kinds(&events), want);
        // The container's end carries the pod, ready, and the container, exited.
        let stopped = &events[4];
        let status = stopped.pod_sandbox_status.as_ref().unwrap();
        assert_eq!(status.id, pod);
        let exited: Vec<_> = stopped
            .containers_statuses
            .iter()
            .filter(|s| s.id == c)
            .collect();
        assert_eq!(exited.len(), 1, "{stopped:?}");
        assert_eq!(exited[0].state, ContainerState::ContainerExited as i32);
        assert!(events
            .windows(2)
            .all(|w| w[0].created_at <= w[1].created_at));
        // A deleted pod's event carries the status it left with, metadata included: kubelet's
        // Evented PLEG drops the pod from its cache on it, and logs an error and ignores an
        // event without one (as crius once sent).
        // A container removed with its pod: the pod is gone when the event is read, and the
        // event still names it, as it was at the container's removal.
        let with_pod = &events[10];
        let status = with_pod
            .pod_sandbox_status
            .as_ref()
            .unwrap_or_else(|| panic!("no pod status in {with_pod:?}"));
        assert_eq!(status.id, pod);
        let deleted = &events[11];
        let last = deleted
            .pod_sandbox_status
            .as_ref()
            .unwrap_or_else(|| panic!("no pod status in {deleted:?}"));
        assert_eq!(last.id, pod);
        assert_eq!(last.state, PodSandboxState::SandboxNotready as i32);
        assert_eq!(
            last.metadata.as_ref().map(|m| m.name.as_str()),
            Some("evented")
        );
        assert!(deleted.containers_statuses.is_empty(), "{deleted:?}");
    }
    env.assert_no_leaks().await;
}
