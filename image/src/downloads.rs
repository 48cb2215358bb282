//! Blob downloads into the content store: each blob downloaded once however many pulls ask
//! for it at the same time, at most `max_concurrent_downloads` at once across the store (a
//! limit that can change while crius runs), from the first of the pull's hosts that serves it.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::Semaphore;

use crate::content::ContentStore;
use crate::error::{Error, ErrorKind, Result};
use crate::manifest::{self, Descriptor};
use crate::progress::{Meter, Stats};
use crate::registry::{no_hosts, Session};
use crate::singleflight::Singleflight;

/// The downloads under way in one store, and their slots.
pub(crate) struct Downloads {
    work: Singleflight<u64>,
    slots: Arc<Semaphore>,
}

impl Downloads {
    /// Downloads with at most `limit` (at least 1) at once.
    pub(crate) fn new(limit: usize) -> Downloads {
        Downloads {
            work: Singleflight::default(),
            slots: Arc::new(Semaphore::new(limit.max(1))),
        }
    }

    /// Changes the limit from `was` to `now`. A lower limit takes effect as downloads under
    /// way end: none is cut short.
    pub(crate) fn set_limit(&self, was: usize, now: usize) {
        if now > was {
            self.slots.add_permits(now - was);
        } else if now < was {
            // Free slots go at once; the rest as downloads under way end.
            let slots = &self.slots;
            let busy = (was - now) - slots.forget_permits(was - now);
            let busy = u32::try_from(busy).unwrap_or(u32::MAX);
            let runtime = tokio::runtime::Handle::try_current();
            if let (true, Ok(runtime)) = (busy > 0, runtime) {
                let slots = slots.clone();
                runtime.spawn(async move {
                    if let Ok(permits) = slots.acquire_many(busy).await {
                        permits.forget();
                    }
                });
            }
        }
    }

    /// Makes sure `desc` is in `content`, downloading it once however many pulls ask.
    pub(crate) async fn fetch(
        &self,
        content: &ContentStore,
        session: &Arc<Session>,
        desc: &Descriptor,
        stats: &Arc<Stats>,
    ) -> Result<()> {
        if content.has(&desc.digest, Some(desc.size)) {
            stats.progress.add_done(desc.size);
            return Ok(());
        }
        stats.stored.store(true, Ordering::Relaxed);
        let content = content.clone();
        let slots = self.slots.clone();
        let session = session.clone();
        let size = desc.size;
        let desc = desc.clone();
        let stats = stats.clone();
        let key = desc.digest.to_string();
        // Counts the bytes as they arrive when this pull's run downloads the blob; when it
        // joins another pull's download, the blob counts once it is there.
        let meter = Arc::new(Meter::new(
            stats.progress.clone(),
            desc.digest.as_str(),
            desc.size,
        ));
        let counting = meter.clone();
        self.work
            .run(&key, move || async move {
                download(&content, &slots, &session, &desc, &stats, &counting).await
            })
            .await?;
        meter.finish(size);
        Ok(())
    }
}

/// Downloads `desc` in a slot, trying the hosts that may serve pulls in turn.
async fn download(
    content: &ContentStore,
    slots: &Semaphore,
    session: &Session,
    desc: &Descriptor,
    stats: &Stats,
    meter: &Meter,
) -> Result<u64> {
    let _slot = slots
        .acquire()
        .await
        .map_err(|_| Error::Internal("download slots closed".into()))?;
    if content.has(&desc.digest, Some(desc.size)) {
        return Ok(0);
    }
    let non_distributable = manifest::layer_kind(&desc.media_type).is_some_and(|(_, nd)| nd);
    let label = format!("blob {}", desc.digest);
    let mut last = None;
    for host in session.hosts.iter().filter(|h| h.capabilities.pull) {
        let start = Instant::now();
        let result = async {
            let resp = session
                .get(host, &format!("blobs/{}", desc.digest), "", &label)
                .await?;
            content
                .write_stream(
                    &host.authority,
                    &desc.digest,
                    desc.size,
                    resp.into_body(),
                    session.timeout,
                    meter,
                )
                .await
        }
        .await;
        match result {
            Ok(n) => {
                stats.fetched(start, n);
                return Ok(n);
            }
            Err(e) => {
                meter.undo();
                tracing::warn!(host = %host, "{label}: {e}");
                last = Some(e);
            }
        }
    }
    let err = last.unwrap_or_else(|| no_hosts(&label));
    if non_distributable && err.kind() == ErrorKind::NotFound {
        return Err(Error::NonDistributable {
            digest: desc.digest.clone(),
            media_type: desc.media_type.clone(),
            urls: desc.urls.clone(),
        });
    }
    Err(err)
}
