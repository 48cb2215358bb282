//! Process capabilities: containerd's default set, CRI add/drop (with `ALL`), ambient
//! capabilities and privileged containers.

use std::str::FromStr;

use crius_api::v1::Capability as CriCapability;
use oci_spec::runtime::{Capabilities, Capability, LinuxCapabilities, LinuxCapabilitiesBuilder};

use super::error::{Result, SpecError};
use super::host::HostFacts;

/// The capabilities a container gets by default (containerd's and Docker's set).
pub(crate) const DEFAULT_CAPS: [Capability; 14] = [
    Capability::Chown,
    Capability::DacOverride,
    Capability::Fsetid,
    Capability::Fowner,
    Capability::Mknod,
    Capability::NetRaw,
    Capability::Setgid,
    Capability::Setuid,
    Capability::Setfcap,
    Capability::Setpcap,
    Capability::NetBindService,
    Capability::SysChroot,
    Capability::Kill,
    Capability::AuditWrite,
];

/// Every capability with its number (linux/capability.h), so `ALL` can be limited to what the
/// running kernel knows.
const ALL_CAPS: [(Capability, u32); 41] = [
    (Capability::Chown, 0),
    (Capability::DacOverride, 1),
    (Capability::DacReadSearch, 2),
    (Capability::Fowner, 3),
    (Capability::Fsetid, 4),
    (Capability::Kill, 5),
    (Capability::Setgid, 6),
    (Capability::Setuid, 7),
    (Capability::Setpcap, 8),
    (Capability::LinuxImmutable, 9),
    (Capability::NetBindService, 10),
    (Capability::NetBroadcast, 11),
    (Capability::NetAdmin, 12),
    (Capability::NetRaw, 13),
    (Capability::IpcLock, 14),
    (Capability::IpcOwner, 15),
    (Capability::SysModule, 16),
    (Capability::SysRawio, 17),
    (Capability::SysChroot, 18),
    (Capability::SysPtrace, 19),
    (Capability::SysPacct, 20),
    (Capability::SysAdmin, 21),
    (Capability::SysBoot, 22),
    (Capability::SysNice, 23),
    (Capability::SysResource, 24),
    (Capability::SysTime, 25),
    (Capability::SysTtyConfig, 26),
    (Capability::Mknod, 27),
    (Capability::Lease, 28),
    (Capability::AuditWrite, 29),
    (Capability::AuditControl, 30),
    (Capability::Setfcap, 31),
    (Capability::MacOverride, 32),
    (Capability::MacAdmin, 33),
    (Capability::Syslog, 34),
    (Capability::WakeAlarm, 35),
    (Capability::BlockSuspend, 36),
    (Capability::AuditRead, 37),
    (Capability::Perfmon, 38),
    (Capability::Bpf, 39),
    (Capability::CheckpointRestore, 40),
];

/// Every capability the running kernel knows (`cap_last_cap`) that crius itself holds
/// (`CapEff`), as containerd does: a container cannot be given a capability its runtime lacks
/// (where crius's root has no CAP_SYS_RESOURCE, as on some VMs and nested setups, asking for
/// it fails the create with EPERM).
pub(crate) fn all_caps(host: &HostFacts) -> Capabilities {
    ALL_CAPS
        .iter()
        .filter(|(_, n)| *n <= host.cap_last_cap && host.held_caps & (1u64 << n) != 0)
        .map(|(c, _)| *c)
        .collect()
}

/// Refuses a named capability crius does not hold itself: libcontainer would fail the create
/// with a bare "failed syscall".
fn check_held(cap: Capability, name: &str, host: &HostFacts) -> Result<Capability> {
    let known = ALL_CAPS.iter().find(|(c, _)| *c == cap).map(|(_, n)| *n);
    match known {
        Some(n) if host.held_caps & (1u64 << n) == 0 => Err(SpecError::invalid(format!(
            "capability {name} is not available: crius itself does not hold it on this node"
        ))),
        _ => Ok(cap),
    }
}

/// Parses a CRI capability name: case-insensitive, with or without the `CAP_` prefix.
pub(crate) fn parse_cap(name: &str) -> Result<Capability> {
    let upper = name.trim().to_ascii_uppercase();
    let bare = upper.strip_prefix("CAP_").unwrap_or(&upper);
    Capability::from_str(bare)
        .map_err(|_| SpecError::invalid(format!("capability {name} is unknown")))
}

fn is_all(name: &str) -> bool {
    name.trim().eq_ignore_ascii_case("ALL")
}

/// The capability sets of a container process.
///
/// Starts from [`DEFAULT_CAPS`] in bounding, effective and permitted (inheritable and ambient
/// empty); `ALL` in the add list grants every capability, `ALL` in the drop list removes every
/// one; then named capabilities are added, then named ones dropped. `add_ambient_capabilities`
/// go into every set including ambient and inheritable (the kernel keeps an ambient
/// capability only when it is permitted and inheritable). Privileged containers get every
/// capability whatever the lists say.
pub(crate) fn container_caps(
    caps: Option<&CriCapability>,
    privileged: bool,
    host: &HostFacts,
) -> Result<LinuxCapabilities> {
    if privileged {
        let all = all_caps(host);
        return sets(all.clone(), Capabilities::new(), Capabilities::new());
    }
    let mut main: Capabilities = DEFAULT_CAPS.iter().copied().collect();
    let mut ambient = Capabilities::new();
    if let Some(caps) = caps {
        if caps.add_capabilities.iter().any(|c| is_all(c)) {
            main = all_caps(host);
        }
        if caps.drop_capabilities.iter().any(|c| is_all(c)) {
            main.clear();
        }
        for name in caps.add_capabilities.iter().filter(|c| !is_all(c)) {
            main.insert(check_held(parse_cap(name)?, name, host)?);
        }
        for name in caps.drop_capabilities.iter().filter(|c| !is_all(c)) {
            main.remove(&parse_cap(name)?);
        }
        for name in &caps.add_ambient_capabilities {
            if is_all(name) {
                return Err(SpecError::invalid(
                    "add_ambient_capabilities ALL is not supported: name the capabilities",
                ));
            }
            let cap = check_held(parse_cap(name)?, name, host)?;
            main.insert(cap);
            ambient.insert(cap);
        }
    }
    let inheritable = ambient.clone();
    sets(main, inheritable, ambient)
}

fn sets(
    main: Capabilities,
    inheritable: Capabilities,
    ambient: Capabilities,
) -> Result<LinuxCapabilities> {
    Ok(LinuxCapabilitiesBuilder::default()
        .bounding(main.clone())
        .effective(main.clone())
        .permitted(main)
        .inheritable(inheritable)
        .ambient(ambient)
        .build()?)
}

/// The default set, for the pause container.
pub(crate) fn default_caps() -> Result<LinuxCapabilities> {
    sets(
        DEFAULT_CAPS.iter().copied().collect(),
        Capabilities::new(),
        Capabilities::new(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node where crius holds every capability of a 5.9+ kernel.
    fn host() -> HostFacts {
        HostFacts::for_tests()
    }

    fn cri(add: &[&str], drop: &[&str], ambient: &[&str]) -> CriCapability {
        CriCapability {
            add_capabilities: add.iter().map(|s| s.to_string()).collect(),
            drop_capabilities: drop.iter().map(|s| s.to_string()).collect(),
            add_ambient_capabilities: ambient.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn default_set_is_containerds() {
        let caps = container_caps(None, false, &host()).unwrap();
        let bounding = caps.bounding().clone().unwrap();
        assert_eq!(bounding.len(), 14);
        assert!(bounding.contains(&Capability::NetRaw));
        assert!(!bounding.contains(&Capability::SysAdmin));
        assert_eq!(caps.effective(), caps.bounding());
        assert_eq!(caps.permitted(), caps.bounding());
        assert!(caps.inheritable().clone().unwrap().is_empty());
        assert!(caps.ambient().clone().unwrap().is_empty());
    }

    #[test]
    fn add_and_drop_accept_any_case_and_prefix() {
        let caps = container_caps(
            Some(&cri(
                &["sys_admin", "CAP_NET_ADMIN"],
                &["Cap_Chown", "kill"],
                &[],
            )),
            false,
            &host(),
        )
        .unwrap();
        let set = caps.effective().clone().unwrap();
        assert!(set.contains(&Capability::SysAdmin));
        assert!(set.contains(&Capability::NetAdmin));
        assert!(!set.contains(&Capability::Chown));
        assert!(!set.contains(&Capability::Kill));
        assert_eq!(set.len(), 14);
    }

    #[test]
    fn all_in_drop_then_add_named() {
        let caps = container_caps(
            Some(&cri(&["NET_BIND_SERVICE"], &["ALL"], &[])),
            false,
            &host(),
        )
        .unwrap();
        let set = caps.bounding().clone().unwrap();
        assert_eq!(set.len(), 1);
        assert!(set.contains(&Capability::NetBindService));

        let caps =
            container_caps(Some(&cri(&["all"], &["SYS_ADMIN"], &[])), false, &host()).unwrap();
        let set = caps.permitted().clone().unwrap();
        assert!(set.contains(&Capability::SysPtrace));
        assert!(!set.contains(&Capability::SysAdmin));
        assert_eq!(set.len(), all_caps(&host()).len() - 1);
    }

    #[test]
    fn ambient_goes_everywhere() {
        let caps = container_caps(Some(&cri(&[], &[], &["NET_ADMIN"])), false, &host()).unwrap();
        for set in [
            caps.bounding(),
            caps.effective(),
            caps.permitted(),
            caps.inheritable(),
            caps.ambient(),
        ] {
            assert!(set.clone().unwrap().contains(&Capability::NetAdmin));
        }
    }

    #[test]
    fn unknown_capability_is_invalid() {
        let err = container_caps(Some(&cri(&["FLY"], &[], &[])), false, &host()).unwrap_err();
        assert!(err.is_invalid_argument());
        assert_eq!(err.to_string(), "capability FLY is unknown");
    }

    #[test]
    fn privileged_gets_everything() {
        let caps = container_caps(Some(&cri(&[], &["ALL"], &[])), true, &host()).unwrap();
        assert_eq!(caps.bounding().clone().unwrap(), all_caps(&host()));
        assert!(caps
            .bounding()
            .clone()
            .unwrap()
            .contains(&Capability::SysAdmin));
    }

    #[test]
    fn only_the_caps_crius_holds_and_the_kernel_knows() {
        // crius holds CHOWN (0) and SYS_ADMIN (21); the kernel knows up to SYSLOG (34)
        let node = HostFacts {
            cap_last_cap: 34,
            held_caps: 1 | 1 << 21 | 1 << 38,
            ..HostFacts::for_tests()
        };
        let all = all_caps(&node);
        assert_eq!(all.len(), 2, "{all:?}");
        assert!(all.contains(&Capability::SysAdmin));
        let err = container_caps(Some(&cri(&["NET_ADMIN"], &[], &[])), false, &node).unwrap_err();
        assert!(err.is_invalid_argument());
        assert!(err.to_string().contains("does not hold it"), "{err}");
        let caps = container_caps(None, true, &node).unwrap();
        assert_eq!(caps.bounding().clone().unwrap(), all);
    }
}
