//! Subcommands of the `crius` binary that do not serve: clients of a running crius (`crius
//! status` on the CRI socket, `crius images …` on the admin socket). `crius config default` and `crius config check` stay in `main.rs`, being a print
//! and a call into [`crate::config`].

pub mod containerd;
pub mod images;
pub mod pulls;
pub mod status;
