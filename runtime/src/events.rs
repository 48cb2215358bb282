//! Container and pod lifecycle events for `GetContainerEvents` (kubelet's Evented PLEG).
//!
//! Lifecycle code calls [`Events::emit`], which never waits: each subscriber has its own
//! bounded queue ([`QUEUE`] events), and one that falls that far behind loses the oldest
//! events, counted and logged, without holding up crius or the other subscribers. Events of a
//! pod (its sandbox) carry the pod's id as `container_id`, as containerd's do.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crius_api::v1::{ContainerEventType, PodSandboxStatus};
use tokio::sync::broadcast;

/// Events a subscriber may fall behind by before it loses the oldest.
pub const QUEUE: usize = 1024;

/// One lifecycle change.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub kind: ContainerEventType,
    /// The container, or the pod for an event of the pod itself.
    pub id: String,
    pub pod_id: String,
    /// Nanoseconds since the epoch.
    pub at: i64,
    /// The pod's status when it was removed, for its DELETED event: the pod is gone when the
    /// event is sent, and kubelet's Evented PLEG drops an event without a pod status (logging an
    /// error) instead of dropping the pod from its cache.
    pub last_status: Option<Arc<PodSandboxStatus>>,
}

#[derive(Debug)]
pub struct Events {
    /// None once closed (crius is stopping): subscribers' streams then end.
    tx: std::sync::Mutex<Option<broadcast::Sender<Event>>>,
    dropped: AtomicU64,
}

impl Default for Events {
    fn default() -> Self {
        Events {
            tx: std::sync::Mutex::new(Some(broadcast::channel(QUEUE).0)),
            dropped: AtomicU64::new(0),
        }
    }
}

impl Events {
    /// Tells every subscriber; nothing happens without one.
    pub fn emit(&self, kind: ContainerEventType, id: &str, pod_id: &str) {
        self.send(kind, id, pod_id, || None);
    }

    /// Tells every subscriber that container `id` of pod `pod_id` is gone, with the pod's
    /// status as it is now (`pod_status` is called only when someone listens): when the
    /// container goes with its pod, the pod is gone too by the time the event is sent.
    pub fn emit_container_deleted(
        &self,
        id: &str,
        pod_id: &str,
        pod_status: impl FnOnce() -> Option<PodSandboxStatus>,
    ) {
        self.send(
            ContainerEventType::ContainerDeletedEvent,
            id,
            pod_id,
            || pod_status().map(Arc::new),
        );
    }

    /// Tells every subscriber that pod `id` is gone, with its last status (`status` is called
    /// only when someone listens).
    pub fn emit_pod_deleted(&self, id: &str, status: impl FnOnce() -> PodSandboxStatus) {
        self.send(ContainerEventType::ContainerDeletedEvent, id, id, || {
            Some(Arc::new(status()))
        });
    }

    fn send(
        &self,
        kind: ContainerEventType,
        id: &str,
        pod_id: &str,
        last_status: impl FnOnce() -> Option<Arc<PodSandboxStatus>>,
    ) {
        let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        let Some(tx) = tx.as_ref().filter(|tx| tx.receiver_count() > 0) else {
            return;
        };
        let _ = tx.send(Event {
            kind,
            id: id.to_string(),
            pod_id: pod_id.to_string(),
            at: crate::util::now_nanos(),
            last_status: last_status(),
        });
    }

    /// A new subscriber, which sees the events from now on; None once closed.
    pub fn subscribe(&self) -> Option<broadcast::Receiver<Event>> {
        let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        tx.as_ref().map(broadcast::Sender::subscribe)
    }

    /// Ends every subscriber's stream (crius is stopping: an open stream would hold up the
    /// orderly stop until its grace time is over).
    pub fn close(&self) {
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    /// Counts events a slow subscriber lost.
    pub fn lost(&self, n: u64) {
        let total = self.dropped.fetch_add(n, Ordering::Relaxed) + n;
        tracing::warn!(
            lost = n,
            total,
            "a GetContainerEvents subscriber fell {QUEUE} events behind and lost the oldest"
        );
    }

    /// Events lost by slow subscribers since start.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_slow_subscriber_loses_the_oldest_and_never_blocks() {
        let events = Events::default();
        events.emit(ContainerEventType::ContainerCreatedEvent, "nobody", "p");
        let mut slow = events.subscribe().unwrap();
        let mut fast = events.subscribe().unwrap();
        for i in 0..QUEUE + 10 {
            events.emit(
                ContainerEventType::ContainerStartedEvent,
                &i.to_string(),
                "p",
            );
            assert_eq!(fast.recv().await.unwrap().id, i.to_string());
        }
        match slow.recv().await {
            Err(broadcast::error::RecvError::Lagged(n)) => assert_eq!(n, 10),
            other => panic!("{other:?}"),
        }
        assert_eq!(slow.recv().await.unwrap().id, "10");
        events.close();
        assert!(events.subscribe().is_none());
        assert!(matches!(
            fast.recv().await,
            Err(broadcast::error::RecvError::Closed)
        ));
    }

    #[tokio::test]
    async fn a_deleted_pod_carries_its_last_status_made_only_for_listeners() {
        let events = Events::default();
        events.emit_pod_deleted("p0", || panic!("made with nobody listening"));
        let mut rx = events.subscribe().unwrap();
        events.emit_pod_deleted("p1", || PodSandboxStatus {
            id: "p1".into(),
            ..Default::default()
        });
        events.emit(ContainerEventType::ContainerStoppedEvent, "c", "p2");
        let deleted = rx.recv().await.unwrap();
        assert_eq!(deleted.kind, ContainerEventType::ContainerDeletedEvent);
        assert_eq!((deleted.id.as_str(), deleted.pod_id.as_str()), ("p1", "p1"));
        assert_eq!(deleted.last_status.unwrap().id, "p1");
        assert!(rx.recv().await.unwrap().last_status.is_none());
    }
}
