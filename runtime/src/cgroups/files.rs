//! Reading and writing single cgroup files, the errors naming the file and the value.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::Path;

use super::{CgroupError, Result};

/// One write(2) of `value` to an existing cgroup file (O_TRUNC as runc opens them, which also
/// makes the fake trees of the tests behave). An empty value is written as a newline (an empty
/// write would not reach the kernel handler).
pub(crate) fn write_file(path: &Path, value: &str) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)?;
    let data = if value.is_empty() { "\n" } else { value };
    f.write_all(data.as_bytes())
}

pub(crate) fn read_string(path: &Path) -> Result<String> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(|source| CgroupError::Read {
            path: path.to_path_buf(),
            source,
        })
}

/// The content of a file that may be missing (a controller the kernel lacks).
pub(crate) fn read_optional(path: &Path) -> Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(s) => Ok(Some(s.trim().to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(CgroupError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

pub(crate) fn parse<T: std::str::FromStr>(path: &Path, text: &str) -> Result<T> {
    text.trim().parse().map_err(|_| CgroupError::Parse {
        path: path.to_path_buf(),
        value: text.to_string(),
    })
}

pub(crate) fn read_u64(path: &Path) -> Result<u64> {
    parse(path, &read_string(path)?)
}

pub(crate) fn read_u64_optional(path: &Path) -> Result<Option<u64>> {
    read_optional(path)?.map(|t| parse(path, &t)).transpose()
}

/// A "flat keyed" file (`memory.stat`, `cpu.stat`, `memory.events`): `key value` per line.
/// Lines whose value is not a number are skipped.
pub(crate) fn flat_keyed(text: &str) -> HashMap<&str, u64> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k, v.trim().parse().ok()?))
        })
        .collect()
}
