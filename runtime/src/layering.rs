//! A check of the crate's layering. The Daemon struct (`daemon.rs`) stands on the modules it
//! holds (records, store, shims, cgroups, streaming, …); the domain modules (`container/`,
//! `pod/`) implement the lifecycle as methods on it, and the CRI services (`service/`) call
//! those. So each file imports only files below it:
//! - a lower layer ([`LOWER`]) names none of [`UPPER`], and `cgroups/` not `error.rs`
//!   (which maps cgroup errors to statuses);
//! - no file imports a file that imports it back, directly or round a circle.
//!
//! It reads `src/**/*.rs` as text, which is what keeps it small, and that is also its limits:
//! - it sees paths written `crate::…`, `super::…`, `self::…` and, in code (not in `use`), a
//!   bare `child::…` of the file's own child modules; `use` trees with groups, `self` and
//!   `as`; a glob (`use x::*`) counts as `x`;
//! - a path names the deepest file on it: `crate::container::ContainerRecord` is
//!   `container/mod.rs`, though that file only hands it on from `records.rs` (a re-export
//!   counts as an import of the re-exporting file, as a reader sees it);
//! - a file and its own parent module's file (`stream/session.rs`, `stream/mod.rs`) are not
//!   taken to import each other: the parent declares its children and hands their names on,
//!   the children share its items (`super::StreamError`);
//! - `//` comments (doc comments included) and `#[cfg(test)]` modules written inline are
//!   skipped, as are `tests.rs` files: tests may reach anywhere;
//! - a path in a string or a block comment counts; macros that build paths, `#[path]` and
//!   modules declared inline (`mod x { … }`, their paths count for the file) are not looked
//!   at.
//!
//! `lib.rs` (which declares every module), `main.rs` (the binary's own crate) and this file
//! are left out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Layers below the daemon and the lifecycle: the daemon holds them, the lifecycle and the
/// services call them, and they call none of those.
const LOWER: &[&str] = &[
    "apparmor",
    "authority",
    "boot",
    "cgroups",
    "config",
    "cpu_rates",
    "error",
    "events",
    "handlers",
    "heap",
    "layout",
    "logging",
    "mounts",
    "notify",
    "lanes",
    "records",
    "shims",
    "spec",
    "store",
    "stream",
    "trash",
    "userns",
    "util",
];

/// What a lower layer must not name: the CRI services, the lifecycle and the daemon.
const UPPER: &[&str] = &["service", "pod", "container", "daemon"];

/// A module's path from the crate root: `["cgroups", "driver"]`; the root is `[]`.
type Module = Vec<String>;

/// For each file (by module), the files it imports, each with the first path that does it.
type Graph = BTreeMap<Module, BTreeMap<Module, String>>;

/// The paths a file names, absolute, each with how it was written.
type Named = Vec<(Module, String)>;

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Code lines of `text`: `//` comments and inline `#[cfg(test)] mod … { … }` dropped.
fn code_of(text: &str) -> String {
    let mut out = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim();
        if trimmed.starts_with("//") {
            continue;
        }
        let test_mod = trimmed == "#[cfg(test)]"
            && lines.peek().is_some_and(|next| {
                let next = next.trim();
                (next.starts_with("mod ") || next.starts_with("pub mod ")) && next.ends_with('{')
            });
        if test_mod {
            let mut depth = 0i32;
            for line in lines.by_ref() {
                depth += line.matches('{').count() as i32 - line.matches('}').count() as i32;
                if depth <= 0 {
                    break;
                }
            }
            continue;
        }
        // A trailing comment, where the `//` is outside a string (`"http://"`).
        let code = match line
            .match_indices(" //")
            .find(|(at, _)| line[..*at].matches('"').count() % 2 == 0)
        {
            Some((at, _)) => &line[..at],
            None => line,
        };
        out.push(code);
    }
    out.join("\n")
}

#[derive(Debug, PartialEq)]
enum Token {
    Ident(String),
    Colons,
    Open,
    Close,
    Comma,
    Star,
}

fn tokens(tree: &str) -> Vec<Token> {
    let mut out = Vec::new();
    let mut chars = tree.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        match c {
            ':' if chars.peek().is_some_and(|(_, n)| *n == ':') => {
                chars.next();
                out.push(Token::Colons);
            }
            '{' => out.push(Token::Open),
            '}' => out.push(Token::Close),
            ',' => out.push(Token::Comma),
            '*' => out.push(Token::Star),
            c if is_ident(c) => {
                let mut end = at + c.len_utf8();
                while let Some((i, n)) = chars.peek().copied() {
                    if !is_ident(n) {
                        break;
                    }
                    end = i + n.len_utf8();
                    chars.next();
                }
                out.push(Token::Ident(tree[at..end].to_string()));
            }
            _ => {}
        }
    }
    out
}

/// The paths of a `use` tree's leaves: `a::{b, c::{self, D as E}}` is `a::b`, `a::c`,
/// `a::c::D`; a glob's path is its module's.
fn use_leaves(tree: &str) -> Vec<Vec<String>> {
    fn walk(t: &[Token], at: &mut usize, prefix: &[String], out: &mut Vec<Vec<String>>) {
        let mut path = prefix.to_vec();
        while let Some(token) = t.get(*at) {
            *at += 1;
            match token {
                Token::Colons => {}
                Token::Star => {
                    out.push(path);
                    return;
                }
                Token::Open => {
                    loop {
                        walk(t, at, &path, out);
                        match t.get(*at) {
                            Some(Token::Comma) => *at += 1,
                            Some(Token::Close) => {
                                *at += 1;
                                break;
                            }
                            _ => break,
                        }
                        if t.get(*at) == Some(&Token::Close) {
                            *at += 1; // a trailing comma
                            break;
                        }
                    }
                    return;
                }
                Token::Ident(name) => {
                    if name != "self" || path.is_empty() {
                        path.push(name.clone());
                    }
                    if t.get(*at) == Some(&Token::Colons) {
                        continue;
                    }
                    if matches!(t.get(*at), Some(Token::Ident(kw)) if kw == "as") {
                        *at += 2;
                    }
                    out.push(path);
                    return;
                }
                Token::Close | Token::Comma => {
                    *at -= 1;
                    return;
                }
            }
        }
    }
    let t = tokens(tree);
    let mut out = Vec::new();
    let mut at = 0;
    while at < t.len() {
        let before = at;
        walk(&t, &mut at, &[], &mut out);
        if at == before {
            at += 1;
        }
    }
    out
}

/// `path` written in module `at` made absolute; `None` for another crate's.
fn absolute(at: &[String], path: &[String], modules: &BTreeSet<Module>) -> Option<Module> {
    let (first, rest) = path.split_first()?;
    let mut base: Module = match first.as_str() {
        "crate" => Vec::new(),
        "self" => at.to_vec(),
        "super" => at[..at.len().checked_sub(1)?].to_vec(),
        _ => {
            let mut child = at.to_vec();
            child.push(first.clone());
            return modules.contains(&child).then(|| {
                child.extend(rest.iter().cloned());
                child
            });
        }
    };
    let mut rest = rest;
    while let Some(("super", tail)) = rest.split_first().map(|(s, t)| (s.as_str(), t)) {
        base.pop();
        rest = tail;
    }
    base.extend(rest.iter().cloned());
    Some(base)
}

/// The `use` statements of `code` (their text after `use`), and the rest.
fn split_uses(code: &str) -> (Vec<String>, String) {
    let (mut uses, mut rest) = (Vec::new(), String::new());
    let mut lines = code.lines();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        let body = trimmed
            .strip_prefix("pub ")
            .or_else(|| trimmed.strip_prefix("pub(crate) "))
            .or_else(|| trimmed.strip_prefix("pub(super) "))
            .unwrap_or(trimmed)
            .strip_prefix("use ");
        let Some(body) = body else {
            rest.push_str(line);
            rest.push('\n');
            continue;
        };
        let mut statement = body.to_string();
        while !statement.contains(';') {
            let Some(next) = lines.next() else { break };
            statement.push(' ');
            statement.push_str(next);
        }
        let end = statement.find(';').unwrap_or(statement.len());
        uses.push(statement[..end].to_string());
    }
    (uses, rest)
}

/// Paths in code (not in `use`): from `crate::`, `super::`, `self::` or a child module of `at`.
fn code_paths(at: &[String], code: &str, modules: &BTreeSet<Module>) -> Vec<(Module, String)> {
    let mut out = Vec::new();
    for (i, c) in code.char_indices() {
        if !is_ident(c) || code[..i].ends_with(|p: char| is_ident(p) || p == ':' || p == '.') {
            continue;
        }
        let rest = &code[i..];
        let mut end = 0;
        let mut path = Vec::new();
        loop {
            let seg = &rest[end..];
            let len = seg.find(|c: char| !is_ident(c)).unwrap_or(seg.len());
            if len == 0 {
                break;
            }
            path.push(seg[..len].to_string());
            end += len;
            if !rest[end..].starts_with("::") {
                break;
            }
            end += 2;
        }
        if path.len() < 2 {
            continue;
        }
        let first = path[0].as_str();
        let mut child = at.to_vec();
        child.push(first.to_string());
        if matches!(first, "crate" | "super" | "self") || modules.contains(&child) {
            if let Some(abs) = absolute(at, &path, modules) {
                out.push((abs, rest[..end].trim_end_matches(':').to_string()));
            }
        }
    }
    out
}

/// The paths the file of module `at` names.
fn read(at: &[String], text: &str, modules: &BTreeSet<Module>) -> Named {
    let (uses, rest) = split_uses(&code_of(text));
    let mut named = code_paths(at, &rest, modules);
    for tree in uses {
        for path in use_leaves(&tree) {
            if let Some(abs) = absolute(at, &path, modules) {
                named.push((abs, path.join("::")));
            }
        }
    }
    named
}

/// The file `path` names: the deepest module on it.
fn file_of(path: &[String], modules: &BTreeSet<Module>) -> Module {
    let mut module = Vec::new();
    for seg in path {
        module.push(seg.clone());
        if !modules.contains(&module) {
            module.pop();
            break;
        }
    }
    module
}

/// Whether `a` is `b`'s parent module or `b` is `a`'s.
fn parent_and_child(a: &[String], b: &[String]) -> bool {
    let (short, long) = if a.len() < b.len() { (a, b) } else { (b, a) };
    long.len() == short.len() + 1 && long.starts_with(short)
}

fn graph(named: &BTreeMap<Module, Named>) -> Graph {
    let modules: BTreeSet<Module> = named.keys().cloned().collect();
    let mut graph = Graph::new();
    for (module, paths) in named {
        let imports = graph.entry(module.clone()).or_default();
        for (abs, written) in paths {
            let target = file_of(abs, &modules);
            if &target != module && !target.is_empty() && !parent_and_child(module, &target) {
                imports.entry(target).or_insert_with(|| written.clone());
            }
        }
    }
    graph
}

/// One circle of `graph` (its modules in order, the first repeated at the end), if any.
fn find_circle(graph: &Graph) -> Option<Vec<Module>> {
    fn visit(
        node: &Module,
        graph: &Graph,
        path: &mut Vec<Module>,
        done: &mut BTreeSet<Module>,
    ) -> Option<Vec<Module>> {
        if let Some(at) = path.iter().position(|p| p == node) {
            let mut circle = path[at..].to_vec();
            circle.push(node.clone());
            return Some(circle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.clone());
        for next in graph.get(node).into_iter().flat_map(|m| m.keys()) {
            if let Some(circle) = visit(next, graph, path, done) {
                return Some(circle);
            }
        }
        path.pop();
        done.insert(node.clone());
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

/// Every module of `src/` with its file (relative to `src/`) and text.
fn crate_files(src: &Path) -> BTreeMap<Module, (String, String)> {
    fn walk(dir: &Path, src: &Path, out: &mut BTreeMap<Module, (String, String)>) {
        let entries = std::fs::read_dir(dir).expect("the crate's source directories are readable");
        for entry in entries {
            let path = entry.expect("source entries are readable").path();
            if path.is_dir() {
                walk(&path, src, out);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path
                .strip_prefix(src)
                .expect("a file under src/ is under src/")
                .with_extension("");
            let mut module: Module = rel
                .iter()
                .map(|s| s.to_string_lossy().into_owned())
                .collect();
            if module.last().is_some_and(|m| m == "mod") {
                module.pop();
            }
            let top = module.len() == 1;
            let left_out = module.last().is_some_and(|m| m == "tests")
                || (top && matches!(module[0].as_str(), "lib" | "main" | "layering"));
            if left_out {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("source files are UTF-8");
            let file = path
                .strip_prefix(src)
                .expect("a file under src/ is under src/")
                .display()
                .to_string();
            out.insert(module, (file, text));
        }
    }
    let mut out = BTreeMap::new();
    walk(src, src, &mut out);
    out
}

fn named(files: &BTreeMap<Module, (String, String)>) -> BTreeMap<Module, Named> {
    let modules: BTreeSet<Module> = files.keys().cloned().collect();
    files
        .iter()
        .map(|(m, (_, text))| (m.clone(), read(m, text, &modules)))
        .collect()
}

fn the_crate() -> (BTreeMap<Module, (String, String)>, BTreeMap<Module, Named>) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = crate_files(&src);
    let named = named(&files);
    (files, named)
}

fn module(path: &str) -> Module {
    path.split("::").map(str::to_string).collect()
}

#[test]
fn lower_layers_name_no_module_above_them() {
    let (files, named) = the_crate();
    assert!(
        files.contains_key(&module("cgroups::systemd")),
        "found the crate's files"
    );
    let mut found = Vec::new();
    for (m, paths) in &named {
        if !LOWER.contains(&m[0].as_str()) {
            continue;
        }
        for (abs, written) in paths {
            let Some(top) = abs.first().map(String::as_str) else {
                continue;
            };
            if UPPER.contains(&top) || (m[0] == "cgroups" && top == "error") {
                found.push(format!("{} names {written}", files[m].0));
            }
        }
    }
    assert!(
        found.is_empty(),
        "a lower layer names a module above it:\n{}",
        found.join("\n")
    );
}

#[test]
fn no_file_imports_a_file_that_imports_it_back() {
    let (files, named) = the_crate();
    let graph = graph(&named);
    let imports = |from: &str, to: &str| graph[&module(from)].contains_key(&module(to));
    assert!(
        imports("container::create", "daemon") && imports("cgroups::systemd", "cgroups::driver"),
        "the check sees the crate's imports"
    );
    if let Some(circle) = find_circle(&graph) {
        let steps: Vec<String> = circle
            .windows(2)
            .map(|w| {
                format!(
                    "{} -> {} ({})",
                    files[&w[0]].0, files[&w[1]].0, graph[&w[0]][&w[1]]
                )
            })
            .collect();
        panic!("files import each other in a circle:\n{}", steps.join("\n"));
    }
}

#[test]
fn the_check_reads_use_trees_and_code_paths() {
    let leaves: Vec<String> =
        use_leaves("super::{dbus::{self, Value}, driver as d, *,\n    x::y::Z,}")
            .iter()
            .map(|p| p.join("::"))
            .collect();
    assert_eq!(
        leaves,
        [
            "super::dbus",
            "super::dbus::Value",
            "super::driver",
            "super",
            "super::x::y::Z"
        ]
    );
    let code = "// use crate::commented::X;\nlet a = crate::b::f(); x.stop::<T>(); c::g(); \
                other_crate::h(); // crate::trailing\n\
                #[cfg(test)]\nmod tests {\n    use crate::in_tests;\n}\n";
    let files: BTreeMap<Module, (String, String)> = [
        (
            "a",
            "pub use self::c::Y;\nuse crate::b::X;\n".to_string() + code,
        ),
        ("a::c", "use super::super::d;".to_string()),
        ("b", "use crate::a::{Y, Z};\nuse crate::d;".to_string()),
        ("d", String::new()),
        ("stop", String::new()),
    ]
    .into_iter()
    .map(|(m, t)| (module(m), (format!("{m}.rs"), t)))
    .collect();
    let named = named(&files);
    let written =
        |m: &str| -> Vec<&str> { named[&module(m)].iter().map(|(_, w)| w.as_str()).collect() };
    assert_eq!(
        written("a"),
        ["crate::b::f", "c::g", "self::c::Y", "crate::b::X"]
    );
    assert_eq!(named[&module("a::c")][0].0, module("d"));
    let graph = graph(&named);
    let imports =
        |m: &str| -> Vec<String> { graph[&module(m)].keys().map(|k| k.join("::")).collect() };
    // `a` and its child `c` are not taken to import each other.
    assert_eq!(imports("a"), ["b"]);
    assert_eq!(imports("a::c"), ["d"]);
    // `crate::a::Y` is `a`, which hands it on.
    assert_eq!(imports("b"), ["a", "d"]);
    assert_eq!(
        find_circle(&graph),
        Some(vec![module("a"), module("b"), module("a")])
    );
}
