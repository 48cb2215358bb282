//! Leases: the snapshots a holder (a container `<id>`, an image volume `<id>.vol<i>`) keeps
//! while it uses them, so that removing their image does not remove them. Held in memory,
//! where the collection reads them, and each in `<root>/leases/<holder>.json` so that they
//! outlive a restart.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::RwLock;

use crate::digest::Digest;
use crate::error::{Error, Result};
use crate::records::JsonDir;

/// The leases of one store.
pub(crate) struct Leases {
    dir: JsonDir,
    held: RwLock<HashMap<String, Vec<Digest>>>,
}

fn poisoned() -> Error {
    Error::Internal("image store lock poisoned".into())
}

impl Leases {
    /// Opens `<root>/leases` and loads every lease in it.
    pub(crate) fn open(root: &Path) -> Result<Leases> {
        let dir = JsonDir::open(root.join("leases"))?;
        let held = dir.load_all()?.into_iter().collect();
        Ok(Leases {
            dir,
            held: RwLock::new(held),
        })
    }

    /// Holds `chain_ids` for `holder` at once, in memory only: [`Leases::persist`] writes it.
    pub(crate) fn hold(&self, holder: &str, chain_ids: Vec<Digest>) -> Result<()> {
        check_holder(holder)?;
        let mut held = self.held.write().map_err(|_| poisoned())?;
        held.insert(holder.to_string(), chain_ids);
        Ok(())
    }

    /// Writes and syncs `holder`'s lease file (blocking).
    pub(crate) fn persist(&self, holder: &str, chain_ids: &[Digest]) -> Result<()> {
        self.dir.save(holder, &chain_ids)
    }

    /// Drops `holder`'s lease from memory (its file was never written).
    pub(crate) fn forget(&self, holder: &str) -> Result<()> {
        self.held.write().map_err(|_| poisoned())?.remove(holder);
        Ok(())
    }

    /// The snapshots `holder` holds, if it has a lease.
    pub(crate) fn chains_of(&self, holder: &str) -> Result<Option<Vec<Digest>>> {
        Ok(self
            .held
            .read()
            .map_err(|_| poisoned())?
            .get(holder)
            .cloned())
    }

    /// The holders of every lease.
    pub(crate) fn holders(&self) -> Result<Vec<String>> {
        Ok(self
            .held
            .read()
            .map_err(|_| poisoned())?
            .keys()
            .cloned()
            .collect())
    }

    /// Every snapshot some lease holds.
    pub(crate) fn held_chains(&self) -> Result<HashSet<Digest>> {
        let held = self.held.read().map_err(|_| poisoned())?;
        Ok(held.values().flatten().cloned().collect())
    }

    /// Drops `holder`'s lease and its file (the removal not synced: see
    /// [`crate::ImageStore::release`]); what it held, if it had one.
    pub(crate) fn release(&self, holder: &str) -> Result<Option<Vec<Digest>>> {
        check_holder(holder)?;
        let mut held = self.held.write().map_err(|_| poisoned())?;
        self.dir.delete_unsynced(holder)?;
        Ok(held.remove(holder))
    }
}

/// A holder names its lease file: a short name of letters, digits, `-`, `_` and `.`, not
/// starting with a dot.
pub(crate) fn check_holder(holder: &str) -> Result<()> {
    let ok = !holder.is_empty()
        && holder.len() <= 256
        && !holder.starts_with('.')
        && holder
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(Error::Internal(format!("invalid lease holder {holder:?}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holders() {
        assert!(check_holder("abc-123_x.y").is_ok());
        for bad in ["", "../x", "a/b", ".hidden"] {
            assert!(check_holder(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_lease_is_held_persisted_reloaded_and_released() {
        let root = tempfile::tempdir().expect("a temp dir");
        let chain = Digest::of(b"layer");
        let leases = Leases::open(root.path()).expect("open");
        leases.hold("c1", vec![chain.clone()]).expect("hold");
        assert!(leases.hold("../c2", vec![]).is_err());
        leases
            .persist("c1", std::slice::from_ref(&chain))
            .expect("persist");
        leases.hold("c2", vec![chain.clone()]).expect("hold");
        leases.forget("c2").expect("forget");

        let reopened = Leases::open(root.path()).expect("reopen");
        assert_eq!(reopened.holders().expect("holders"), ["c1"]);
        assert_eq!(
            reopened.chains_of("c1").expect("chains"),
            Some(vec![chain.clone()])
        );
        assert!(reopened.held_chains().expect("held").contains(&chain));
        assert_eq!(reopened.release("c1").expect("release"), Some(vec![chain]));
        assert_eq!(reopened.release("c1").expect("release again"), None);
        assert!(Leases::open(root.path())
            .expect("reopen")
            .holders()
            .expect("holders")
            .is_empty());
    }
}
