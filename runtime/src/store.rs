//! The daemon's database: an embedded ACID store (redb) at `<root>/crius.db`.
//!
//! Records are JSON values keyed by id in one table per kind, so a record type can gain
//! fields without a migration (serde defaults fill them). Each write is its own transaction,
//! made durable before it returns: a record a caller has seen written survives `kill -9`.
//! The database carries a schema version; a database written by a newer crius is refused.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// The schema this crius writes. Raise it when a change cannot be read by older code.
pub const SCHEMA_VERSION: u32 = 1;

const META: TableDefinition<&str, u32> = TableDefinition::new("meta");
const SCHEMA_KEY: &str = "schema_version";

/// The kinds of record the daemon keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    Sandboxes,
    Containers,
    /// Name reservations: the CRI name of a pod or container → the id holding it.
    Names,
}

impl Table {
    const ALL: [Table; 3] = [Table::Sandboxes, Table::Containers, Table::Names];

    fn def(self) -> TableDefinition<'static, &'static str, &'static [u8]> {
        TableDefinition::new(match self {
            Table::Sandboxes => "sandboxes",
            Table::Containers => "containers",
            Table::Names => "names",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("create database directory {path}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("create database {path}")]
    Create {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("open database {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: redb::Error,
    },
    #[error("database {path} has schema version {found}, newer than the {supported} this crius understands: run a crius at least as new as the one that wrote it")]
    NewerSchema {
        path: PathBuf,
        found: u32,
        supported: u32,
    },
    #[error("database {table:?} {key}")]
    Db {
        table: Table,
        key: String,
        #[source]
        source: redb::Error,
    },
    #[error("decode {table:?} record {key}")]
    Decode {
        table: Table,
        key: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("encode {table:?} record {key}")]
    Encode {
        table: Table,
        key: String,
        #[source]
        source: serde_json::Error,
    },
}

pub type Result<T> = std::result::Result<T, StoreError>;

/// When a write reaches the disk: before it returns, or with the next durable commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flush {
    Now,
    Later,
}

/// The open database. Cheap to share behind an `Arc`; redb serialises writers itself.
pub struct Store {
    db: Database,
    path: PathBuf,
    /// Notified by every unflushed write.
    unflushed: Arc<tokio::sync::Notify>,
}

/// How long an unflushed write may wait for a durable commit to carry it to disk.
pub const FLUSH_WITHIN: std::time::Duration = std::time::Duration::from_millis(100);

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish()
    }
}

/// Makes a new, empty database at `path` whole or not at all: redb writes its header after
/// creating the file, and a crius killed in between would leave a file no later start can
/// open. So it is made beside, synced, and renamed into place.
fn create_atomically(path: &Path) -> std::io::Result<()> {
    let tmp = path.with_extension("db.new");
    match std::fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    drop(Database::create(&tmp).map_err(std::io::Error::other)?);
    std::fs::File::open(&tmp)?.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

impl Store {
    /// Opens (creating if needed) `<root>/crius.db` and checks its schema version.
    pub fn open(root: &Path) -> Result<Store> {
        std::fs::create_dir_all(root).map_err(|source| StoreError::CreateDir {
            path: root.to_path_buf(),
            source,
        })?;
        let path = root.join("crius.db");
        let open_err = |source: redb::Error| StoreError::Open {
            path: path.clone(),
            source,
        };
        if !path.exists() {
            create_atomically(&path).map_err(|source| StoreError::Create {
                path: path.clone(),
                source,
            })?;
        }
        let db = Database::create(&path).map_err(|e| open_err(e.into()))?;
        let txn = db.begin_write().map_err(|e| open_err(e.into()))?;
        {
            let mut meta = txn.open_table(META).map_err(|e| open_err(e.into()))?;
            let found = meta
                .get(SCHEMA_KEY)
                .map_err(|e| open_err(e.into()))?
                .map(|v| v.value());
            match found {
                Some(found) if found > SCHEMA_VERSION => {
                    return Err(StoreError::NewerSchema {
                        path: path.clone(),
                        found,
                        supported: SCHEMA_VERSION,
                    })
                }
                Some(found) if found == SCHEMA_VERSION => {}
                // A new database, or an older schema: every change so far is additive.
                _ => {
                    meta.insert(SCHEMA_KEY, SCHEMA_VERSION)
                        .map_err(|e| open_err(e.into()))?;
                }
            }
            for table in Table::ALL {
                txn.open_table(table.def())
                    .map_err(|e| open_err(e.into()))?;
            }
        }
        txn.commit().map_err(|e| open_err(e.into()))?;
        Ok(Store {
            db,
            path,
            unflushed: Arc::default(),
        })
    }

    /// Where the database file is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The schema version recorded in the database.
    pub fn schema_version(&self) -> Result<u32> {
        let err = |source: redb::Error| StoreError::Db {
            table: Table::Names,
            key: SCHEMA_KEY.to_string(),
            source,
        };
        let txn = self.db.begin_read().map_err(|e| err(e.into()))?;
        let meta = txn.open_table(META).map_err(|e| err(e.into()))?;
        let v = meta.get(SCHEMA_KEY).map_err(|e| err(e.into()))?;
        Ok(v.map(|v| v.value()).unwrap_or(0))
    }

    /// Writes (inserts or replaces) one record.
    pub fn put<T: Serialize>(&self, table: Table, key: &str, value: &T) -> Result<()> {
        self.put_with(table, key, value, Flush::Now)
    }

    /// Writes one record without a disk flush: the next durable commit carries it, and a
    /// crash before one loses it. Only for what crius learns again after a restart (a
    /// container's create and start, which its shim reports).
    pub fn put_unflushed<T: Serialize>(&self, table: Table, key: &str, value: &T) -> Result<()> {
        self.put_with(table, key, value, Flush::Later)
    }

    /// A durable commit of nothing, which carries every unflushed write before it to disk.
    pub fn flush(&self) -> Result<()> {
        self.write_with(Table::Names, "", Flush::Now, |_| Ok(()))
    }

    /// Notified after every unflushed write (see `Daemon::flush_store_later`).
    pub fn unflushed_writes(&self) -> Arc<tokio::sync::Notify> {
        self.unflushed.clone()
    }

    fn put_with<T: Serialize>(
        &self,
        table: Table,
        key: &str,
        value: &T,
        flush: Flush,
    ) -> Result<()> {
        let bytes = serde_json::to_vec(value).map_err(|source| StoreError::Encode {
            table,
            key: key.to_string(),
            source,
        })?;
        self.write_with(table, key, flush, |t| {
            t.insert(key, bytes.as_slice())?;
            Ok(())
        })
    }

    /// Reads one record.
    pub fn get<T: DeserializeOwned>(&self, table: Table, key: &str) -> Result<Option<T>> {
        let err = db_err(table, key);
        let txn = self.db.begin_read().map_err(|e| err(e.into()))?;
        let t = txn.open_table(table.def()).map_err(|e| err(e.into()))?;
        let Some(v) = t.get(key).map_err(|e| err(e.into()))? else {
            return Ok(None);
        };
        decode(table, key, v.value()).map(Some)
    }

    /// Removes one record; removing a missing one is not an error.
    pub fn delete(&self, table: Table, key: &str) -> Result<()> {
        self.write(table, key, |t| {
            t.remove(key)?;
            Ok(())
        })
    }

    /// Removes one record and releases the name it held (see [`Store::release_name`]) in one
    /// transaction: one commit instead of two, and no crash between them can leave a name
    /// reserved for a record that is gone. Durable before it returns with `Flush::Now`; with
    /// `Flush::Later` the next durable commit carries it (the daemon's flusher is told).
    pub fn delete_named(&self, table: Table, key: &str, name: &str, flush: Flush) -> Result<()> {
        let err = db_err(table, key);
        let txn = self.begin(flush, &err)?;
        {
            let mut t = txn.open_table(table.def()).map_err(|e| err(e.into()))?;
            t.remove(key).map_err(|e| err(e.into()))?;
        }
        {
            let err = db_err(Table::Names, name);
            let mut names = txn
                .open_table(Table::Names.def())
                .map_err(|e| err(e.into()))?;
            let held = names
                .get(name)
                .map_err(|e| err(e.into()))?
                .is_some_and(|v| v.value() == key.as_bytes());
            if held {
                names.remove(name).map_err(|e| err(e.into()))?;
            }
        }
        self.commit(txn, flush, &err)
    }

    /// Every record of a table, in key order.
    pub fn list<T: DeserializeOwned>(&self, table: Table) -> Result<Vec<(String, T)>> {
        let err = db_err(table, "*");
        let txn = self.db.begin_read().map_err(|e| err(e.into()))?;
        let t = txn.open_table(table.def()).map_err(|e| err(e.into()))?;
        let mut out = Vec::new();
        for entry in t.iter().map_err(|e| err(e.into()))? {
            let (k, v) = entry.map_err(|e| err(e.into()))?;
            let key = k.value().to_string();
            let value = decode(table, &key, v.value())?;
            out.push((key, value));
        }
        Ok(out)
    }

    /// Reserves `name` for `id` in one transaction. Returns the id already holding the name
    /// when it is taken by another id; reserving a name again for the same id is a no-op.
    pub fn reserve_name(&self, name: &str, id: &str) -> Result<Option<String>> {
        let mut holder = None;
        self.write(Table::Names, name, |t| {
            let current = t
                .get(name)?
                .map(|v| String::from_utf8_lossy(v.value()).into_owned());
            match current {
                Some(other) if other != id => holder = Some(other),
                Some(_) => {}
                None => {
                    t.insert(name, id.as_bytes())?;
                }
            }
            Ok(())
        })?;
        Ok(holder)
    }

    /// Reserves `name` for `key` and writes `value` as its record, in one transaction: one
    /// durable commit instead of two (a create's first write), and no crash between them can
    /// leave a name reserved without its record. When another id holds the name nothing is
    /// written and that id is returned.
    ///
    /// With [`Flush::Later`] the commit is not flushed to disk: the next durable commit
    /// ([`Self::flush`]) carries it, and a crash before one loses the record and the name
    /// together.
    pub fn put_named<T: Serialize>(
        &self,
        table: Table,
        key: &str,
        value: &T,
        name: &str,
        flush: Flush,
    ) -> Result<Option<String>> {
        let bytes = serde_json::to_vec(value).map_err(|source| StoreError::Encode {
            table,
            key: key.to_string(),
            source,
        })?;
        let err = db_err(table, key);
        let txn = self.begin(flush, &err)?;
        {
            let err = db_err(Table::Names, name);
            let mut names = txn
                .open_table(Table::Names.def())
                .map_err(|e| err(e.into()))?;
            let current = names
                .get(name)
                .map_err(|e| err(e.into()))?
                .map(|v| String::from_utf8_lossy(v.value()).into_owned());
            match current {
                // Dropping the transaction aborts it.
                Some(other) if other != key => return Ok(Some(other)),
                Some(_) => {}
                None => {
                    names
                        .insert(name, key.as_bytes())
                        .map_err(|e| err(e.into()))?;
                }
            }
        }
        {
            let mut t = txn.open_table(table.def()).map_err(|e| err(e.into()))?;
            t.insert(key, bytes.as_slice()).map_err(|e| err(e.into()))?;
        }
        self.commit(txn, flush, &err)?;
        Ok(None)
    }

    /// Releases `name` if `id` holds it.
    pub fn release_name(&self, name: &str, id: &str) -> Result<()> {
        self.write(Table::Names, name, |t| {
            let held = t.get(name)?.is_some_and(|v| v.value() == id.as_bytes());
            if held {
                t.remove(name)?;
            }
            Ok(())
        })
    }

    fn write(
        &self,
        table: Table,
        key: &str,
        f: impl FnOnce(&mut redb::Table<&str, &[u8]>) -> std::result::Result<(), redb::Error>,
    ) -> Result<()> {
        self.write_with(table, key, Flush::Now, f)
    }

    fn write_with(
        &self,
        table: Table,
        key: &str,
        flush: Flush,
        f: impl FnOnce(&mut redb::Table<&str, &[u8]>) -> std::result::Result<(), redb::Error>,
    ) -> Result<()> {
        let err = db_err(table, key);
        let txn = self.begin(flush, &err)?;
        {
            let mut t = txn.open_table(table.def()).map_err(|e| err(e.into()))?;
            f(&mut t).map_err(&err)?;
        }
        self.commit(txn, flush, &err)
    }

    /// A write transaction, durable at its commit or (`Flush::Later`) not.
    fn begin(
        &self,
        flush: Flush,
        err: &impl Fn(redb::Error) -> StoreError,
    ) -> Result<redb::WriteTransaction> {
        let mut txn = self.db.begin_write().map_err(|e| err(e.into()))?;
        let durability = match flush {
            Flush::Now => redb::Durability::Immediate,
            Flush::Later => redb::Durability::None,
        };
        txn.set_durability(durability).map_err(|e| err(e.into()))?;
        Ok(txn)
    }

    /// Commits `txn`; an unflushed commit is told to the daemon's flusher.
    fn commit(
        &self,
        txn: redb::WriteTransaction,
        flush: Flush,
        err: &impl Fn(redb::Error) -> StoreError,
    ) -> Result<()> {
        txn.commit().map_err(|e| err(e.into()))?;
        if flush == Flush::Later {
            self.unflushed.notify_one();
        }
        Ok(())
    }
}

fn db_err(table: Table, key: &str) -> impl Fn(redb::Error) -> StoreError + '_ {
    move |source| StoreError::Db {
        table,
        key: key.to_string(),
        source,
    }
}

fn decode<T: DeserializeOwned>(table: Table, key: &str, bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|source| StoreError::Decode {
        table,
        key: key.to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_creation_cut_short_leaves_no_unopenable_file() {
        let dir = tempfile::tempdir().unwrap();
        // what a crius killed inside Database::create could leave beside the database
        std::fs::write(dir.path().join("crius.db.new"), b"").unwrap();
        let store = Store::open(dir.path()).unwrap();
        assert!(!dir.path().join("crius.db.new").exists());
        drop(store);
        Store::open(dir.path()).unwrap();
    }

    use super::*;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Rec {
        name: String,
        n: u32,
    }

    #[test]
    fn records_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = Store::open(dir.path()).unwrap();
            let r = Rec {
                name: "a".into(),
                n: 1,
            };
            s.put(Table::Sandboxes, "id1", &r).unwrap();
            s.put(
                Table::Sandboxes,
                "id2",
                &Rec {
                    name: "b".into(),
                    n: 2,
                },
            )
            .unwrap();
            s.delete(Table::Sandboxes, "id2").unwrap();
            s.delete(Table::Sandboxes, "missing").unwrap();
        }
        let s = Store::open(dir.path()).unwrap();
        assert_eq!(s.schema_version().unwrap(), SCHEMA_VERSION);
        let all: Vec<(String, Rec)> = s.list(Table::Sandboxes).unwrap();
        assert_eq!(
            all,
            vec![(
                "id1".to_string(),
                Rec {
                    name: "a".into(),
                    n: 1
                }
            )]
        );
        assert_eq!(s.get::<Rec>(Table::Containers, "id1").unwrap(), None);
    }

    #[test]
    fn names_are_reserved_once() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        assert_eq!(s.reserve_name("pod_ns_uid_0", "a").unwrap(), None);
        assert_eq!(s.reserve_name("pod_ns_uid_0", "a").unwrap(), None);
        assert_eq!(
            s.reserve_name("pod_ns_uid_0", "b").unwrap(),
            Some("a".into())
        );
        s.release_name("pod_ns_uid_0", "b").unwrap();
        assert_eq!(
            s.reserve_name("pod_ns_uid_0", "b").unwrap(),
            Some("a".into())
        );
        s.release_name("pod_ns_uid_0", "a").unwrap();
        assert_eq!(s.reserve_name("pod_ns_uid_0", "b").unwrap(), None);
    }

    #[test]
    fn a_named_delete_removes_the_record_and_frees_only_its_own_name() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let rec = |n| Rec {
            name: "c".into(),
            n,
        };
        s.put(Table::Containers, "a", &rec(1)).unwrap();
        s.put(Table::Containers, "b", &rec(2)).unwrap();
        assert_eq!(s.reserve_name("ctr_0", "a").unwrap(), None);
        // "b" does not hold the name: its record goes, the name stays with "a"
        s.delete_named(Table::Containers, "b", "ctr_0", Flush::Now)
            .unwrap();
        assert_eq!(s.get::<Rec>(Table::Containers, "b").unwrap(), None);
        assert_eq!(s.reserve_name("ctr_0", "x").unwrap(), Some("a".into()));
        s.delete_named(Table::Containers, "a", "ctr_0", Flush::Now)
            .unwrap();
        drop(s);
        let s = Store::open(dir.path()).unwrap();
        assert!(s.list::<Rec>(Table::Containers).unwrap().is_empty());
        assert_eq!(s.reserve_name("ctr_0", "x").unwrap(), None);
        // deleting what is gone is not an error
        s.delete_named(Table::Containers, "a", "ctr_0", Flush::Now)
            .unwrap();
        assert_eq!(s.reserve_name("ctr_0", "y").unwrap(), Some("x".into()));
    }

    #[test]
    fn an_unflushed_named_delete_is_seen_at_once_and_on_disk_after_a_flush() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let rec = Rec {
            name: "c".into(),
            n: 1,
        };
        s.put_named(Table::Containers, "a", &rec, "ctr_0", Flush::Now)
            .unwrap();
        let unflushed = s.unflushed_writes();
        s.delete_named(Table::Containers, "a", "ctr_0", Flush::Later)
            .unwrap();
        // The daemon's flusher is told.
        let told = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
            .block_on(async {
                tokio::time::timeout(std::time::Duration::from_secs(1), unflushed.notified())
                    .await
                    .is_ok()
            });
        assert!(told);
        assert_eq!(s.get::<Rec>(Table::Containers, "a").unwrap(), None);
        assert_eq!(s.reserve_name("ctr_0", "b").unwrap(), None);
        s.flush().unwrap();
        drop(s);
        let s = Store::open(dir.path()).unwrap();
        assert_eq!(s.get::<Rec>(Table::Containers, "a").unwrap(), None);
        assert_eq!(s.reserve_name("ctr_0", "x").unwrap(), Some("b".into()));
    }

    #[test]
    fn a_named_put_writes_the_record_and_the_name_together_or_neither() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let rec = |n| Rec {
            name: "c".into(),
            n,
        };
        assert_eq!(
            s.put_named(Table::Containers, "a", &rec(1), "ctr_0", Flush::Now)
                .unwrap(),
            None
        );
        // the same id again: the record is replaced, the name stays its own
        assert_eq!(
            s.put_named(Table::Containers, "a", &rec(2), "ctr_0", Flush::Now)
                .unwrap(),
            None
        );
        // another id: refused, and its record is not written
        assert_eq!(
            s.put_named(Table::Containers, "b", &rec(3), "ctr_0", Flush::Now)
                .unwrap(),
            Some("a".into())
        );
        drop(s);
        let s = Store::open(dir.path()).unwrap();
        assert_eq!(s.get::<Rec>(Table::Containers, "a").unwrap(), Some(rec(2)));
        assert_eq!(s.get::<Rec>(Table::Containers, "b").unwrap(), None);
        assert_eq!(s.reserve_name("ctr_0", "x").unwrap(), Some("a".into()));
    }

    #[test]
    fn put_named_later_checks_the_name_and_the_next_flush_keeps_it() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let rec = |n| Rec {
            name: "c".into(),
            n,
        };
        s.put_named(Table::Containers, "a", &rec(1), "taken", Flush::Now)
            .unwrap();
        assert_eq!(
            s.put_named(Table::Containers, "b", &rec(2), "taken", Flush::Later)
                .unwrap(),
            Some("a".into())
        );
        assert_eq!(
            s.put_named(Table::Containers, "b", &rec(2), "free", Flush::Later)
                .unwrap(),
            None
        );
        assert_eq!(s.get::<Rec>(Table::Containers, "b").unwrap(), Some(rec(2)));
        s.flush().unwrap();
        drop(s);
        let s = Store::open(dir.path()).unwrap();
        assert_eq!(s.get::<Rec>(Table::Containers, "b").unwrap(), Some(rec(2)));
        assert_eq!(s.reserve_name("free", "x").unwrap(), Some("b".into()));
    }

    #[test]
    fn newer_schema_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = Store::open(dir.path()).unwrap();
            let txn = s.db.begin_write().unwrap();
            txn.open_table(META)
                .unwrap()
                .insert(SCHEMA_KEY, SCHEMA_VERSION + 1)
                .unwrap();
            txn.commit().unwrap();
        }
        let msg = Store::open(dir.path()).unwrap_err().to_string();
        assert!(
            msg.contains("schema version 2") && msg.contains("newer"),
            "{msg}"
        );
    }

    #[test]
    fn a_second_open_of_one_database_fails() {
        let dir = tempfile::tempdir().unwrap();
        let _first = Store::open(dir.path()).unwrap();
        assert!(Store::open(dir.path()).is_err());
    }
}
