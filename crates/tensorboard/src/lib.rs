//! TensorBoard event files, written and read back: scalars only, which is all a training run
//! logs.
//!
//! Hand-written rather than taken from a crate because none fits: `tensorboard-rs` is marked
//! inactive and pins protobuf 2 and image 0.23; `tboard` needs a `protoc` binary at build time
//! and is stale; `tfrecord` is heavy and stale. What TensorBoard reads is small and stable: a
//! file of TFRecord frames ([`write_record`]) around protobuf `Event` messages ([`proto`]).
//!
//! ```text
//! record  = u64 length (LE) | u32 masked_crc32c(length bytes) | data | u32 masked_crc32c(data)
//! Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5;
//!           SessionLog session_log = 7; }
//! Summary { repeated Value value = 1; }   Value { string tag = 1; float simple_value = 2; }
//! SessionLog { SessionStatus status = 1; }   (START = 1)
//! ```
//!
//! The first record of a file is `Event { file_version: "brain.Event:2" }`. TensorBoard picks up
//! every file whose name contains `tfevents`, per directory, in name order; [`EventWriter`]
//! names a new file so that it sorts after those already there, so a resumed run appends a new
//! file and never rewrites an old one.
//!
//! ```
//! use ember_tensorboard::{proto, read_records, EventWriter};
//! # fn main() -> std::io::Result<()> {
//! let dir = std::env::temp_dir().join(format!("ember-tensorboard-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir)?;
//! let mut writer = EventWriter::create(&dir)?;
//! writer.scalars(7, ember_tensorboard::now(), &[("train/loss", 2.5)])?;
//! writer.flush()?;
//! let records = read_records(writer.path())?; // the file-version event, then ours
//! let event = proto::decode_event(&records[1]).unwrap();
//! assert_eq!((event.step, event.scalars), (7, vec![("train/loss".to_string(), 2.5)]));
//! std::fs::remove_dir_all(&dir)?;
//! # Ok(()) }
//! ```

pub mod proto;

use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// What the first event of every file says.
pub const FILE_VERSION: &str = "brain.Event:2";

/// The prefix of event file names (TensorBoard matches `tfevents` in the name).
pub const FILE_PREFIX: &str = "events.out.tfevents.";

/// CRC-32C of `data`, rotated and offset as TFRecord stores it (so that a CRC of data that
/// itself holds CRCs does not degenerate).
pub fn masked_crc32c(data: &[u8]) -> u32 {
    crc32c::crc32c(data).rotate_right(15).wrapping_add(0xA282_EAD8)
}

/// Writes one TFRecord frame around `data`.
pub fn write_record(w: &mut impl Write, data: &[u8]) -> io::Result<()> {
    let len = (data.len() as u64).to_le_bytes();
    w.write_all(&len)?;
    w.write_all(&masked_crc32c(&len).to_le_bytes())?;
    w.write_all(data)?;
    w.write_all(&masked_crc32c(data).to_le_bytes())
}

/// The records of a TFRecord file, checking both CRCs of every frame. A torn last frame (a
/// process killed mid-write) ends the list, as TensorBoard treats it; a bad CRC is an error.
pub fn read_records(path: &Path) -> io::Result<Vec<Vec<u8>>> {
    let mut bytes = Vec::new();
    File::open(path)?.read_to_end(&mut bytes)?;
    let bad = |what: &str, at: usize| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {what} at byte {at}", path.display()),
        )
    };
    let mut out = Vec::new();
    let mut at = 0;
    while bytes.len() - at >= 12 {
        let len_bytes = &bytes[at..at + 8];
        let crc = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().expect("4 bytes"));
        if crc != masked_crc32c(len_bytes) {
            return Err(bad("length CRC mismatch", at));
        }
        let len = u64::from_le_bytes(len_bytes.try_into().expect("8 bytes")) as usize;
        let start = at + 12;
        if bytes.len() - start < len.saturating_add(4) {
            break;
        }
        let data = &bytes[start..start + len];
        let crc = u32::from_le_bytes(bytes[start + len..start + len + 4].try_into().expect("4 bytes"));
        if crc != masked_crc32c(data) {
            return Err(bad("data CRC mismatch", start));
        }
        out.push(data.to_vec());
        at = start + len + 4;
    }
    Ok(out)
}

/// Seconds since the Unix epoch, as `Event.wall_time` holds them.
pub fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Appends events to a new event file of one directory (one TensorBoard run).
pub struct EventWriter {
    path: PathBuf,
    out: BufWriter<File>,
}

impl EventWriter {
    /// Creates `dir` if needed and a new event file in it, named to sort after every event file
    /// already there, and writes the file-version event.
    pub fn create(dir: &Path) -> io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let wall = now();
        let path = dir.join(new_file_name(dir, wall as u64)?);
        let file = File::options().write(true).create_new(true).open(&path)?;
        let mut writer = Self {
            path,
            out: BufWriter::new(file),
        };
        writer.event(&proto::file_version_event(wall, FILE_VERSION))?;
        writer.flush()?;
        Ok(writer)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// One event holding every `(tag, value)` at `step`. Buffered: call [`flush`](Self::flush).
    pub fn scalars(&mut self, step: i64, wall_time: f64, values: &[(&str, f32)]) -> io::Result<()> {
        self.event(&proto::scalars_event(wall_time, step, values))
    }

    /// Marks a restart at `step`: TensorBoard then drops the points at `step` and after that
    /// earlier files hold (what an interrupted process logged after its last checkpoint).
    pub fn session_start(&mut self, step: i64, wall_time: f64) -> io::Result<()> {
        self.event(&proto::session_start_event(wall_time, step))
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    fn event(&mut self, data: &[u8]) -> io::Result<()> {
        write_record(&mut self.out, data)
    }
}

/// `events.out.tfevents.{secs:010}.{host}.{pid}`, with `secs` past the timestamp of every event
/// file already in `dir`, so the new file sorts last (TensorBoard reads files in name order).
fn new_file_name(dir: &Path, now_secs: u64) -> io::Result<String> {
    let newest = std::fs::read_dir(dir)?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_prefix(FILE_PREFIX)?
                .split('.')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .max();
    let secs = match newest {
        Some(n) if n >= now_secs => n + 1,
        _ => now_secs,
    };
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().replace(['/', '.'], "-"))
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into());
    Ok(format!("{FILE_PREFIX}{secs:010}.{host}.{}", std::process::id()))
}

/// The event files of `dir`, in the order TensorBoard reads them.
pub fn event_files(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(FILE_PREFIX))
        })
        .collect();
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_matches_the_standard_check_values() {
        // CRC-32C check value (RFC 3720 / the CRC catalogue) and an iSCSI test vector.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c::crc32c(&[0u8; 32]), 0x8A91_36AA);
        // The mask as TensorFlow's crc32c::Mask defines it (rotate right 15, add 0xa282ead8);
        // the value is TensorBoard's own `masked_crc32c(b"123456789")` (tensorboard 2.21).
        assert_eq!(masked_crc32c(b"123456789"), 0xC78A_B0E5);
    }

    #[test]
    fn a_record_is_framed_with_its_length_and_two_masked_crcs() {
        let mut buf = Vec::new();
        write_record(&mut buf, b"hello").unwrap();
        assert_eq!(buf.len(), 8 + 4 + 5 + 4);
        assert_eq!(&buf[..8], &5u64.to_le_bytes());
        assert_eq!(&buf[8..12], &masked_crc32c(&5u64.to_le_bytes()).to_le_bytes());
        assert_eq!(&buf[12..17], b"hello");
        assert_eq!(&buf[17..], &masked_crc32c(b"hello").to_le_bytes());
        // The frame of the empty record, CRCs from TensorBoard's own `masked_crc32c`.
        let mut empty = Vec::new();
        write_record(&mut empty, b"").unwrap();
        assert_eq!(
            empty,
            [0, 0, 0, 0, 0, 0, 0, 0, 0x29, 0x03, 0x98, 0x07, 0xd8, 0xea, 0x82, 0xa2]
        );
    }

    #[test]
    fn files_read_back_sort_in_creation_order_and_reject_bad_crcs() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = EventWriter::create(dir.path()).unwrap();
        a.scalars(1, 10.0, &[("train/loss", 2.5), ("train/lr", 1e-3)])
            .unwrap();
        a.flush().unwrap();
        // A second writer in the same second (a quick resume) still sorts after the first.
        let mut b = EventWriter::create(dir.path()).unwrap();
        b.session_start(2, 11.0).unwrap();
        b.scalars(2, 11.0, &[("train/loss", 2.0)]).unwrap();
        b.flush().unwrap();
        assert_eq!(
            event_files(dir.path()).unwrap(),
            vec![a.path().to_path_buf(), b.path().to_path_buf()]
        );

        let records = read_records(a.path()).unwrap();
        assert_eq!(records.len(), 2);
        let first = proto::decode_event(&records[0]).unwrap();
        assert_eq!(first.file_version.as_deref(), Some(FILE_VERSION));
        let e = proto::decode_event(&records[1]).unwrap();
        assert_eq!((e.step, e.wall_time), (1, 10.0));
        assert_eq!(
            e.scalars,
            vec![("train/loss".to_string(), 2.5), ("train/lr".to_string(), 1e-3)]
        );
        let restart = proto::decode_event(&read_records(b.path()).unwrap()[1]).unwrap();
        assert_eq!((restart.step, restart.session_start), (2, true));

        // A flipped bit in the data is caught; a torn last frame is dropped.
        let mut bytes = std::fs::read(a.path()).unwrap();
        let n = bytes.len();
        bytes[n - 6] ^= 1;
        std::fs::write(a.path(), &bytes).unwrap();
        assert!(read_records(a.path()).is_err());
        bytes[n - 6] ^= 1;
        std::fs::write(a.path(), &bytes[..n - 3]).unwrap();
        assert_eq!(read_records(a.path()).unwrap().len(), 1);
    }
}
