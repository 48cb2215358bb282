//! A check that the crate's files do not import each other in a circle: each file's module
//! may name only modules below it, so every file can be read (and changed) knowing only the
//! files it names.
//!
//! It reads `src/*.rs` as text, which is what keeps it small, and that is also its limits:
//! - it sees paths written `crate::<module>…`, `super::<module>…` (outside a nested module
//!   `super` is the crate root) and the groups `crate::{a, b::c}`, and names the crate root
//!   re-exports (`crate::Auth`) after the module `lib.rs` re-exports them from; a name
//!   brought in by a glob (`use crate::x::*`) counts as `x`, the names it brings do not;
//! - `//` comment lines (doc comments included) are skipped; a path in a string or a block
//!   comment counts, a path after code on the same line as a `//` comment counts too;
//! - a nested module's `super::` is taken as the crate root as well, which at worst reports
//!   a circle that is not there (no nested module here names a file module that way);
//! - files in subdirectories and macros that build paths are not looked at.
//!
//! `lib.rs` (which declares and re-exports every module) and this file are left out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type Graph = BTreeMap<String, BTreeSet<String>>;

/// Module names of `src/*.rs` and their text, without `lib.rs` and this file.
fn sources(src: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(src).expect("the crate's src directory is readable") {
        let path = entry.expect("src entries are readable").path();
        let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        if path.extension().is_some_and(|e| e == "rs") && !matches!(stem, "lib" | "layering") {
            let text = std::fs::read_to_string(&path).expect("source files are UTF-8");
            out.insert(stem.to_string(), text);
        }
    }
    out
}

fn ident_at(text: &str) -> &str {
    let end = text
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(text.len());
    &text[..end]
}

/// The first path segment after each `crate::` or `super::` in `code`, expanding groups.
fn first_segments(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    for prefix in ["crate::", "super::"] {
        for (at, _) in code.match_indices(prefix) {
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
                continue; // `foo_crate::`, `x::super::`
            }
            let rest = &code[at + prefix.len()..];
            match rest.strip_prefix('{') {
                Some(group) => {
                    let mut depth = 0;
                    let mut start = true;
                    for (i, c) in group.char_indices() {
                        match c {
                            '{' => depth += 1,
                            '}' if depth == 0 => break,
                            '}' => depth -= 1,
                            ',' if depth == 0 => start = true,
                            c if start && !c.is_whitespace() => {
                                start = false;
                                out.push(ident_at(&group[i..]).to_string());
                            }
                            _ => {}
                        }
                    }
                }
                None => out.push(ident_at(rest).to_string()),
            }
        }
    }
    out
}

/// Code lines of `text`: `//` comment lines dropped.
fn code_of(text: &str) -> String {
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Root re-exports of `lib.rs`: `pub use m::{A, B};` → A → m, B → m.
fn reexports(lib: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for line in code_of(lib).lines() {
        let Some(rest) = line.trim().strip_prefix("pub use ") else {
            continue;
        };
        let module = ident_at(rest);
        let names = rest[module.len()..].trim_start_matches("::");
        let names = names
            .trim_end_matches(';')
            .trim_matches(|c| c == '{' || c == '}');
        for name in names.split(',') {
            let name = name.trim();
            let name = name.rsplit(" as ").next().unwrap_or(name);
            let name = name.rsplit("::").next().unwrap_or(name);
            out.insert(name.trim().to_string(), module.to_string());
        }
    }
    out
}

fn graph(files: &BTreeMap<String, String>, reexported: &BTreeMap<String, String>) -> Graph {
    let mut graph = Graph::new();
    for (module, text) in files {
        let uses = graph.entry(module.clone()).or_default();
        for segment in first_segments(&code_of(text)) {
            let target = match reexported.get(&segment) {
                Some(m) => m.clone(),
                None => segment,
            };
            if &target != module && files.contains_key(&target) {
                uses.insert(target);
            }
        }
    }
    graph
}

/// One circle of `graph` (its modules in order, the first repeated at the end), if any.
fn find_circle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &Graph,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == node) {
            let mut circle = path[at..].to_vec();
            circle.push(node.to_string());
            return Some(circle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(circle) = visit(next, graph, path, done) {
                return Some(circle);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for node in graph.keys() {
        if let Some(circle) = visit(node, graph, &mut Vec::new(), &mut done) {
            return Some(circle);
        }
    }
    None
}

#[test]
fn no_module_names_a_module_that_names_it_back() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = sources(&src);
    assert!(files.contains_key("store"), "found the crate's files");
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("lib.rs is readable");
    let graph = graph(&files, &reexports(&lib));
    assert!(
        graph["pull"].contains("store"),
        "the check sees the crate's references: {graph:?}"
    );
    if let Some(circle) = find_circle(&graph) {
        panic!(
            "files import each other in a circle: {}",
            circle.join(" -> ")
        );
    }
}

#[test]
fn the_check_reads_paths_groups_and_reexports() {
    let code = "use crate::{digest::Digest, error::{Error, Result}};\n\
                // use crate::commented::X;\n\
                let x = super::hosts::f(crate::Auth::default());\n\
                my_crate::ignored();";
    let mut seen = first_segments(&code_of(code));
    seen.sort();
    assert_eq!(seen, ["Auth", "digest", "error", "hosts"]);
    let exports = reexports("pub use auth::Auth;\npub use store::{ImageStore, StoreConfig};");
    assert_eq!(exports["Auth"], "auth");
    assert_eq!(exports["StoreConfig"], "store");

    let files: BTreeMap<String, String> = [
        ("a", "use crate::b::X;"),
        ("b", "use crate::Y;"),
        ("c", "use crate::a;"),
        ("d", ""),
    ]
    .into_iter()
    .map(|(m, t)| (m.to_string(), t.to_string()))
    .collect();
    let exports = reexports("pub use c::Y;");
    let circle = find_circle(&graph(&files, &exports)).expect("a -> b -> c -> a is a circle");
    assert_eq!(circle, ["a", "b", "c", "a"]);
    let exports = reexports("pub use d::Y;");
    assert_eq!(find_circle(&graph(&files, &exports)), None);
}
