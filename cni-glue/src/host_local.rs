//! A repair for host-local, the IPAM plugin most pod networks use: after a power loss its
//! store can hold a reservation file that is empty.
//!
//! host-local reserves an address by creating `<dataDir>/<network>/<ip>` and then writing the
//! owner's id and interface into it, without an fsync. A node that loses power soon after
//! keeps the new file (its directory entry reached the journal) but not its content, and
//! host-local's DEL, which releases by owner, never matches the empty file: the address is
//! held for good (the plugins' own issue tracker knows it). When crius tears down an
//! attachment whose ADD result gave an address and host-local's file for that address is empty,
//! the file is the attachment's own reservation (no other ADD can have created it while it
//! existed), so crius removes it after a successful DEL. An ADD the power cut before it
//! answered left no result naming its address: after a reboot, before crius serves, every empty
//! reservation in the stores its attachments used goes.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::config::NetworkConfigList;
use crate::result::AddResult;

/// host-local's store when its config names no `dataDir`.
const DEFAULT_DATA_DIR: &str = "/var/lib/cni/networks";

/// host-local's store directory for `list`'s network, if a plugin of it uses host-local.
fn data_dirs(list: &NetworkConfigList) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    // The network name is a path component only if it is one (CNI allows few characters in
    // it, but the file is not trusted to follow the rule).
    if list.name.is_empty() || list.name.contains('/') || list.name.starts_with('.') {
        return dirs;
    }
    for plugin in &list.plugins {
        let Some(ipam) = plugin.raw.get("ipam").and_then(Value::as_object) else {
            continue;
        };
        if ipam.get("type").and_then(Value::as_str) != Some("host-local") {
            continue;
        }
        let data_dir = ipam
            .get("dataDir")
            .and_then(Value::as_str)
            .filter(|d| !d.is_empty())
            .unwrap_or(DEFAULT_DATA_DIR);
        dirs.push(Path::new(data_dir).join(&list.name));
    }
    dirs
}

/// After a reboot, before any ADD of this boot: every empty reservation in the host-local
/// stores of `lists`. host-local writes a reservation's owner right after creating its file,
/// so with no ADD running an empty one is a write a power loss cut, whoever it was for (an
/// attachment whose ADD never answered has no result naming its address). Returns the files
/// removed.
pub(crate) fn release_all_blank<'a>(
    lists: impl IntoIterator<Item = &'a NetworkConfigList>,
) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = lists.into_iter().flat_map(data_dirs).collect();
    dirs.sort();
    dirs.dedup();
    let mut removed = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let is_address = entry
                .file_name()
                .to_str()
                .is_some_and(|n| n.parse::<std::net::IpAddr>().is_ok());
            let path = entry.path();
            if is_address && remove_if_blank(&path) {
                removed.push(path);
            }
        }
    }
    removed
}

/// The reservation files host-local would keep for `result`'s addresses on `list`: one per
/// address, for each plugin whose `ipam.type` is `host-local`.
fn reservation_files(list: &NetworkConfigList, result: &AddResult) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for dir in data_dirs(list) {
        for ip in &result.ips {
            files.push(dir.join(ip.address.addr.to_string()));
        }
    }
    files
}

/// Removes the empty host-local reservations of `result`'s addresses; returns the files
/// removed. Anything else (a file with an owner, a missing one, an error) is left as it is.
pub(crate) fn release_blank(list: &NetworkConfigList, result: &AddResult) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    for file in reservation_files(list, result) {
        if remove_if_blank(&file) {
            removed.push(file);
        }
    }
    removed
}

/// Removes `path` if it is an empty regular file (not a link): whether it did.
fn remove_if_blank(path: &Path) -> bool {
    let blank = std::fs::symlink_metadata(path).is_ok_and(|m| m.is_file() && m.len() == 0);
    blank && std::fs::remove_file(path).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(data_dir: &Path, ipam_type: &str) -> NetworkConfigList {
        let conf = serde_json::json!({
            "cniVersion": "1.0.0",
            "name": "podnet",
            "plugins": [
                {"type": "bridge", "ipam": {"type": ipam_type, "dataDir": data_dir}},
                {"type": "portmap", "capabilities": {"portMappings": true}}
            ]
        });
        NetworkConfigList::from_conflist(&serde_json::to_vec(&conf).unwrap(), Path::new("x"))
            .unwrap()
    }

    fn result() -> AddResult {
        AddResult::from_value(&serde_json::json!({
            "cniVersion": "1.0.0",
            "ips": [{"address": "10.85.0.5/24"}, {"address": "fd00::5/64"}]
        }))
        .unwrap()
    }

    #[test]
    fn only_the_empty_reservations_of_the_results_addresses_go() {
        let dir = tempfile::tempdir().unwrap();
        let net = dir.path().join("podnet");
        std::fs::create_dir(&net).unwrap();
        std::fs::write(net.join("10.85.0.5"), "").unwrap();
        std::fs::write(net.join("fd00::5"), "other-owner\r\neth0").unwrap();
        std::fs::write(net.join("10.85.0.6"), "").unwrap();
        std::fs::write(net.join("last_reserved_ip.0"), "10.85.0.6").unwrap();

        let removed = release_blank(&list(dir.path(), "host-local"), &result());
        assert_eq!(removed, vec![net.join("10.85.0.5")]);
        assert!(
            net.join("fd00::5").exists(),
            "a reservation with an owner stays"
        );
        assert!(
            net.join("10.85.0.6").exists(),
            "an address not in the result stays"
        );
        assert!(net.join("last_reserved_ip.0").exists());
    }

    #[test]
    fn after_a_reboot_every_empty_reservation_goes() {
        let dir = tempfile::tempdir().unwrap();
        let net = dir.path().join("podnet");
        std::fs::create_dir(&net).unwrap();
        std::fs::write(net.join("10.85.0.5"), "").unwrap();
        std::fs::write(net.join("10.85.0.6"), "").unwrap();
        std::fs::write(net.join("10.85.0.7"), "owner\r\neth0").unwrap();
        std::fs::write(net.join("lock"), "").unwrap();
        let l = list(dir.path(), "host-local");
        let mut removed = release_all_blank([&l, &l]);
        removed.sort();
        assert_eq!(removed, vec![net.join("10.85.0.5"), net.join("10.85.0.6")]);
        assert!(net.join("10.85.0.7").exists() && net.join("lock").exists());
    }

    #[test]
    fn other_ipam_plugins_are_not_touched() {
        let dir = tempfile::tempdir().unwrap();
        let net = dir.path().join("podnet");
        std::fs::create_dir(&net).unwrap();
        std::fs::write(net.join("10.85.0.5"), "").unwrap();
        assert!(release_blank(&list(dir.path(), "dhcp"), &result()).is_empty());
        assert!(net.join("10.85.0.5").exists());
    }
}
