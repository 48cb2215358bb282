//! Writes to cgroup files that can be undone, so that a refused update leaves the old limits.

use std::path::PathBuf;

use super::{write_file, CgroupError, Result};

/// Writes to cgroup files that can be undone: each file's old content is read before its
/// first write, and [`Transaction::rollback`] writes those back, newest first (so a v1 memory
/// limit and memsw limit are restored in an order the kernel accepts).
#[derive(Debug, Default)]
pub(crate) struct Transaction {
    /// Each file written and its old content, oldest first.
    pub(super) undo: Vec<(PathBuf, String)>,
}

impl Transaction {
    /// Writes `value` to `path`; the error names both.
    pub(crate) fn write(&mut self, path: PathBuf, value: &str) -> Result<()> {
        // A file that cannot be read (write-only, e.g. memory.reclaim) has nothing to restore.
        let old = std::fs::read_to_string(&path).ok();
        write_file(&path, value).map_err(|source| CgroupError::Write {
            path: path.clone(),
            value: value.to_string(),
            source,
        })?;
        if let Some(old) = old {
            self.undo
                .push((path, old.trim_end_matches('\n').to_string()));
        }
        Ok(())
    }

    /// Puts the old values back, newest first; failures are logged, the rest still restored.
    pub(crate) fn rollback(self) {
        for (path, old) in self.undo.into_iter().rev() {
            if let Err(e) = write_file(&path, &old) {
                tracing::error!(
                    "restore {} to {old:?} after a failed update: {e}",
                    path.display()
                );
            }
        }
    }
}
