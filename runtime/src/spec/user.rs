//! The container process's uid, gid and supplementary groups, from the CRI security context or
//! the image's `User`, resolved against the image's `/etc/passwd` and `/etc/group`.

use std::path::Path;

use crius_api::v1::{LinuxContainerSecurityContext, SupplementalGroupsPolicy};
use oci_spec::runtime::{User, UserBuilder};

use super::error::{Result, SpecError};
use super::rootfs::{parse_group, parse_passwd, read_in_root, GroupEntry, PasswdEntry};

/// The user databases of one rootfs, read once and only when a lookup needs them.
struct Databases<'a> {
    rootfs: &'a Path,
    passwd: Option<Option<Vec<PasswdEntry>>>,
    group: Option<Option<Vec<GroupEntry>>>,
}

impl<'a> Databases<'a> {
    fn new(rootfs: &'a Path) -> Self {
        Databases {
            rootfs,
            passwd: None,
            group: None,
        }
    }

    /// The passwd entries, or `None` when the image has no /etc/passwd.
    fn passwd(&mut self) -> Result<Option<&[PasswdEntry]>> {
        if self.passwd.is_none() {
            let text = read_in_root(self.rootfs, "/etc/passwd")
                .map_err(|e| image_file("/etc/passwd", self.rootfs, e))?;
            self.passwd = Some(text.map(|t| parse_passwd(&t)));
        }
        Ok(self.passwd.as_ref().and_then(|p| p.as_deref()))
    }

    fn group(&mut self) -> Result<Option<&[GroupEntry]>> {
        if self.group.is_none() {
            let text = read_in_root(self.rootfs, "/etc/group")
                .map_err(|e| image_file("/etc/group", self.rootfs, e))?;
            self.group = Some(text.map(|t| parse_group(&t)));
        }
        Ok(self.group.as_ref().and_then(|g| g.as_deref()))
    }
}

/// An image file that could not be read: the image's fault when it is no bounded regular
/// file (it comes with the image the request names), crius's otherwise.
fn image_file(name: &str, rootfs: &std::path::Path, e: std::io::Error) -> SpecError {
    if e.kind() == std::io::ErrorKind::InvalidData {
        return SpecError::invalid(format!("the image's {name} cannot be read as users: {e}"));
    }
    SpecError::io("read", rootfs.join(name.trim_start_matches('/')), e)
}

/// Where the user string came from, for error messages.
#[derive(Clone, Copy)]
enum Origin {
    RunAsUsername,
    Image,
}

impl Origin {
    fn field(self) -> &'static str {
        match self {
            Origin::RunAsUsername => "run_as_username",
            Origin::Image => "image User",
        }
    }
}

/// Resolves the process user of a container.
///
/// Precedence (as containerd): `run_as_username`, else `run_as_user`, each optionally with
/// `run_as_group`; else the image `User` (`name`, `uid`, `name:group`, `uid:gid`); else root.
/// Without an explicit group the gid is the user's primary group from `/etc/passwd`, or 0.
/// Supplementary groups: with the `Merge` policy, the groups listing the user in `/etc/group`,
/// then `supplemental_groups`; with `Strict`, only `supplemental_groups`. The primary gid is
/// always first.
pub(crate) fn container_user(
    sc: Option<&LinuxContainerSecurityContext>,
    image_user: &str,
    rootfs: &Path,
) -> Result<User> {
    let mut db = Databases::new(rootfs);
    let run_as_group = match sc.and_then(|s| s.run_as_group.as_ref()) {
        Some(g) => Some(id_from_i64(g.value, "run_as_group")?),
        None => None,
    };
    let username = sc.map(|s| s.run_as_username.as_str()).unwrap_or("");
    let run_as_user = match sc.and_then(|s| s.run_as_user.as_ref()) {
        Some(u) => Some(id_from_i64(u.value, "run_as_user")?),
        None => None,
    };

    let (uid, mut gid, name) = if !username.is_empty() {
        let entry = lookup_user_by_name(&mut db, username, Origin::RunAsUsername)?;
        (entry.uid, entry.gid, Some(entry.name))
    } else if let Some(uid) = run_as_user {
        let (gid, name) = primary_of_uid(&mut db, uid)?;
        (uid, gid, name)
    } else if run_as_group.is_some() {
        return Err(SpecError::invalid(
            "run_as_group requires run_as_user or run_as_username",
        ));
    } else {
        resolve_user_string(&mut db, image_user.trim())?
    };
    if let Some(group) = run_as_group {
        gid = group;
    }

    let policy = sc
        .map(|s| s.supplemental_groups_policy)
        .unwrap_or(SupplementalGroupsPolicy::Merge as i32);
    let mut additional = vec![gid];
    if policy == SupplementalGroupsPolicy::Merge as i32 {
        if let Some(name) = &name {
            if let Some(groups) = db.group()? {
                for g in groups {
                    if g.name != *name && g.members.iter().any(|m| m == name) {
                        push_unique(&mut additional, g.gid);
                    }
                }
            }
        }
    } else if policy != SupplementalGroupsPolicy::Strict as i32 {
        return Err(SpecError::invalid(format!(
            "supplemental_groups_policy {policy} is unknown"
        )));
    }
    let requested = sc.map(|s| s.supplemental_groups.as_slice()).unwrap_or(&[]);
    add_supplemental_groups(&mut additional, requested)?;

    Ok(UserBuilder::default()
        .uid(uid)
        .gid(gid)
        .additional_gids(additional)
        .build()?)
}

/// Resolves an image `User` string: empty means root.
fn resolve_user_string(db: &mut Databases<'_>, user: &str) -> Result<(u32, u32, Option<String>)> {
    if user.is_empty() {
        let (gid, name) = primary_of_uid(db, 0)?;
        return Ok((0, gid, name));
    }
    let (user_part, group_part) = match user.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (user, None),
    };
    if user_part.is_empty() || group_part.is_some_and(|g| g.is_empty() || g.contains(':')) {
        return Err(SpecError::invalid(format!(
            "image User {user} is not valid"
        )));
    }
    let (uid, primary, name) = match parse_id(user_part) {
        Some(uid) => {
            let (gid, name) = primary_of_uid(db, uid)?;
            (uid, gid, name)
        }
        None => {
            let entry = lookup_user_by_name(db, user_part, Origin::Image)?;
            (entry.uid, entry.gid, Some(entry.name))
        }
    };
    let gid = match group_part {
        None => primary,
        Some(g) => match parse_id(g) {
            Some(gid) => gid,
            None => {
                let groups = db.group()?.unwrap_or(&[]);
                groups
                    .iter()
                    .find(|e| e.name == g)
                    .map(|e| e.gid)
                    .ok_or_else(|| {
                        SpecError::invalid(format!(
                            "image User {user}: group {g} not found in /etc/group of the image"
                        ))
                    })?
            }
        },
    };
    Ok((uid, gid, name))
}

fn lookup_user_by_name(db: &mut Databases<'_>, name: &str, origin: Origin) -> Result<PasswdEntry> {
    db.passwd()?
        .and_then(|users| users.iter().find(|u| u.name == name).cloned())
        .ok_or_else(|| {
            SpecError::invalid(format!(
                "{} {name} not found in /etc/passwd of the image",
                origin.field()
            ))
        })
}

/// The primary gid and name of a uid; (0, None) when /etc/passwd has no such user.
fn primary_of_uid(db: &mut Databases<'_>, uid: u32) -> Result<(u32, Option<String>)> {
    Ok(db
        .passwd()?
        .and_then(|users| users.iter().find(|u| u.uid == uid))
        .map(|u| (u.gid, Some(u.name.clone())))
        .unwrap_or((0, None)))
}

/// A decimal id within 0..=i32::MAX, as Docker and containerd accept.
fn parse_id(text: &str) -> Option<u32> {
    if !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse::<u32>().ok().filter(|v| *v <= i32::MAX as u32)
}

fn id_from_i64(value: i64, field: &str) -> Result<u32> {
    u32::try_from(value)
        .ok()
        .filter(|v| *v <= i32::MAX as u32)
        .ok_or_else(|| SpecError::invalid(format!("{field} {value} is out of range")))
}

/// Linux's limit on a process's supplementary groups (`NGROUPS_MAX`).
const NGROUPS_MAX: usize = 65536;

/// Appends the `supplemental_groups` a request asks for to `groups`, each once, in order;
/// refused beyond what a process can have.
fn add_supplemental_groups(groups: &mut Vec<u32>, requested: &[i64]) -> Result<()> {
    if requested.len() > NGROUPS_MAX {
        return Err(SpecError::invalid(format!(
            "supplemental_groups: {} groups; a process has at most {NGROUPS_MAX}",
            requested.len()
        )));
    }
    let mut seen: std::collections::HashSet<u32> = groups.iter().copied().collect();
    for g in requested {
        let g = id_from_i64(*g, "supplemental_groups")?;
        if seen.insert(g) {
            groups.push(g);
        }
    }
    if groups.len() > NGROUPS_MAX {
        return Err(SpecError::invalid(format!(
            "supplemental_groups: {} groups with the user's own; a process has at most \
             {NGROUPS_MAX}",
            groups.len()
        )));
    }
    Ok(())
}

fn push_unique(list: &mut Vec<u32>, value: u32) {
    if !list.contains(&value) {
        list.push(value);
    }
}

/// The pause container's user: the pod's `run_as_user`/`run_as_group`, numeric only (its rootfs
/// is empty, there is no /etc/passwd), else root.
pub(crate) fn sandbox_user(
    run_as_user: Option<i64>,
    run_as_group: Option<i64>,
    supplemental_groups: &[i64],
) -> Result<User> {
    let uid = run_as_user
        .map(|u| id_from_i64(u, "run_as_user"))
        .transpose()?
        .unwrap_or(0);
    let gid = run_as_group
        .map(|g| id_from_i64(g, "run_as_group"))
        .transpose()?
        .unwrap_or(0);
    let mut additional = vec![gid];
    add_supplemental_groups(&mut additional, supplemental_groups)?;
    Ok(UserBuilder::default()
        .uid(uid)
        .gid(gid)
        .additional_gids(additional)
        .build()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crius_api::v1::Int64Value;

    fn rootfs() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("etc")).unwrap();
        std::fs::write(
            dir.path().join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/sh\nalice:x:1000:1000::/home/alice:/bin/sh\nbob:x:1001:100::/:/bin/sh\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("etc/group"),
            "root:x:0:\nusers:x:100:\nalice:x:1000:alice\nwheel:x:10:alice,bob\naudio:x:29:alice\nstaff:x:50:bob\n",
        )
        .unwrap();
        dir
    }

    fn ids(user: &User) -> (u32, u32, Vec<u32>) {
        (
            user.uid(),
            user.gid(),
            user.additional_gids().clone().unwrap_or_default(),
        )
    }

    #[test]
    fn image_user_forms() {
        let dir = rootfs();
        let r = dir.path();
        assert_eq!(ids(&container_user(None, "", r).unwrap()), (0, 0, vec![0]));
        assert_eq!(
            ids(&container_user(None, "alice", r).unwrap()),
            (1000, 1000, vec![1000, 10, 29])
        );
        assert_eq!(
            ids(&container_user(None, "1001", r).unwrap()),
            (1001, 100, vec![100, 10, 50])
        );
        assert_eq!(
            ids(&container_user(None, "bob:wheel", r).unwrap()),
            (1001, 10, vec![10, 50])
        );
        assert_eq!(
            ids(&container_user(None, "4242:4343", r).unwrap()),
            (4242, 4343, vec![4343])
        );
        // an unknown uid runs with gid 0
        assert_eq!(
            ids(&container_user(None, "4242", r).unwrap()),
            (4242, 0, vec![0])
        );
        let err = container_user(None, "carol", r).unwrap_err();
        assert!(err.is_invalid_argument());
        assert_eq!(
            err.to_string(),
            "image User carol not found in /etc/passwd of the image"
        );
        let err = container_user(None, "alice:nogroup", r).unwrap_err();
        assert!(err.to_string().contains("group nogroup not found"));
    }

    #[test]
    fn security_context_overrides_image() {
        let dir = rootfs();
        let r = dir.path();
        let sc = LinuxContainerSecurityContext {
            run_as_username: "alice".into(),
            supplemental_groups: vec![5000],
            ..Default::default()
        };
        assert_eq!(
            ids(&container_user(Some(&sc), "bob", r).unwrap()),
            (1000, 1000, vec![1000, 10, 29, 5000])
        );
        let sc = LinuxContainerSecurityContext {
            run_as_user: Some(Int64Value { value: 1001 }),
            run_as_group: Some(Int64Value { value: 3000 }),
            ..Default::default()
        };
        assert_eq!(
            ids(&container_user(Some(&sc), "alice", r).unwrap()),
            (1001, 3000, vec![3000, 10, 50])
        );
        let sc = LinuxContainerSecurityContext {
            run_as_username: "mallory".into(),
            ..Default::default()
        };
        let err = container_user(Some(&sc), "", r).unwrap_err();
        assert_eq!(
            err.to_string(),
            "run_as_username mallory not found in /etc/passwd of the image"
        );
        let sc = LinuxContainerSecurityContext {
            run_as_group: Some(Int64Value { value: 3000 }),
            ..Default::default()
        };
        assert!(container_user(Some(&sc), "", r)
            .unwrap_err()
            .is_invalid_argument());
        let sc = LinuxContainerSecurityContext {
            run_as_user: Some(Int64Value { value: -1 }),
            ..Default::default()
        };
        assert!(container_user(Some(&sc), "", r)
            .unwrap_err()
            .to_string()
            .contains("run_as_user -1 is out of range"));
    }

    #[test]
    fn strict_policy_ignores_etc_group() {
        let dir = rootfs();
        let sc = LinuxContainerSecurityContext {
            run_as_user: Some(Int64Value { value: 1000 }),
            supplemental_groups: vec![5000, 1000],
            supplemental_groups_policy: SupplementalGroupsPolicy::Strict as i32,
            ..Default::default()
        };
        assert_eq!(
            ids(&container_user(Some(&sc), "", dir.path()).unwrap()),
            (1000, 1000, vec![1000, 5000])
        );
    }

    #[test]
    fn image_without_passwd() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            ids(&container_user(None, "65534", dir.path()).unwrap()),
            (65534, 0, vec![0])
        );
        assert!(container_user(None, "nobody", dir.path())
            .unwrap_err()
            .is_invalid_argument());
    }

    #[test]
    fn passwd_symlinked_out_of_the_rootfs_stays_inside() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("etc")).unwrap();
        // points at the host's /etc/passwd if followed naively; resolved inside it is missing
        std::os::unix::fs::symlink("/../../../../etc/os-release", dir.path().join("etc/passwd"))
            .unwrap();
        assert!(container_user(None, "root", dir.path())
            .unwrap_err()
            .is_invalid_argument());
    }
}
