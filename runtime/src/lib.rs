//! crius: a Kubernetes CRI runtime. This crate is the daemon: configuration, the database, the
//! gRPC services and the pod and container lifecycle. See `docs/architecture.md` for the map.

pub mod admin;
pub mod apparmor;
pub mod authority;
pub mod boot;
pub mod cgroups;
pub mod cli;
pub mod config;
pub mod container;
pub mod cpu_rates;
pub mod daemon;
pub mod error;
pub mod events;
pub mod handlers;
pub mod heap;
pub mod layout;
pub mod logging;
pub mod mounts;
pub mod notify;
pub mod nri;
pub mod pod;
pub mod pod_cidr;
pub mod records;
pub mod reload;
pub mod server;
pub mod service;
pub mod shims;
pub mod spec;
pub mod store;
pub mod stream;
pub mod telemetry;
pub use crius_common::text_pages;
pub mod trash;
pub mod userns;
pub mod util;

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    /// The modules above `cgroups`: `error` maps cgroup errors to statuses, the others call
    /// into cgroups. cgroups using any of them would make an import circle.
    const ABOVE_CGROUPS: &[&str] = &["error", "service", "pod", "container", "daemon"];

    /// The first module of every `crate::` path in `src`: `a` for `crate::a::b`, `a` and `b`
    /// for `crate::{a::x, b}`.
    fn crate_modules(src: &str) -> Vec<&str> {
        fn is_ident(c: char) -> bool {
            c.is_ascii_alphanumeric() || c == '_'
        }
        fn ident(s: &str) -> &str {
            let s = s.trim_start();
            &s[..s.find(|c| !is_ident(c)).unwrap_or(s.len())]
        }
        let mut out = Vec::new();
        for (at, _) in src.match_indices("crate::") {
            if src[..at].ends_with(is_ident) {
                continue;
            }
            let rest = src[at + "crate::".len()..].trim_start();
            let Some(group) = rest.strip_prefix('{') else {
                out.push(ident(rest));
                continue;
            };
            let mut depth = 0;
            let mut start = 0;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        out.push(ident(&group[start..i]));
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.push(ident(&group[start..i]));
                        start = i + 1;
                    }
                    _ => {}
                }
            }
        }
        out.retain(|m| !m.is_empty());
        out
    }

    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                rust_files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    #[test]
    fn crate_paths_are_found_grouped_or_not() {
        let src = "use crate::config::CgroupDriver;\n\
                   use crate::{\n    util::excerpt,\n    error::{Error, Result},\n};\n\
                   let x = crate::daemon::Daemon::new(); // crius_crate::pod is not ours\n";
        assert_eq!(crate_modules(src), ["config", "util", "error", "daemon"]);
    }

    /// cgroups sit below the daemon's errors, services and lifecycle: they report their own
    /// errors, which `error.rs` maps, and take nothing from the modules that call them.
    #[test]
    fn cgroups_use_no_upper_layer() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/cgroups");
        let mut files = Vec::new();
        rust_files(&dir, &mut files);
        assert!(files.iter().any(|f| f.ends_with("mod.rs")), "{files:?}");
        let mut found = Vec::new();
        for file in &files {
            let src = std::fs::read_to_string(file).unwrap();
            for m in crate_modules(&src) {
                if ABOVE_CGROUPS.contains(&m) {
                    found.push(format!("{} names crate::{m}", file.display()));
                }
            }
        }
        assert!(found.is_empty(), "{found:#?}");
    }
}
