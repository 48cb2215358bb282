//! What every crius crate needs from the file system and had written once each: replacing a
//! file atomically with an explicit durability, reading `/proc/self/mountinfo`, and removing a
//! cgroup directory tree. std only, as the shim links it.

pub mod fs;
pub mod mountinfo;
