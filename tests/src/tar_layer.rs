//! Deterministic layer tarballs: fixed owners, modes and mtimes, gzip without a timestamp, so the
//! same inputs always give the same digests.

use std::io::Write;

use flate2::write::GzEncoder;
use flate2::Compression;
use sha2::{Digest, Sha256};

use crate::{sha256_digest, Error, Result};

/// The mtime of every entry (2023-11-14T22:13:20Z).
const MTIME: u64 = 1_700_000_000;

/// A built layer: the gzip blob as pushed and the digests that name it.
#[derive(Debug, Clone)]
pub struct Layer {
    /// The compressed tar, as stored in the registry.
    pub blob: Vec<u8>,
    /// `sha256:` of `blob`: the descriptor digest in the manifest.
    pub digest: String,
    /// `sha256:` of the uncompressed tar: the config's `rootfs.diff_ids` entry.
    pub diff_id: String,
}

/// Collects entries; paths are given absolute (`/bin/sh`) and stored relative (`bin/sh`).
pub(crate) struct LayerTar {
    builder: tar::Builder<Vec<u8>>,
}

impl LayerTar {
    pub(crate) fn new() -> LayerTar {
        let mut builder = tar::Builder::new(Vec::new());
        builder.mode(tar::HeaderMode::Deterministic);
        LayerTar { builder }
    }

    pub(crate) fn dir(&mut self, path: &str, mode: u32) -> Result<()> {
        self.dir_owned(path, mode, 0, 0)
    }

    pub(crate) fn dir_owned(&mut self, path: &str, mode: u32, uid: u64, gid: u64) -> Result<()> {
        let mut header = header(tar::EntryType::Directory, mode, uid, gid, 0);
        self.builder
            .append_data(&mut header, relative(path), std::io::empty())
            .map_err(|source| Error::io("add dir to layer tar", path, source))
    }

    pub(crate) fn file(&mut self, path: &str, mode: u32, content: &[u8]) -> Result<()> {
        let size = content.len() as u64;
        let mut header = header(tar::EntryType::Regular, mode, 0, 0, size);
        self.builder
            .append_data(&mut header, relative(path), content)
            .map_err(|source| Error::io("add file to layer tar", path, source))
    }

    pub(crate) fn symlink(&mut self, path: &str, target: &str) -> Result<()> {
        let mut header = header(tar::EntryType::Symlink, 0o777, 0, 0, 0);
        self.builder
            .append_link(&mut header, relative(path), target)
            .map_err(|source| Error::io("add symlink to layer tar", path, source))
    }

    /// A hard link; `target` is another entry of this layer (absolute form, like `path`).
    pub(crate) fn hardlink(&mut self, path: &str, target: &str) -> Result<()> {
        let mut header = header(tar::EntryType::Link, 0o755, 0, 0, 0);
        self.builder
            .append_link(&mut header, relative(path), relative(target))
            .map_err(|source| Error::io("add hard link to layer tar", path, source))
    }

    /// Deletes `name` of the lower layers from `dir` (an empty `.wh.<name>` file).
    pub(crate) fn whiteout(&mut self, dir: &str, name: &str) -> Result<()> {
        self.file(
            &format!("{}/.wh.{name}", dir.trim_end_matches('/')),
            0o644,
            b"",
        )
    }

    /// Hides everything the lower layers have in `dir` (`.wh..wh..opq`).
    pub(crate) fn opaque(&mut self, dir: &str) -> Result<()> {
        self.whiteout(dir, ".wh..opq")
    }

    /// Ends the archive, compresses it and computes both digests.
    pub(crate) fn finish(self) -> Result<Layer> {
        let tar = self
            .builder
            .into_inner()
            .map_err(|source| Error::io("finish layer tar", "", source))?;
        let diff_id = format!("sha256:{}", hex::encode(Sha256::digest(&tar)));
        let mut gz = GzEncoder::new(Vec::new(), Compression::default());
        gz.write_all(&tar)
            .map_err(|source| Error::io("gzip layer tar", "", source))?;
        let blob = gz
            .finish()
            .map_err(|source| Error::io("gzip layer tar", "", source))?;
        Ok(Layer {
            digest: sha256_digest(&blob),
            diff_id,
            blob,
        })
    }
}

fn header(kind: tar::EntryType, mode: u32, uid: u64, gid: u64, size: u64) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(mode);
    header.set_uid(uid);
    header.set_gid(gid);
    header.set_mtime(MTIME);
    header.set_size(size);
    header
}

fn relative(path: &str) -> &str {
    path.trim_start_matches('/')
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn layers_are_deterministic_and_readable() {
        let build = || {
            let mut tar = LayerTar::new();
            tar.dir("/tmp", 0o1777).unwrap();
            tar.file("/tmp/a", 0o644, b"hello").unwrap();
            tar.hardlink("/tmp/b", "/tmp/a").unwrap();
            tar.symlink("/tmp/c", "a").unwrap();
            tar.whiteout("/tmp", "gone").unwrap();
            tar.finish().unwrap()
        };
        let (one, two) = (build(), build());
        assert_eq!(one.digest, two.digest);
        assert_ne!(one.digest, one.diff_id);

        let mut tar = Vec::new();
        flate2::read::GzDecoder::new(&one.blob[..])
            .read_to_end(&mut tar)
            .unwrap();
        assert_eq!(one.diff_id, sha256_digest(&tar));
        let mut archive = tar::Archive::new(&tar[..]);
        let entries: Vec<(String, tar::EntryType, u32)> = archive
            .entries()
            .unwrap()
            .map(|entry| {
                let entry = entry.unwrap();
                let header = entry.header();
                (
                    entry.path().unwrap().display().to_string(),
                    header.entry_type(),
                    header.mode().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            entries,
            vec![
                ("tmp".to_owned(), tar::EntryType::Directory, 0o1777),
                ("tmp/a".to_owned(), tar::EntryType::Regular, 0o644),
                ("tmp/b".to_owned(), tar::EntryType::Link, 0o755),
                ("tmp/c".to_owned(), tar::EntryType::Symlink, 0o777),
                ("tmp/.wh.gone".to_owned(), tar::EntryType::Regular, 0o644),
            ]
        );
    }
}
