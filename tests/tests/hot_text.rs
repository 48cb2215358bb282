//! `runtime/link-hot-first`, the linker of the release daemon: a small program linked through it
//! has the functions its list names first, in the list's order, and the unlisted ones after;
//! its `--pairs` mode names symbols the way the list does; the committed list is one it reads.
//! Needs no root: rustc, cc, nm and c++filt, as any build of crius does.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crius_tests::{repo_dir, TestDir};

fn linker() -> PathBuf {
    repo_dir().join("runtime/link-hot-first")
}

/// Five functions that call each other only through `main`, so that each stays a symbol.
const PROGRAM: &str = r#"
#[inline(never)] pub fn alpha(x: u64) -> u64 { x.wrapping_mul(3).rotate_left(7) }
#[inline(never)] pub fn bravo(x: u64) -> u64 { x.wrapping_add(11).rotate_right(5) }
#[inline(never)] pub fn charlie(x: u64) -> u64 { x ^ 0x5555_aaaa }
#[inline(never)] pub fn delta(x: u64) -> u64 { x.wrapping_sub(17).swap_bytes() }
#[inline(never)] pub fn echo<T: Into<u64>>(x: T) -> u64 { x.into().count_ones() as u64 }
fn main() {
    let n = std::env::args().count() as u64;
    let v = alpha(n) ^ bravo(n) ^ charlie(n) ^ delta(n) ^ echo(n as u32) ^ echo(n as u8);
    std::process::exit((v & 1) as i32);
}
"#;

/// Builds PROGRAM through the linker with `list` as its hot-text list; the functions' addresses
/// by listed name, e.g. "hot::alpha".
fn link_with(dir: &Path, list: &str) -> HashMap<String, u64> {
    let src = dir.join("hot.rs");
    std::fs::write(&src, PROGRAM).unwrap();
    let list_path = dir.join("hot-text.txt");
    std::fs::write(&list_path, list).unwrap();
    let bin = dir.join("hot");
    let out = Command::new("rustc")
        .args([
            "--edition",
            "2021",
            "-C",
            "opt-level=2",
            "-C",
            "codegen-units=1",
        ])
        .args(["-C", "symbol-mangling-version=v0", "-C"])
        .arg(format!("linker={}", linker().display()))
        .arg("-o")
        .arg(&bin)
        .arg(&src)
        .env("CRIUS_HOT_TEXT", &list_path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "rustc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = Command::new(&bin).status().unwrap();
    assert!(status.code().is_some(), "the linked program did not run");

    let pairs = Command::new(linker())
        .arg("--pairs")
        .arg(&bin)
        .output()
        .unwrap();
    assert!(pairs.status.success(), "link-hot-first --pairs failed");
    let names: HashMap<String, String> = String::from_utf8(pairs.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .map(|(mangled, name)| (mangled.to_string(), name.to_string()))
        .collect();
    let nm = Command::new("nm")
        .arg("--defined-only")
        .arg(&bin)
        .output()
        .unwrap();
    String::from_utf8(nm.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let addr = u64::from_str_radix(f.next()?, 16).ok()?;
            let name = names.get(f.nth(1)?)?;
            name.starts_with("hot::").then(|| (name.clone(), addr))
        })
        .collect()
}

#[test]
fn listed_functions_come_first_in_the_lists_order() {
    let dir = TestDir::new("hot-text").unwrap();
    // echo's two instances are distinct names (v0 spells out the type); only one is listed.
    let at = link_with(
        dir.path(),
        "# a comment\ncrius::not::here\nhot::delta\nhot::echo::<u8>\nhot::bravo\n",
    );
    for name in ["hot::alpha", "hot::bravo", "hot::charlie", "hot::delta"] {
        assert!(at.contains_key(name), "{name} not found in {at:?}");
    }
    let hot = [at["hot::delta"], at["hot::echo::<u8>"], at["hot::bravo"]];
    assert!(
        hot.windows(2).all(|w| w[0] < w[1]),
        "listed functions out of the list's order: {at:?}"
    );
    for cold in ["hot::alpha", "hot::charlie", "hot::echo::<u32>"] {
        assert!(
            at[cold] > at["hot::bravo"],
            "{cold} (not listed) placed before a listed function: {at:?}"
        );
    }
}

#[test]
fn without_a_list_it_links_as_cc_would() {
    let dir = TestDir::new("hot-text-none").unwrap();
    let at = link_with(dir.path(), "");
    for name in [
        "hot::alpha",
        "hot::bravo",
        "hot::charlie",
        "hot::delta",
        "hot::echo::<u8>",
        "hot::echo::<u32>",
    ] {
        assert!(at.contains_key(name), "{name} not found in {at:?}");
    }
}

/// The committed list is in the form the linker matches: names as `--pairs` prints them.
#[test]
fn the_committed_list_names_functions_as_the_linker_matches_them() {
    let list = std::fs::read_to_string(repo_dir().join("runtime/hot-text.txt")).unwrap();
    let names: Vec<&str> = list.lines().filter(|l| !l.starts_with('#')).collect();
    assert!(names.len() > 1000, "only {} names", names.len());
    assert!(names.iter().all(|n| n.len() <= 120 && !n.is_empty()));
    assert!(
        names.iter().any(|n| n.starts_with("crius::")),
        "no function of crius's own"
    );
    // c++filt prints a crate's disambiguator as up to 16 hex digits in brackets after its name.
    let crate_hash = |n: &str| {
        let b = n.as_bytes();
        (1..b.len()).any(|i| {
            let after_name = b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_';
            let hex = b[i + 1..]
                .iter()
                .take_while(|c| c.is_ascii_hexdigit())
                .count();
            after_name
                && b[i] == b'['
                && (1..=16).contains(&hex)
                && b.get(i + 1 + hex) == Some(&b']')
        })
    };
    assert!(
        !names.iter().any(|n| crate_hash(n)),
        "a crate hash left in a name"
    );
}
