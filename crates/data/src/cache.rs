//! On-disk cache of token ids, so a resumed or evaluated run does not re-tokenise its corpus.
//!
//! Tokenising all of Multi30k through the HF pipeline costs a second or two on two busy cores;
//! reading the ids back costs milliseconds. The cache is keyed by a 128-bit hash of the exact
//! `tokenizer.json` and every input text, so any change to either is a miss, never stale data.
//! A missing, truncated or foreign cache file is simply a miss; writing is atomic
//! ([`write_atomic`]).
//!
//! Layout (little-endian): magic `EMBRTOK1`, key (2×u64), group count (u64), then per group:
//! sequence count (u64), that many lengths (u32), then the concatenated ids (u32).

use std::path::Path;

use ember_rng::mix64;

use crate::io::write_atomic;

const MAGIC: &[u8; 8] = b"EMBRTOK1";

/// Groups of token sequences (e.g. `[train sources, train targets, valid sources, ...]`).
pub type Groups = Vec<Vec<Vec<u32>>>;

/// Streaming 128-bit content hash (two SplitMix-finalised lanes over 8-byte words).
#[derive(Clone, Debug)]
pub struct ContentHash {
    a: u64,
    b: u64,
    len: u64,
}

impl Default for ContentHash {
    fn default() -> Self {
        Self {
            a: 0x243F_6A88_85A3_08D3,
            b: 0x1319_8A2E_0370_7344,
            len: 0,
        }
    }
}

impl ContentHash {
    pub fn new() -> Self {
        Self::default()
    }

    #[inline]
    fn word(&mut self, w: u64) {
        self.a = mix64(self.a ^ w).wrapping_add(0x9E37_79B9_7F4A_7C15);
        self.b = mix64(self.b.rotate_left(23) ^ w ^ 0xA076_1D64_78BD_642F);
    }

    /// Hashes `bytes` as one length-delimited item.
    pub fn bytes(&mut self, bytes: &[u8]) {
        self.word(bytes.len() as u64);
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.word(u64::from_le_bytes([
                c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7],
            ]));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut buf = [0u8; 8];
            buf[..rest.len()].copy_from_slice(rest);
            self.word(u64::from_le_bytes(buf) ^ ((rest.len() as u64) << 56));
        }
        self.len += 1;
    }

    pub fn str(&mut self, s: &str) {
        self.bytes(s.as_bytes());
    }

    pub fn finish(&self) -> [u64; 2] {
        [mix64(self.a ^ self.len), mix64(self.b ^ self.a.rotate_left(17))]
    }
}

/// Reads a cache file; `None` on any mismatch or damage.
pub fn load(path: &Path, key: [u64; 2]) -> Option<Groups> {
    // Only a regular file of the run's own: a FIFO or a device put in its place is a miss
    // (reading one would wait forever, or never end), and the store replaces it.
    if !std::fs::symlink_metadata(path).is_ok_and(|m| m.is_file()) {
        return None;
    }
    let bytes = crate::io::read_own(path).ok()?;
    let mut r = Reader {
        bytes: &bytes,
        pos: 0,
    };
    if r.take(8)? != MAGIC || r.u64()? != key[0] || r.u64()? != key[1] {
        return None;
    }
    let n_groups = r.u64()? as usize;
    let mut groups = Vec::with_capacity(n_groups.min(64));
    for _ in 0..n_groups {
        let n_seq = r.u64()? as usize;
        if n_seq > bytes.len() / 4 {
            return None;
        }
        let mut lens = Vec::with_capacity(n_seq);
        for _ in 0..n_seq {
            lens.push(r.u32()? as usize);
        }
        let mut group = Vec::with_capacity(n_seq);
        for len in lens {
            let raw = r.take(len.checked_mul(4)?)?;
            group.push(
                raw.chunks_exact(4)
                    .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            );
        }
        groups.push(group);
    }
    if r.pos != bytes.len() {
        return None;
    }
    Some(groups)
}

/// Writes a cache file atomically. Failure is reported but is never fatal to the caller.
pub fn store(path: &Path, key: [u64; 2], groups: &Groups) -> std::io::Result<()> {
    let total: usize = groups
        .iter()
        .flat_map(|g| g.iter().map(|s| 4 + 4 * s.len()))
        .sum();
    let mut out = Vec::with_capacity(32 + 8 * groups.len() + total);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&key[0].to_le_bytes());
    out.extend_from_slice(&key[1].to_le_bytes());
    out.extend_from_slice(&(groups.len() as u64).to_le_bytes());
    for g in groups {
        out.extend_from_slice(&(g.len() as u64).to_le_bytes());
        for s in g {
            out.extend_from_slice(&(s.len() as u32).to_le_bytes());
        }
        for s in g {
            for id in s {
                out.extend_from_slice(&id.to_le_bytes());
            }
        }
    }
    write_atomic(path, &out)
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let s = self.bytes.get(self.pos..end)?;
        self.pos = end;
        Some(s)
    }
    fn u64(&mut self) -> Option<u64> {
        let s = self.take(8)?;
        Some(u64::from_le_bytes(s.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        let s = self.take(4)?;
        Some(u32::from_le_bytes(s.try_into().ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_round_trips_and_rejects_other_keys_and_damage() {
        let dir = std::env::temp_dir().join(format!("ember-cache-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.bin");
        let groups: Groups = vec![vec![vec![1, 2, 3], vec![]], vec![vec![7; 1000]]];
        store(&path, [1, 2], &groups).unwrap();
        assert_eq!(load(&path, [1, 2]), Some(groups));
        assert_eq!(load(&path, [1, 3]), None);
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
        assert_eq!(load(&path, [1, 2]), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn hash_is_sensitive_to_item_boundaries() {
        let mut a = ContentHash::new();
        a.str("ab");
        a.str("c");
        let mut b = ContentHash::new();
        b.str("a");
        b.str("bc");
        assert_ne!(a.finish(), b.finish());
    }
}
