//! Reading corpus files: plain or gzip (detected by magic bytes, not by name), strict UTF-8 with
//! the failing line reported, CRLF and a leading BOM tolerated.

use std::io::Read;
use std::path::Path;

use flate2::read::MultiGzDecoder;

use crate::error::{DataError, Result};

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Reads a whole text file, transparently gunzipping it. `key` is the config key that named the
/// path (used in error messages).
pub fn read_text(path: &Path, key: Option<&str>) -> Result<String> {
    let io_err = |source: std::io::Error, hint: &str| DataError::Io {
        path: path.to_path_buf(),
        key: key.map(str::to_string),
        source,
        hint: hint.to_string(),
    };
    let raw = std::fs::read(path).map_err(|e| {
        let hint = if e.kind() == std::io::ErrorKind::NotFound {
            "check the path (relative paths start at the working directory); for Multi30k and \
             Tiny Shakespeare run scripts/get-data.sh to fill data/"
        } else {
            "check that the file is readable"
        };
        io_err(e, hint)
    })?;
    let bytes = if raw.starts_with(&GZIP_MAGIC) {
        let mut out = Vec::with_capacity(raw.len() * 4);
        MultiGzDecoder::new(&raw[..]).read_to_end(&mut out).map_err(|e| {
            io_err(
                e,
                "the file starts like gzip but does not decompress; it is probably truncated, re-download it",
            )
        })?;
        out
    } else {
        raw
    };
    let mut text = String::from_utf8(bytes).map_err(|e| {
        let offset = e.utf8_error().valid_up_to();
        let bytes = e.as_bytes();
        let line = 1 + bytes[..offset].iter().filter(|&&b| b == b'\n').count();
        DataError::InvalidUtf8 {
            path: path.to_path_buf(),
            line,
            byte_offset: offset,
        }
    })?;
    if text.starts_with('\u{feff}') {
        text.drain(..'\u{feff}'.len_utf8());
    }
    Ok(text)
}

/// Splits text into lines, accepting `\n` and `\r\n`; a final newline does not start an extra line.
pub fn lines(text: &str) -> Vec<&str> {
    if text.is_empty() {
        return Vec::new();
    }
    let body = text.strip_suffix('\n').unwrap_or(text);
    body.split('\n')
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .collect()
}

/// Reads a file as lines, erroring if it holds no non-blank line.
pub fn read_lines(path: &Path, key: Option<&str>) -> Result<(String, usize)> {
    let text = read_text(path, key)?;
    if text.trim().is_empty() {
        return Err(DataError::EmptyFile {
            path: path.to_path_buf(),
            key: key.map(str::to_string),
        });
    }
    let n = lines(&text).len();
    Ok((text, n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_handle_crlf_and_missing_final_newline() {
        assert_eq!(lines("a\r\nb\n"), vec!["a", "b"]);
        assert_eq!(lines("a\nb"), vec!["a", "b"]);
        assert_eq!(lines("a\n\nb\n"), vec!["a", "", "b"]);
        assert_eq!(lines(""), Vec::<&str>::new());
        assert_eq!(lines("\n"), vec![""]);
    }
}
