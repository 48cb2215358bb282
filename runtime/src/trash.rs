//! Directories of removed pods and containers, deleted after the call that removed them.
//!
//! `RemoveContainer` and `RemovePodSandbox` rename a directory into the `trash` directory of the
//! same tree (`<root>/trash` or `<state>/trash`: one `rename`, same filesystem) and delete it in
//! the background, so the call does not wait for a recursive delete. A crius killed before such a
//! deletion finished empties both trash directories at its next start, so nothing is left.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Name of the trash directory under `root` and under `state`.
pub const DIR: &str = "trash";

/// The trash directory of the tree `base` (the root or the state directory).
pub fn dir(base: &Path) -> PathBuf {
    base.join(DIR)
}

/// Moves `dir` (if it exists) into `trash` and deletes it in the background. When the move is
/// not possible (another filesystem, no trash directory), `dir` is deleted here instead. The
/// caller has unmounted whatever was mounted under `dir`.
pub fn discard(trash: &Path, dir: &Path) -> Result<()> {
    let Some(name) = dir.file_name() else {
        return remove_now(dir);
    };
    let doomed = trash.join(name);
    match std::fs::rename(dir, &doomed) {
        Ok(()) => {
            delete_later(doomed);
            Ok(())
        }
        // Either `dir` is gone already, or the trash directory is missing.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !dir.exists() => Ok(()),
        Err(e) => {
            tracing::debug!(dir = %dir.display(), "move to the trash: {e}; deleting it now");
            remove_now(dir)
        }
    }
}

/// Creates the trash directory of `base` if missing and deletes, in the background, whatever a
/// crius that was killed left in it.
pub fn empty_at_start(base: &Path) -> Result<()> {
    let trash = dir(base);
    std::fs::create_dir_all(&trash)
        .map_err(|e| Error::internal(format!("create {}", trash.display()), e))?;
    let entries = std::fs::read_dir(&trash)
        .map_err(|e| Error::internal(format!("list {}", trash.display()), e))?;
    let left: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    if !left.is_empty() {
        tracing::info!(
            trash = %trash.display(),
            entries = left.len(),
            "deleting what a previous crius left in the trash"
        );
        for path in left {
            delete_later(path);
        }
    }
    Ok(())
}

fn remove_now(dir: &Path) -> Result<()> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::internal(format!("remove {}", dir.display()), e)),
    }
}

/// Deletes `path` on a blocking thread; a failure is logged (the next start tries again).
fn delete_later(path: PathBuf) {
    let delete = move || {
        let result = if path.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        match result {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(path = %path.display(), "empty the trash: {e}"),
        }
    };
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => {
            rt.spawn_blocking(delete);
        }
        Err(_) => delete(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(at: &Path) {
        std::fs::create_dir_all(at.join("a/b")).unwrap();
        std::fs::write(at.join("a/b/f"), b"x").unwrap();
    }

    async fn wait_empty(dir: &Path) {
        for _ in 0..200 {
            if std::fs::read_dir(dir).unwrap().next().is_none() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("{} not emptied", dir.display());
    }

    #[tokio::test]
    async fn a_discarded_dir_is_gone_at_once_and_deleted_from_the_trash() {
        let base = tempfile::tempdir().unwrap();
        empty_at_start(base.path()).unwrap();
        let victim = base.path().join("containers/c1");
        tree(&victim);
        discard(&dir(base.path()), &victim).unwrap();
        assert!(!victim.exists());
        wait_empty(&dir(base.path())).await;
        // a dir that is not there is no error
        discard(&dir(base.path()), &victim).unwrap();
    }

    #[tokio::test]
    async fn without_a_trash_the_dir_is_deleted_in_place() {
        let base = tempfile::tempdir().unwrap();
        let victim = base.path().join("c2");
        tree(&victim);
        discard(&dir(base.path()), &victim).unwrap();
        assert!(!victim.exists());
        assert!(!dir(base.path()).exists());
    }

    #[tokio::test]
    async fn what_a_killed_crius_left_in_the_trash_is_deleted_at_start() {
        let base = tempfile::tempdir().unwrap();
        tree(&dir(base.path()).join("old-container"));
        std::fs::write(dir(base.path()).join("stray-file"), b"y").unwrap();
        empty_at_start(base.path()).unwrap();
        wait_empty(&dir(base.path())).await;
    }
}
