//! The freezer: stopping every task of a cgroup (CheckpointPod) and letting them go again.

use std::path::PathBuf;

use super::{Hierarchy, Mode, Result};

/// Where the freezer is with a cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreezerState {
    Thawed,
    /// Asked to freeze, some task not stopped yet.
    Freezing,
    Frozen,
}

impl Hierarchy {
    /// Asks the freezer to freeze or thaw the cgroup (and everything below it); see
    /// [`Hierarchy::freeze`] to wait for the freeze.
    pub fn set_frozen(&self, cgroup: &str, frozen: bool) -> Result<()> {
        match self {
            Hierarchy::V1(h) => h.set_frozen(cgroup, frozen),
            Hierarchy::V2(h) => h.set_frozen(cgroup, frozen),
        }
    }

    /// The directory of the cgroup that holds its freezer's files (what CRIU's
    /// `freeze-cgroup` names); `None` on a v1 host without the freezer.
    pub fn freezer_dir(&self, cgroup: &str) -> Option<PathBuf> {
        match self {
            Hierarchy::V1(h) => h.dir("freezer", cgroup),
            Hierarchy::V2(h) => Some(h.dir(cgroup)),
        }
    }

    pub fn freezer_state(&self, cgroup: &str) -> Result<FreezerState> {
        match self {
            Hierarchy::V1(h) => h.freezer_state(cgroup),
            Hierarchy::V2(h) => h.freezer_state(cgroup),
        }
    }

    /// Freezes the cgroup and waits until every task in it is frozen, at most until `until`:
    /// true once frozen; false (and the cgroup thawed again) if it was not by then. A v1
    /// cgroup can stay `FREEZING` while a task sleeps where the freezer cannot reach it, so
    /// the freeze is asked again every 100 ms, as CRIU does.
    pub async fn freeze(&self, cgroup: &str, until: std::time::Instant) -> Result<bool> {
        const POLL: std::time::Duration = std::time::Duration::from_millis(5);
        self.set_frozen(cgroup, true)?;
        let mut round = 0u32;
        loop {
            if self.freezer_state(cgroup)? == FreezerState::Frozen {
                return Ok(true);
            }
            if std::time::Instant::now() >= until {
                self.set_frozen(cgroup, false)?;
                return Ok(false);
            }
            round += 1;
            if round.is_multiple_of(20) && self.mode() == Mode::V1 {
                self.set_frozen(cgroup, true)?;
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::cgroups::{v1, v2, CgroupError};

    #[tokio::test]
    async fn the_freezer_is_asked_and_read_on_v1_and_v2() {
        let dir = tempfile::tempdir().unwrap();
        let freezer = dir.path().join("freezer");
        std::fs::create_dir_all(freezer.join("crius/p/c")).unwrap();
        let state = freezer.join("crius/p/c/freezer.state");
        std::fs::write(&state, "THAWED\n").unwrap();
        let v1 = Hierarchy::V1(v1::V1::new(HashMap::from([(
            "freezer".to_string(),
            freezer.clone(),
        )])));
        assert_eq!(
            v1.freezer_dir("/crius/p/c"),
            Some(freezer.join("crius/p/c"))
        );
        assert_eq!(
            v1.freezer_state("/crius/p/c").unwrap(),
            FreezerState::Thawed
        );
        // A plain file echoes what was asked: FROZEN at once.
        let soon = std::time::Instant::now() + std::time::Duration::from_secs(1);
        assert!(v1.freeze("/crius/p/c", soon).await.unwrap());
        assert_eq!(std::fs::read_to_string(&state).unwrap(), "FROZEN");
        v1.set_frozen("/crius/p/c", false).unwrap();
        assert_eq!(
            v1.freezer_state("/crius/p/c").unwrap(),
            FreezerState::Thawed
        );
        std::fs::write(&state, "FREEZING").unwrap();
        assert_eq!(
            v1.freezer_state("/crius/p/c").unwrap(),
            FreezerState::Freezing
        );
        let none = Hierarchy::V1(v1::V1::new(HashMap::new()));
        assert!(matches!(
            none.set_frozen("/crius/p/c", true),
            Err(CgroupError::NoController("freezer"))
        ));

        let root = dir.path().join("unified");
        let c = root.join("crius/p/c");
        std::fs::create_dir_all(&c).unwrap();
        std::fs::write(c.join("cgroup.freeze"), "0\n").unwrap();
        std::fs::write(c.join("cgroup.events"), "populated 1\nfrozen 0\n").unwrap();
        let v2 = Hierarchy::V2(v2::V2::new(&root));
        assert_eq!(
            v2.freezer_state("/crius/p/c").unwrap(),
            FreezerState::Thawed
        );
        v2.set_frozen("/crius/p/c", true).unwrap();
        assert_eq!(
            v2.freezer_state("/crius/p/c").unwrap(),
            FreezerState::Freezing
        );
        // Never frozen (nothing updates cgroup.events here): given up, and thawed again.
        let now = std::time::Instant::now() + std::time::Duration::from_millis(30);
        assert!(!v2.freeze("/crius/p/c", now).await.unwrap());
        assert_eq!(
            std::fs::read_to_string(c.join("cgroup.freeze")).unwrap(),
            "0"
        );
        std::fs::write(c.join("cgroup.events"), "populated 1\nfrozen 1\n").unwrap();
        assert_eq!(
            v2.freezer_state("/crius/p/c").unwrap(),
            FreezerState::Frozen
        );
    }
}
