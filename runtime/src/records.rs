//! Pod and container records: kept in memory for the many read calls kubelet makes, written
//! through to the database before a change is acted on, and loaded from it at start. Writes
//! hold the map's lock across the database write, so the map and the database agree on the
//! order of changes; a read waits at most for one database write in flight.

use std::collections::HashMap;
use std::sync::RwLock;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::Result;
use crate::store::{Store, Table};

/// Records of one kind, by id.
pub struct Records<T> {
    table: Table,
    map: RwLock<HashMap<String, T>>,
}

impl<T: Clone + Serialize + DeserializeOwned> Records<T> {
    /// Loads every record of `table`.
    pub fn load(store: &Store, table: Table) -> Result<Records<T>> {
        let map = store.list::<T>(table)?.into_iter().collect();
        Ok(Records {
            table,
            map: RwLock::new(map),
        })
    }

    pub fn get(&self, id: &str) -> Option<T> {
        self.read().get(id).cloned()
    }

    pub fn all(&self) -> Vec<T> {
        self.read().values().cloned().collect()
    }

    /// Ids that start with `prefix` (kubelet and crictl accept unique id prefixes).
    pub fn ids_with_prefix(&self, prefix: &str) -> Vec<String> {
        self.read()
            .keys()
            .filter(|k| k.starts_with(prefix))
            .cloned()
            .collect()
    }

    /// Writes `value` durably, then makes it visible.
    pub fn put(&self, store: &Store, id: &str, value: T) -> Result<()> {
        let mut map = self.write();
        store.put(self.table, id, &value)?;
        map.insert(id.to_string(), value);
        Ok(())
    }

    /// Applies `f` to the record of `id` (if any) and writes it back; returns the new value.
    /// The map stays locked from the read to the write, so an update racing a `remove` cannot
    /// bring the removed record back.
    pub fn update(&self, store: &Store, id: &str, f: impl FnOnce(&mut T)) -> Result<Option<T>> {
        let mut map = self.write();
        let Some(mut value) = map.get(id).cloned() else {
            return Ok(None);
        };
        f(&mut value);
        store.put(self.table, id, &value)?;
        map.insert(id.to_string(), value.clone());
        Ok(Some(value))
    }

    pub fn remove(&self, store: &Store, id: &str) -> Result<()> {
        let mut map = self.write();
        store.delete(self.table, id)?;
        map.remove(id);
        Ok(())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, T>> {
        self.map.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, T>> {
        self.map.write().unwrap_or_else(|p| p.into_inner())
    }
}

/// serde for protobuf-encoded CRI messages kept inside JSON records: base64 text.
pub mod b64 {
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(data: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(data))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn update_of_a_removed_record_does_not_bring_it_back() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let records: Records<u32> = Records::load(&store, Table::Containers).unwrap();
        records.put(&store, "a", 1).unwrap();
        assert_eq!(records.update(&store, "a", |v| *v += 1).unwrap(), Some(2));
        records.remove(&store, "a").unwrap();
        assert_eq!(records.update(&store, "a", |v| *v += 1).unwrap(), None);
        assert_eq!(records.get("a"), None);
        let reloaded: Records<u32> = Records::load(&store, Table::Containers).unwrap();
        assert_eq!(reloaded.get("a"), None);
    }
}
