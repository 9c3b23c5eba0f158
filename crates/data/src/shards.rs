//! llama2.c token shards: raw little-endian `u16` token ids, no header (the `.bin` files of
//! llama2.c's TinyStories pipeline, which candle-datasets' `nlp::tinystories` also reads).
//!
//! Ember reads them itself rather than through candle-datasets: its iterator draws windows from
//! an unseeded global RNG and keeps its position private, so a run could neither be repeated nor
//! resumed. Here the shards simply become the token stream of [`crate::LmWindowBatcher`], whose
//! windows derive from the run seed and a two-integer cursor.
//!
//! `ember tokenize` writes shards with a run's tokenizer ([`tokenize_file`]): the ids are exactly
//! those Ember's `kind: text` corpus gives the same file (one `encode` of the whole file, no
//! bos/eos added), so training on the shards reproduces training on the text.

use std::path::{Path, PathBuf};

use crate::error::{DataError, Result};
use crate::io::{read_text, write_atomic};
use crate::tokenizer::Tokenizer;

/// Bytes per token id in a shard.
pub const BYTES_PER_TOKEN: usize = 2;

/// The largest vocabulary a shard can hold (ids 0..=65535).
pub const MAX_SHARD_VOCAB: usize = u16::MAX as usize + 1;

/// The token ids of one shard. `key` names the config entry (for errors).
pub fn read_shard(path: &Path, key: Option<&str>) -> Result<Vec<u32>> {
    crate::io::refuse_special_input(path, key)?;
    let bytes = crate::io::read_bytes(path).map_err(|e| DataError::Io {
        path: path.to_path_buf(),
        key: key.map(str::to_string),
        source: e,
        hint: "check the path; `ember tokenize RUN INPUT.txt OUT.bin` writes shards".into(),
    })?;
    if bytes.len() % BYTES_PER_TOKEN != 0 {
        return Err(DataError::config(
            key.unwrap_or("data.corpus"),
            format!(
                "{} has {} bytes, not a whole number of u16 token ids; the file is truncated or \
                 not a token shard",
                path.display(),
                bytes.len()
            ),
        ));
    }
    let ids: Vec<u32> = bytes
        .chunks_exact(BYTES_PER_TOKEN)
        .map(|b| u16::from_le_bytes([b[0], b[1]]) as u32)
        .collect();
    if looks_like_u32(&ids) {
        return Err(DataError::config(
            key.unwrap_or("data.corpus"),
            format!(
                "{} looks like a shard of 32-bit token ids (every second 16-bit value is 0, which \
                 would read as <pad>): Ember's shards hold 16-bit ids, as llama2.c's do. Write the \
                 ids as little-endian u16, or re-tokenise the text with `ember tokenize RUN TEXT \
                 OUT.bin`",
                path.display()
            ),
        ));
    }
    Ok(ids)
}

/// Whether 16-bit ids read from a shard are really 32-bit ids below 65,536: every odd 16-bit
/// value (the high halves) is 0 while the even ones are not all 0. A tokenizer never emits
/// `<pad>` (id 0) into text, let alone at every second position.
fn looks_like_u32(ids: &[u32]) -> bool {
    ids.len() >= 8
        && ids.len().is_multiple_of(2)
        && ids.iter().skip(1).step_by(2).all(|&id| id == 0)
        && ids.iter().step_by(2).any(|&id| id != 0)
}

/// Writes `ids` as a shard (through [`write_atomic`]: the old shard or the new, never half).
/// Errors if an id does not fit in 16 bits.
pub fn write_shard(path: &Path, ids: &[u32]) -> Result<()> {
    if let Some((i, id)) = ids.iter().enumerate().find(|(_, &id)| id > u16::MAX as u32) {
        return Err(DataError::arg(
            "ids",
            format!(
                "token {i} has id {id}, which does not fit a u16 shard (ids must be below {MAX_SHARD_VOCAB})"
            ),
        ));
    }
    let mut bytes = Vec::with_capacity(ids.len() * BYTES_PER_TOKEN);
    for &id in ids {
        bytes.extend_from_slice(&(id as u16).to_le_bytes());
    }
    let io = |e: std::io::Error| DataError::Io {
        path: path.to_path_buf(),
        key: None,
        hint: crate::io::write_hint(&e, path),
        source: e,
    };
    write_atomic(path, &bytes).map_err(io)
}

/// Tokenises the text file `input` with `tokenizer` and writes the ids to the shard `output`;
/// returns the number of tokens. Refuses a vocabulary larger than a u16 shard can hold.
pub fn tokenize_file(tokenizer: &Tokenizer, input: &Path, output: &Path) -> Result<usize> {
    tokenize_file_counting(tokenizer, input, output).map(|t| t.tokens)
}

/// What [`tokenize_file_counting`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tokenized {
    pub tokens: usize,
    /// Tokens that are `<unk>`: characters the tokenizer does not know.
    pub unknown: usize,
}

/// As [`tokenize_file`], also counting the `<unk>` tokens written.
pub fn tokenize_file_counting(tokenizer: &Tokenizer, input: &Path, output: &Path) -> Result<Tokenized> {
    if tokenizer.vocab_size() > MAX_SHARD_VOCAB {
        return Err(DataError::tokenizer(
            None,
            format!(
                "has {} tokens; llama2.c shards store u16 ids, so the vocabulary must have at most {MAX_SHARD_VOCAB}",
                tokenizer.vocab_size()
            ),
        ));
    }
    crate::io::check_output(output, &[input], "OUTPUT")?;
    let text = read_text(input, None)?;
    if text.trim().is_empty() {
        return Err(DataError::EmptyFile {
            path: input.to_path_buf(),
            key: None,
        });
    }
    let ids = tokenizer.encode(&text)?;
    write_shard(output, &ids)?;
    let unk = tokenizer.unk_id();
    Ok(Tokenized {
        tokens: ids.len(),
        unknown: ids.iter().filter(|&&id| id == unk).count(),
    })
}

/// The shard files a config entry names: the file itself, or a folder's `*.bin` files in name order.
pub fn expand(entry: &Path, key: &str) -> Result<Vec<PathBuf>> {
    if !entry.is_dir() {
        return Ok(vec![entry.to_path_buf()]);
    }
    let read = std::fs::read_dir(entry).map_err(|e| DataError::Io {
        path: entry.to_path_buf(),
        key: Some(key.to_string()),
        source: e,
        hint: "check that the folder is readable".into(),
    })?;
    let mut files: Vec<PathBuf> = read
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "bin"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(DataError::config(
            key,
            format!("{} holds no .bin shard", entry.display()),
        ));
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_write_leaves_no_temporary_file_and_says_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        // The rename fails (a folder holding a file is where the shard should go).
        let path = dir.path().join("out.bin");
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join("kept"), "x").unwrap();
        let e = write_shard(&path, &[1, 2, 3]).unwrap_err().to_string();
        assert!(
            e.contains("out.bin") && e.contains("check that the folder"),
            "{e}"
        );
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(left, ["out.bin"], "no temporary file stays behind");
        // A full disk says so, and where.
        let full = std::io::Error::from_raw_os_error(28);
        let hint = crate::io::write_hint(&full, Path::new("data/out.bin"));
        assert!(hint.contains("disk that holds data is full"), "{hint}");
    }

    #[test]
    fn shards_are_raw_little_endian_u16() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.bin");
        write_shard(&path, &[1, 258, 65535]).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), vec![1, 0, 2, 1, 255, 255]);
        assert_eq!(read_shard(&path, None).unwrap(), vec![1, 258, 65535]);
        assert!(write_shard(&path, &[65536]).is_err(), "ids above u16 are refused");
        std::fs::write(&path, [1u8, 0, 2]).unwrap();
        let e = read_shard(&path, Some("data.corpus.train_files[0]")).unwrap_err();
        assert!(e.to_string().contains("not a whole number"), "{e}");
    }

    #[test]
    fn a_shard_of_u32_ids_is_refused_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("u32.bin");
        let ids: Vec<u8> = [5u32, 9, 12, 7, 5, 3]
            .iter()
            .flat_map(|i| i.to_le_bytes())
            .collect();
        std::fs::write(&path, ids).unwrap();
        let e = read_shard(&path, Some("data.corpus.train_files[0]"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("u32.bin") && e.contains("32-bit") && e.contains("train_files[0]"),
            "{e}"
        );
        // u16 ids with an occasional 0 are fine.
        write_shard(&path, &[5, 0, 9, 0, 12, 7, 0, 3]).unwrap();
        assert_eq!(read_shard(&path, None).unwrap().len(), 8);
    }

    #[test]
    fn tokenize_refuses_to_write_over_its_input() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in.txt");
        std::fs::write(&input, "hello hello\n").unwrap();
        let tok = Tokenizer::train_chars(["hello hello\n"], false).unwrap();
        let e = tokenize_file(&tok, &input, &input).unwrap_err().to_string();
        assert!(e.contains("OUTPUT") && e.contains("in.txt"), "{e}");
        assert_eq!(std::fs::read_to_string(&input).unwrap(), "hello hello\n");
        assert!(tokenize_file(&tok, &input, Path::new("/dev/null")).is_err());
    }
}
