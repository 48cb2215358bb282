//! Sharing one piece of in-flight work between concurrent callers with the same key: two
//! pulls of one image, or two pulls that need the same blob or snapshot.
//!
//! The work runs inside the callers' own futures (not a spawned task): if every caller goes
//! away the work is dropped, and with it any temp files it held.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use futures::future::{BoxFuture, FutureExt, Shared, WeakShared};

use crate::error::{Error, Result};

type Work<T> = BoxFuture<'static, std::result::Result<T, Arc<Error>>>;

pub(crate) struct Singleflight<T> {
    inflight: Mutex<HashMap<String, WeakShared<Work<T>>>>,
}

impl<T> Default for Singleflight<T> {
    fn default() -> Self {
        Self {
            inflight: Mutex::new(HashMap::new()),
        }
    }
}

impl<T: Clone + Send + Sync + 'static> Singleflight<T> {
    /// Joins the work running under `key`, or starts `make()` as that work.
    pub(crate) async fn run<F>(&self, key: &str, make: impl FnOnce() -> F) -> Result<T>
    where
        F: Future<Output = Result<T>> + Send + 'static,
    {
        let shared = {
            let mut map = self
                .inflight
                .lock()
                .map_err(|_| Error::Internal("in-flight work table lock poisoned".into()))?;
            match map.get(key).and_then(WeakShared::upgrade) {
                Some(s) => s,
                None => {
                    let s: Shared<Work<T>> = make().map(|r| r.map_err(Arc::new)).boxed().shared();
                    if let Some(weak) = s.downgrade() {
                        map.insert(key.to_string(), weak);
                    }
                    s
                }
            }
        };
        let result = shared.clone().await;
        if let Ok(mut map) = self.inflight.lock() {
            let finished = map
                .get(key)
                .and_then(WeakShared::upgrade)
                .is_none_or(|s| s.ptr_eq(&shared));
            if finished {
                map.remove(key);
            }
        }
        result.map_err(Error::Shared)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn concurrent_callers_share_one_run() {
        let sf = Arc::new(Singleflight::<u32>::default());
        let runs = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..5 {
            let sf = sf.clone();
            let runs = runs.clone();
            tasks.push(tokio::spawn(async move {
                sf.run("k", || async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    Ok(7)
                })
                .await
            }));
        }
        for t in tasks {
            assert_eq!(t.await.unwrap().unwrap(), 7);
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        // Finished work is forgotten: the next call runs again.
        let again = sf.run("k", || async { Ok(8) }).await.unwrap();
        assert_eq!(again, 8);
    }

    #[tokio::test]
    async fn errors_are_shared_and_keep_their_kind() {
        let sf = Singleflight::<u32>::default();
        let err = sf
            .run("k", || async { Err(Error::ImageNotFound("x".into())) })
            .await
            .unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::NotFound);
        assert_eq!(err.to_string(), "image \"x\" not found");
    }
}
