//! Content digests (`sha256:<64 lowercase hex>`), the only algorithm the content store keeps.

use std::fmt;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

/// A validated `sha256:<hex>` digest.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Digest(String);

impl Digest {
    /// Parses `sha256:<64 lowercase hex>`; the error says what is wrong.
    pub fn parse(s: &str) -> std::result::Result<Self, String> {
        let (algo, hex) = s
            .split_once(':')
            .ok_or_else(|| format!("digest {s:?} has no algorithm"))?;
        if algo != "sha256" {
            return Err(format!("unsupported digest algorithm {algo:?}"));
        }
        if hex.len() != 64
            || !hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(format!("digest {s:?} is not 64 lowercase hex characters"));
        }
        Ok(Self(s.to_string()))
    }

    /// The digest of `data`.
    pub fn of(data: &[u8]) -> Self {
        Self::from_hasher(Sha256::new_with_prefix(data))
    }

    /// The digest a finished hasher computed.
    pub fn from_hasher(hasher: Sha256) -> Self {
        Self(format!("sha256:{}", hex::encode(hasher.finalize())))
    }

    /// The hex part, used as the file name in the content store.
    pub fn hex(&self) -> &str {
        &self.0["sha256:".len()..]
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for Digest {
    type Error = String;
    fn try_from(s: String) -> std::result::Result<Self, String> {
        Self::parse(&s)
    }
}

impl From<Digest> for String {
    fn from(d: Digest) -> String {
        d.0
    }
}

/// The chain IDs of a stack of layers given their diff IDs, bottom first:
/// chain(0) = diff(0), chain(n) = sha256(chain(n-1) + " " + diff(n)).
pub fn chain_ids(diff_ids: &[Digest]) -> Vec<Digest> {
    let mut out: Vec<Digest> = Vec::with_capacity(diff_ids.len());
    for diff in diff_ids {
        let next = match out.last() {
            None => diff.clone(),
            Some(parent) => Digest::of(format!("{parent} {diff}").as_bytes()),
        };
        out.push(next);
    }
    out
}

/// Whether `s` is lowercase hex, as digests and image ids are written.
pub(crate) fn is_hex(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_hex() {
        let d = Digest::of(b"");
        assert_eq!(
            d.as_str(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(d.hex().len(), 64);
        assert_eq!(Digest::parse(d.as_str()).unwrap(), d);
        assert!(Digest::parse("sha256:xyz").is_err());
        assert!(Digest::parse("sha512:00").is_err());
        assert!(Digest::parse("e3b0").is_err());
    }

    #[test]
    fn chain_ids_follow_the_oci_rule() {
        let a = Digest::of(b"a");
        let b = Digest::of(b"b");
        let chain = chain_ids(&[a.clone(), b.clone()]);
        assert_eq!(chain[0], a);
        assert_eq!(chain[1], Digest::of(format!("{a} {b}").as_bytes()));
        assert!(chain_ids(&[]).is_empty());
    }
}
