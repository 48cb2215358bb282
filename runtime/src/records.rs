//! Pod and container records: kept in memory for the many read calls kubelet makes, written
//! through to the database before a change is acted on, and loaded from it at start. Writers
//! of one kind of record take turns on a mutex of their own across the database write, so the
//! map and the database agree on the order of changes; the map itself is locked only to put
//! the written value in. A read never waits for a database write: it sees the value before a
//! write in flight, which nobody has been told of yet. (Holding the map's lock across the
//! write made every status and list call queue behind all the creates and stops in flight.)

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, RwLock};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crius_api::v1::{ContainerConfig, LinuxContainerResources, PodSandboxConfig};
use prost::Message;
use serde::Deserialize;

use crate::error::{Error, Result};
use crate::store::{Flush, Store, Table};

/// Records of one kind, by id.
pub struct Records<T> {
    table: Table,
    map: RwLock<HashMap<String, T>>,
    /// Held by a writer from its read of the old value to its map insert.
    writer: Mutex<()>,
}

impl<T: Clone + Serialize + DeserializeOwned> Records<T> {
    /// Loads every record of `table`.
    pub fn load(store: &Store, table: Table) -> Result<Records<T>> {
        let map = store.list::<T>(table)?.into_iter().collect();
        Ok(Records {
            table,
            map: RwLock::new(map),
            writer: Mutex::new(()),
        })
    }

    pub fn get(&self, id: &str) -> Option<T> {
        self.read().get(id).cloned()
    }

    pub fn all(&self) -> Vec<T> {
        self.read().values().cloned().collect()
    }

    /// What `f` makes of each record it picks, made under the read lock, so that no record is
    /// cloned: kubelet lists every pod and container each second. `f` runs with this lock
    /// held and must not take another lock of crius's records.
    pub fn filter_map<R>(&self, f: impl FnMut(&T) -> Option<R>) -> Vec<R> {
        self.read().values().filter_map(f).collect()
    }

    /// Ids that start with `prefix` (kubelet and crictl accept unique id prefixes).
    pub fn ids_with_prefix(&self, prefix: &str) -> Vec<String> {
        self.read()
            .keys()
            .filter(|k| k.starts_with(prefix))
            .cloned()
            .collect()
    }

    /// The full id from an id or a unique prefix of one, `None` when none matches. `field` and
    /// `kind` name the request field and the records in the errors (an empty id, an ambiguous
    /// prefix).
    pub fn resolve(&self, field: &str, kind: &str, id: &str) -> Result<Option<String>> {
        if id.is_empty() {
            return Err(Error::InvalidArgument(format!("{field} is required")));
        }
        if self.read().contains_key(id) {
            return Ok(Some(id.to_string()));
        }
        let matches = self.ids_with_prefix(id);
        match matches.len() {
            0 => Ok(None),
            1 => Ok(matches.into_iter().next()),
            n => Err(Error::InvalidArgument(format!(
                "{field} {:?} is ambiguous: {n} {kind} match",
                crate::util::excerpt(id)
            ))),
        }
    }

    /// Writes `value` durably, then makes it visible.
    pub fn put(&self, store: &Store, id: &str, value: T) -> Result<()> {
        let _turn = self.writing();
        store.put(self.table, id, &value)?;
        self.write().insert(id.to_string(), value);
        Ok(())
    }

    /// [`Self::put`] without a disk flush ([`Store::put_unflushed`]): for a record crius can
    /// learn again after a crash from what the durable one and the shim say.
    pub fn put_unflushed(&self, store: &Store, id: &str, value: T) -> Result<()> {
        let _turn = self.writing();
        store.put_unflushed(self.table, id, &value)?;
        self.write().insert(id.to_string(), value);
        Ok(())
    }

    /// Reserves the CRI `name` for `id` and writes `value` in one database transaction, on
    /// disk when `flush` says ([`Store::put_named`]), then makes it visible. `Some(holder)`
    /// (nothing written) when another id holds the name. With [`Flush::Later`] the caller
    /// flushes before anything it does could outlive a lost record unnoticed.
    pub fn put_named(
        &self,
        store: &Store,
        id: &str,
        value: T,
        name: &str,
        flush: Flush,
    ) -> Result<Option<String>> {
        let _turn = self.writing();
        if let Some(holder) = store.put_named(self.table, id, &value, name, flush)? {
            return Ok(Some(holder));
        }
        self.write().insert(id.to_string(), value);
        Ok(None)
    }

    /// Applies `f` to the record of `id` (if any) and writes it back; returns the new value.
    /// Writers take turns from the read to the map insert, so an update racing a `remove`
    /// cannot bring the removed record back.
    pub fn update(&self, store: &Store, id: &str, f: impl FnOnce(&mut T)) -> Result<Option<T>> {
        self.update_with(id, f, |table, value| store.put(table, id, value))
    }

    /// [`Self::update`] without a disk flush ([`Store::put_unflushed`]), for a change the shim
    /// reports again after a crash (a start). A write that fails (a full disk) is then no
    /// worse than one lost with the page cache, so the new value is kept in memory either way,
    /// and the next write of the record or a recovery puts it on disk. Returns the new value
    /// and the write's error, for the log.
    pub fn update_recoverable(
        &self,
        store: &Store,
        id: &str,
        f: impl FnOnce(&mut T),
    ) -> (Option<T>, Option<Error>) {
        self.update_keeping(id, f, |table, value| store.put_unflushed(table, id, value))
    }

    fn update_keeping(
        &self,
        id: &str,
        f: impl FnOnce(&mut T),
        write: impl FnOnce(Table, &T) -> crate::store::Result<()>,
    ) -> (Option<T>, Option<Error>) {
        let _turn = self.writing();
        let Some(mut value) = self.get(id) else {
            return (None, None);
        };
        f(&mut value);
        let failed = write(self.table, &value).err().map(Error::from);
        self.write().insert(id.to_string(), value.clone());
        (Some(value), failed)
    }

    fn update_with(
        &self,
        id: &str,
        f: impl FnOnce(&mut T),
        write: impl FnOnce(Table, &T) -> crate::store::Result<()>,
    ) -> Result<Option<T>> {
        let _turn = self.writing();
        let Some(mut value) = self.get(id) else {
            return Ok(None);
        };
        f(&mut value);
        write(self.table, &value)?;
        self.write().insert(id.to_string(), value.clone());
        Ok(Some(value))
    }

    pub fn remove(&self, store: &Store, id: &str) -> Result<()> {
        let _turn = self.writing();
        store.delete(self.table, id)?;
        self.write().remove(id);
        Ok(())
    }

    /// Removes the record of `id` and releases its CRI `name` in one database transaction,
    /// on disk before it returns or (`Flush::Later`) with the next durable commit.
    pub fn remove_named(&self, store: &Store, id: &str, name: &str, flush: Flush) -> Result<()> {
        let _turn = self.writing();
        store.delete_named(self.table, id, name, flush)?;
        self.write().remove(id);
        Ok(())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, T>> {
        self.map.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, T>> {
        self.map.write().unwrap_or_else(|p| p.into_inner())
    }

    /// A writer's turn (see the module's doc).
    fn writing(&self) -> MutexGuard<'_, ()> {
        self.writer.lock().unwrap_or_else(|p| p.into_inner())
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

/// Where a pod is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SandboxState {
    /// `RunPodSandbox` is under way (or crius died during it: cleaned up at start).
    Creating,
    Ready,
    NotReady,
}

/// What crius keeps of a pod.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SandboxRecord {
    pub id: String,
    /// The reserved name `<name>_<namespace>_<uid>_<attempt>`.
    pub name: String,
    /// The `PodSandboxConfig`, protobuf-encoded.
    #[serde(with = "crate::records::b64")]
    pub config: Vec<u8>,
    pub runtime_handler: String,
    pub state: SandboxState,
    pub created_at: i64,
    pub host_network: bool,
    /// The pinned netns, for pods on their own network.
    pub netns: Option<PathBuf>,
    /// Pod IPs, IPv4 first.
    pub ips: Vec<String>,
    /// The pause process, once started.
    pub pause_pid: Option<u32>,
    /// The pod cgroup (cgroupfs path).
    pub cgroup: String,
    pub hostname: String,
    /// Set when tearing down the network failed: Stop and Remove try again.
    #[serde(default)]
    pub network_error: Option<String>,
}

/// The fields of a `PodSandboxConfig` a listing shows, decoded alone (as [`ListedConfig`]).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListedPodConfig {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<crius_api::v1::PodSandboxMetadata>,
    #[prost(map = "string, string", tag = "6")]
    pub labels: HashMap<String, String>,
    #[prost(map = "string, string", tag = "7")]
    pub annotations: HashMap<String, String>,
}

impl SandboxRecord {
    /// What a listing shows of the config ([`ListedPodConfig`]).
    pub fn listed_config(&self) -> ListedPodConfig {
        ListedPodConfig::decode(self.config.as_slice()).unwrap_or_else(|e| {
            tracing::error!(pod = %self.id, "corrupt record: config does not decode ({e}); read as empty");
            ListedPodConfig::default()
        })
    }

    pub fn config(&self) -> PodSandboxConfig {
        // The bytes were encoded by us from a decoded message; a failure means a corrupt
        // database, and an empty config is the least harmful reading of it, said in the log.
        PodSandboxConfig::decode(self.config.as_slice()).unwrap_or_else(|e| {
            tracing::error!(pod = %self.id, "corrupt record: config does not decode ({e}); read as empty");
            PodSandboxConfig::default()
        })
    }
}

/// Where a container is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ContainerState {
    /// `CreateContainer` is under way (or crius died during it: cleaned up at start).
    Creating,
    Created,
    Running,
    Exited,
}

/// What crius keeps of a container.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ContainerRecord {
    pub id: String,
    /// The reserved name `<name>_<pod name>_<pod namespace>_<pod uid>_<attempt>`.
    pub name: String,
    pub sandbox_id: String,
    /// The `ContainerConfig`, protobuf-encoded.
    #[serde(with = "crate::records::b64")]
    pub config: Vec<u8>,
    /// `sha256:<config digest>`.
    pub image_id: String,
    /// The image as the client named it.
    pub image_name: String,
    /// A repo digest of the image (or its id when it has none).
    pub image_ref: String,
    pub state: ContainerState,
    pub created_at: i64,
    pub started_at: i64,
    pub finished_at: i64,
    pub exit_code: i32,
    pub reason: String,
    pub message: String,
    pub pid: Option<u32>,
    pub log_path: Option<PathBuf>,
    pub stop_signal: i32,
    /// The resources in force, protobuf-encoded `LinuxContainerResources`.
    #[serde(default, with = "crate::records::b64")]
    pub resources: Vec<u8>,
}

/// The fields of a `ContainerConfig` a listing shows, decoded alone from a record's config: the
/// same field numbers, the rest (command, environment, mounts, security context) skipped
/// unread. kubelet lists every container each second; decoding whole configs was most of a
/// ListContainers with 500 of them.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListedConfig {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<crius_api::v1::ContainerMetadata>,
    #[prost(message, optional, tag = "2")]
    pub image: Option<crius_api::v1::ImageSpec>,
    #[prost(map = "string, string", tag = "9")]
    pub labels: HashMap<String, String>,
    #[prost(map = "string, string", tag = "10")]
    pub annotations: HashMap<String, String>,
}

impl ContainerRecord {
    /// What a listing shows of the config ([`ListedConfig`]).
    pub fn listed_config(&self) -> ListedConfig {
        ListedConfig::decode(self.config.as_slice()).unwrap_or_else(|e| {
            tracing::error!(container = %self.id, "corrupt record: config does not decode ({e}); read as empty");
            ListedConfig::default()
        })
    }

    pub fn config(&self) -> ContainerConfig {
        // Encoded by us; a failure means a corrupt database (see SandboxRecord::config).
        ContainerConfig::decode(self.config.as_slice()).unwrap_or_else(|e| {
            tracing::error!(container = %self.id, "corrupt record: config does not decode ({e}); read as empty");
            ContainerConfig::default()
        })
    }

    pub fn resources(&self) -> Option<LinuxContainerResources> {
        if self.resources.is_empty() {
            return None;
        }
        LinuxContainerResources::decode(self.resources.as_slice())
            .inspect_err(|e| {
                tracing::error!(container = %self.id, "corrupt record: resources do not decode ({e})")
            })
            .ok()
    }
}

/// The ids of exited containers whose runtime state and mounts are given back already, at
/// their exit rather than at their removal (`container/release.rs`). Kept in memory only,
/// beside the records: after a restart none counts as released.
#[derive(Default)]
pub struct Released(Mutex<HashSet<String>>);

impl Released {
    fn set(&self) -> MutexGuard<'_, HashSet<String>> {
        // The set is only inserted into and removed from: a poisoned one is still whole.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn insert(&self, id: &str) {
        self.set().insert(id.to_owned());
    }

    /// Whether `id` was released, forgetting it: its removal is under way.
    pub(crate) fn take(&self, id: &str) -> bool {
        self.set().remove(id)
    }

    pub(crate) fn contains(&self, id: &str) -> bool {
        self.set().contains(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listed_config_has_the_fields_of_the_whole_one() {
        use crius_api::v1::{ContainerMetadata, ImageSpec, KeyValue, Mount};
        let whole = ContainerConfig {
            metadata: Some(ContainerMetadata {
                name: "app".into(),
                attempt: 3,
            }),
            image: Some(ImageSpec {
                image: "sha256:abc".into(),
                user_specified_image: "busybox".into(),
                ..Default::default()
            }),
            command: vec!["sleep".into(), "1".into()],
            envs: vec![KeyValue {
                key: "A".into(),
                value: "b".into(),
            }],
            mounts: vec![Mount {
                container_path: "/data".into(),
                ..Default::default()
            }],
            labels: HashMap::from([("l".into(), "1".into())]),
            annotations: HashMap::from([("a".into(), "2".into())]),
            log_path: "app.log".into(),
            ..Default::default()
        };
        let listed = ListedConfig::decode(whole.encode_to_vec().as_slice()).unwrap();
        assert_eq!(listed.metadata, whole.metadata);
        assert_eq!(listed.image, whole.image);
        assert_eq!(listed.labels, whole.labels);
        assert_eq!(listed.annotations, whole.annotations);
    }

    #[test]
    fn a_listed_pod_config_has_the_fields_of_the_whole_one() {
        use crius_api::v1::{DnsConfig, PodSandboxMetadata, PortMapping};
        let whole = PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: "p".into(),
                uid: "u".into(),
                namespace: "n".into(),
                attempt: 1,
            }),
            hostname: "h".into(),
            dns_config: Some(DnsConfig {
                servers: vec!["10.0.0.10".into()],
                ..Default::default()
            }),
            port_mappings: vec![PortMapping {
                container_port: 80,
                ..Default::default()
            }],
            labels: HashMap::from([("l".into(), "1".into())]),
            annotations: HashMap::from([("a".into(), "2".into())]),
            ..Default::default()
        };
        let listed = ListedPodConfig::decode(whole.encode_to_vec().as_slice()).unwrap();
        assert_eq!(listed.metadata, whole.metadata);
        assert_eq!(listed.labels, whole.labels);
        assert_eq!(listed.annotations, whole.annotations);
    }

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

    /// A recoverable change whose write fails (a full disk: faked here, as a real file system
    /// cannot be made to refuse one write on demand) is still what the record says, while an
    /// ordinary update that fails changes nothing.
    #[test]
    fn a_recoverable_change_is_kept_when_its_write_fails() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let records: Records<u32> = Records::load(&store, Table::Containers).unwrap();
        records.put(&store, "a", 1).unwrap();
        let full = |_: Table, _: &u32| -> crate::store::Result<()> {
            Err(crate::store::StoreError::Db {
                table: Table::Containers,
                key: "a".into(),
                source: redb::Error::Io(std::io::Error::from_raw_os_error(28)),
            })
        };
        assert!(records.update_with("a", |v| *v = 5, full).is_err());
        assert_eq!(records.get("a"), Some(1));
        let (value, failed) = records.update_keeping("a", |v| *v = 2, full);
        assert_eq!(value, Some(2));
        assert!(failed.is_some());
        assert_eq!(records.get("a"), Some(2));
        // The next write of the record takes the kept value to disk.
        records.update(&store, "a", |v| *v += 1).unwrap();
        let reloaded: Records<u32> = Records::load(&store, Table::Containers).unwrap();
        assert_eq!(reloaded.get("a"), Some(3));
    }

    /// A reader is answered while a writer is mid-way (here held inside its update), with the
    /// value before the write; a second writer waits its turn, and both writes land in order.
    #[test]
    fn reads_do_not_wait_for_a_write_in_flight() {
        use std::sync::mpsc;
        use std::time::Duration;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let records: Records<u32> = Records::load(&store, Table::Containers).unwrap();
        records.put(&store, "a", 1).unwrap();
        let (entered, writer_in) = mpsc::channel();
        let (release, go_on) = mpsc::channel::<()>();
        std::thread::scope(|s| {
            let (records, store) = (&records, &store);
            let first = s.spawn(move || {
                records.update(store, "a", |v| {
                    entered.send(()).unwrap();
                    go_on.recv().unwrap();
                    *v *= 10;
                })
            });
            writer_in.recv().unwrap();
            let (read_tx, read_rx) = mpsc::channel();
            s.spawn(move || read_tx.send(records.get("a")).unwrap());
            assert_eq!(
                read_rx.recv_timeout(Duration::from_secs(5)).unwrap(),
                Some(1),
                "a read waited for the write in flight"
            );
            let second = s.spawn(move || records.update(store, "a", |v| *v += 1));
            std::thread::sleep(Duration::from_millis(50));
            assert!(!second.is_finished(), "two writers at once");
            release.send(()).unwrap();
            assert_eq!(first.join().unwrap().unwrap(), Some(10));
            assert_eq!(second.join().unwrap().unwrap(), Some(11));
        });
        let reloaded: Records<u32> = Records::load(&store, Table::Containers).unwrap();
        assert_eq!(reloaded.get("a"), Some(11));
    }
}
