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
    refuse_special_input(path, key)?;
    let raw = read_bytes(path).map_err(|e| {
        let hint = if e.kind() == std::io::ErrorKind::TimedOut {
            "nothing was read"
        } else if e.kind() == std::io::ErrorKind::NotFound {
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

/// How long a FIFO given as an input (a named pipe, `<(zcat corpus.gz)`) may stay silent before
/// it is refused: a named pipe no program writes into would otherwise be waited on forever.
pub const FIFO_PATIENCE: std::time::Duration = std::time::Duration::from_secs(20);

/// What a path holds, when it is not a regular file: a FIFO is read if something writes into
/// it, anything else is never read.
fn special_kind(kind: std::fs::FileType) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_dir() {
        Some("a folder")
    } else if kind.is_char_device() || kind.is_block_device() {
        Some("a device")
    } else if kind.is_socket() {
        Some("a socket")
    } else if kind.is_fifo() {
        Some("a FIFO (named pipe)")
    } else {
        None
    }
}

/// What [`open_checked`] does with a FIFO.
#[derive(Clone, Copy)]
enum Fifo {
    /// Waits this long for its first bytes, then reads it as it comes.
    Wait(std::time::Duration),
    /// Refuses it, saying why this file must be a regular one.
    Refuse(&'static str),
}

/// The one way Ember opens a file to read it: without blocking (so a FIFO nothing writes into,
/// or one put in a file's place after a check, cannot hang the open), then judged by what was
/// opened (`fstat`, not the name): a regular file is read, a FIFO as `fifo` says, and a folder,
/// device or socket is refused with an error that says what it is. The returned file reads as
/// usual (blocking). Errors say what the path is, not the path: callers name the file.
fn open_checked(path: &Path, fifo: Fifo) -> std::io::Result<std::fs::File> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let refuse = |what: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, what);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            // open(2) of a socket.
            Some(libc::ENXIO) => refuse("it is a socket, not a file".into()),
            _ => e,
        })?;
    let kind = file.metadata()?.file_type();
    match (special_kind(kind), fifo) {
        (None, _) => {}
        (Some(_), Fifo::Wait(patience)) if kind_is_fifo(kind) => wait_for_data(&file, patience)?,
        (Some(what), Fifo::Refuse(why)) if kind_is_fifo(kind) => {
            return Err(refuse(format!("it is {what}, not a regular file: {why}")))
        }
        (Some(what), _) => return Err(refuse(format!("it is {what}, not a file"))),
    }
    // SAFETY: fcntl on the descriptor owned by `file`: back to blocking reads.
    unsafe {
        let fd = file.as_raw_fd();
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK);
        }
    }
    Ok(file)
}

fn kind_is_fifo(kind: std::fs::FileType) -> bool {
    use std::os::unix::fs::FileTypeExt;
    kind.is_fifo()
}

/// Waits up to `patience` for the first bytes (or the end) of the FIFO `file`, opened without
/// blocking.
fn wait_for_data(file: &std::fs::File, patience: std::time::Duration) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let deadline = std::time::Instant::now() + patience;
    loop {
        let mut pfd = libc::pollfd {
            fd: file.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let ms = i32::try_from(left.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: one valid pollfd, for a file descriptor `file` owns.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n > 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if n < 0 && e.kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        if n < 0 {
            return Err(e);
        }
        return Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!(
                "it is a FIFO (named pipe) that nothing wrote into within {} s; start the program \
                 that writes into it first, or give a regular file",
                patience.as_secs()
            ),
        ));
    }
}

/// Opens an input for reading: a regular file, or a FIFO waited on for [`FIFO_PATIENCE`] at
/// most (then a `TimedOut` error says what to do); a folder, device or socket is refused
/// (`InvalidInput`). Every file the user gives Ember to read is opened here or through
/// [`open_regular`].
pub fn open_input(path: &Path) -> std::io::Result<std::fs::File> {
    open_checked(path, Fifo::Wait(FIFO_PATIENCE))
}

/// As [`open_input`], for a file that must be a regular one because it is read in place
/// (safetensors weights: their header, then their tensors; parquet files): a FIFO is refused
/// at once, with `why`.
pub fn open_regular(path: &Path, why: &'static str) -> std::io::Result<std::fs::File> {
    open_checked(path, Fifo::Refuse(why))
}

/// Reads the whole of `path`, as [`open_input`] opens it.
pub fn read_bytes(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    open_input(path)?.read_to_end(&mut out)?;
    Ok(out)
}

/// Reads at most `limit` bytes of `path` (as [`open_input`] opens it) as UTF-8 text; a longer
/// file is refused (`InvalidData`, naming the limit), so that a huge file given by mistake is
/// not read into memory.
pub fn read_small_text(path: &Path, limit: u64) -> std::io::Result<String> {
    let mut bytes = Vec::new();
    open_input(path)?.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("it is larger than {limit} bytes, too large for what it should hold"),
        ));
    }
    String::from_utf8(bytes).map_err(|e| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("it is not UTF-8 text ({})", e.utf8_error()),
        )
    })
}

/// Opens the FIFO `path` without waiting for a writer, then waits up to `patience` for its
/// first bytes (or its end); the file it returns reads as usual (blocking).
pub fn open_fifo(path: &Path, patience: std::time::Duration) -> std::io::Result<std::fs::File> {
    open_checked(path, Fifo::Wait(patience))
}

/// Opens a file Ember wrote itself (a checkpoint's state, a run's metrics or summary, a sweep's
/// status): anything but a regular file in its place (a FIFO, a device, a folder) is refused
/// at once instead of read (a FIFO would be waited on forever, a device never ends).
pub fn open_own(path: impl AsRef<Path>) -> std::io::Result<std::fs::File> {
    let path = path.as_ref();
    open_checked(
        path,
        Fifo::Refuse("a FIFO is in the place of a file ember writes; remove it"),
    )
    .map_err(|e| match e.kind() {
        std::io::ErrorKind::InvalidInput => std::io::Error::new(
            e.kind(),
            "not a regular file (a folder, FIFO or device is in the place of a file ember \
             writes); remove it",
        ),
        _ => e,
    })
}

/// Reads the whole of a file Ember wrote itself, as [`open_own`] opens it.
pub fn read_own(path: impl AsRef<Path>) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    open_own(path)?.read_to_end(&mut out)?;
    Ok(out)
}

/// As [`read_own`], as UTF-8 text.
pub fn read_own_to_string(path: impl AsRef<Path>) -> std::io::Result<String> {
    String::from_utf8(read_own(path)?)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.utf8_error()))
}

/// Refuses to read a device (`/dev/zero`, `/dev/urandom` would fill the memory) or a folder
/// as a text file. FIFOs (`<(zcat corpus.gz)`) are read as they come.
pub fn refuse_special_input(path: &Path, key: Option<&str>) -> Result<()> {
    let Ok(meta) = std::fs::metadata(path) else {
        return Ok(()); // the read reports a missing file with its hint
    };
    let what = match special_kind(meta.file_type()) {
        Some(what) if !kind_is_fifo(meta.file_type()) => what,
        _ => return Ok(()),
    };
    Err(DataError::arg(
        key.unwrap_or("input"),
        format!(
            "{} is {what}, not a text file; name the file that holds the text",
            path.display()
        ),
    ))
}

/// Checks a path a command is about to write (through a temporary file and a rename) before
/// anything is read or computed: it must not be one of `inputs` (writing would replace the
/// input with the output), nor a symbolic link (a rename would replace the link with a regular
/// file, e.g. `/dev/stdout`, and a plain write would write into whatever it points at), nor an
/// existing folder, device, FIFO or socket (a rename would replace the special file itself,
/// e.g. `/dev/null`, with a regular file). `what` names the argument in the refusal (`OUTPUT`,
/// `--output`).
pub fn check_output(output: &Path, inputs: &[&Path], what: &str) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    refuse_link(output, what)?;
    let Ok(out) = std::fs::metadata(output) else {
        return Ok(()); // a new file
    };
    if !out.is_file() {
        let kind = if out.is_dir() {
            "a folder"
        } else {
            "a special file (a device, FIFO or socket)"
        };
        return Err(DataError::arg(
            what,
            format!(
                "{} is {kind}; give the path of a regular file to write (it is created, or \
                 replaced if it exists). Nothing was written.",
                output.display()
            ),
        ));
    }
    for input in inputs {
        let Ok(inp) = std::fs::metadata(input) else {
            continue;
        };
        if inp.dev() == out.dev() && inp.ino() == out.ino() {
            let same = if input == &output {
                "a file this command reads".to_string()
            } else {
                format!(
                    "{} (the same file by another name), which this command reads",
                    input.display()
                )
            };
            return Err(DataError::arg(
                what,
                format!(
                    "{} is {same}: writing it would replace what is read. Choose another output \
                     path. Nothing was written.",
                    output.display()
                ),
            ));
        }
    }
    Ok(())
}

/// Refuses an output path that is a symbolic link (dangling or not): ember writes the files it
/// was asked to write, never through a link to somewhere else.
pub fn refuse_link(output: &Path, what: &str) -> Result<()> {
    let is_link = std::fs::symlink_metadata(output).is_ok_and(|m| m.file_type().is_symlink());
    if !is_link {
        return Ok(());
    }
    let target = std::fs::read_link(output)
        .map(|t| format!(" (to {})", t.display()))
        .unwrap_or_default();
    Err(DataError::arg(
        what,
        format!(
            "{} is a symbolic link{target}; ember does not write through links (writing would \
             replace the link, or the file it points at). Give the path of the file itself, or \
             remove the link (`rm {}` removes only the link). Nothing was written.",
            output.display(),
            output.display()
        ),
    ))
}

/// What to do about a failed write of `path`, by what failed: a full disk says so (and that the
/// file there before is untouched), a missing folder or a folder without write permission too.
pub fn write_hint(e: &std::io::Error, path: &Path) -> String {
    let folder = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.display().to_string(),
        _ => ".".to_string(),
    };
    match e.kind() {
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded => format!(
            "the disk that holds {folder} is full (or over its quota): free space there or \
             write somewhere else; the file that was there before, if any, is untouched"
        ),
        std::io::ErrorKind::NotFound => format!("check that the folder {folder} exists"),
        std::io::ErrorKind::PermissionDenied => {
            format!("check that the folder {folder} is writable by you")
        }
        _ => format!("check that the folder {folder} exists and is writable"),
    }
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

/// Writes `bytes` to `path` so that a crash, a full disk or a power cut leaves the old content or
/// the new, never half: into a temporary file beside it (named with the process id, so two
/// processes never share one), flushed to the disk, renamed over `path`, and the directory
/// flushed so the rename itself survives a power cut. A link put in `path`'s place is replaced,
/// never written through. A failed write leaves no temporary file behind. Every file Ember
/// writes whole from memory into a place of its own (a run directory's files, tokenizers,
/// token caches, shards, a sweep's plans and reports, an export's JSON) goes through here;
/// checkpoints are written into a temporary folder that is renamed whole, and outputs the user
/// names (`--hypotheses`, `/dev/stdout`) are written in place.
pub fn write_atomic(path: impl AsRef<Path>, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let path = path.as_ref();
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp{}", std::process::id()));
    let tmp = std::path::PathBuf::from(tmp);
    let written = std::fs::File::create(&tmp).and_then(|mut file| {
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    });
    if written.is_err() {
        // A partial temporary file would only take the space a full disk lacks.
        let _ = std::fs::remove_file(&tmp);
        return written;
    }
    sync_parent(path)
}

/// Gives `path` the permissions of `like`, a file this process created the ordinary way (so
/// with the umask's mode). The safetensors crate writes through `tempfile`, which creates files
/// `0600` whatever the umask: without this a checkpoint or a released model folder would be
/// unreadable by the user's group on a shared cluster.
pub fn permissions_like(path: &Path, like: &Path) -> std::io::Result<()> {
    std::fs::set_permissions(path, std::fs::metadata(like)?.permissions())
}

/// Flushes the directory holding `path`, so that a rename into it survives a power cut.
/// A directory that cannot be opened for reading (no read permission) is left as it is: the
/// rename happened, and only its durability over a power cut is not guaranteed.
pub fn sync_parent(path: &Path) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    match std::fs::File::open(dir) {
        Ok(d) => d.sync_all(),
        Err(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_output_that_is_an_input_or_a_special_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in.txt");
        std::fs::write(&input, "text").unwrap();
        let e = check_output(&input, &[&input], "OUTPUT").unwrap_err().to_string();
        assert!(
            e.contains("OUTPUT") && e.contains("in.txt") && e.contains("replace"),
            "{e}"
        );
        // The same file by another name (a hard link, `./in.txt`).
        let other = dir.path().join("link.txt");
        std::fs::hard_link(&input, &other).unwrap();
        assert!(check_output(&other, &[&input], "OUTPUT").is_err());
        let dotted = dir.path().join(".").join("in.txt");
        assert!(check_output(&dotted, &[&input], "OUTPUT").is_err());
        let e = check_output(Path::new("/dev/null"), &[&input], "OUTPUT")
            .unwrap_err()
            .to_string();
        assert!(e.contains("special file"), "{e}");
        let e = check_output(dir.path(), &[&input], "OUTPUT")
            .unwrap_err()
            .to_string();
        assert!(e.contains("a folder"), "{e}");
        check_output(&dir.path().join("new.bin"), &[&input], "OUTPUT").expect("a new file");
        check_output(&other, &[&dir.path().join("missing")], "OUTPUT").expect("an unrelated file");
        assert_eq!(std::fs::read_to_string(&input).unwrap(), "text");
    }

    #[test]
    fn an_output_that_is_a_link_is_refused_whatever_it_points_at() {
        let dir = tempfile::tempdir().unwrap();
        let precious = dir.path().join("precious.txt");
        std::fs::write(&precious, "mine").unwrap();
        for (name, target) in [
            ("to-file", precious.clone()),
            ("dangling", dir.path().join("nowhere")),
            ("to-device", "/dev/null".into()),
            ("to-stdout", "/proc/self/fd/1".into()),
        ] {
            let link = dir.path().join(name);
            std::os::unix::fs::symlink(&target, &link).unwrap();
            let e = check_output(&link, &[], "OUTPUT").unwrap_err().to_string();
            assert!(
                e.contains("OUTPUT") && e.contains(name) && e.contains("symbolic link"),
                "{e}"
            );
            assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
        }
        assert_eq!(std::fs::read_to_string(&precious).unwrap(), "mine");
    }

    #[test]
    fn a_fifo_nothing_writes_into_is_refused_and_one_that_is_written_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("corpus.fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo on a path in a fresh temporary folder.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let t0 = std::time::Instant::now();
        let e = open_fifo(&fifo, std::time::Duration::from_millis(200)).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
        assert!(e.to_string().contains("FIFO"), "{e}");
        assert!(t0.elapsed() < std::time::Duration::from_secs(10), "no hang");
        // A writer that comes a moment later is waited for, and all it writes is read.
        let writer_path = fifo.clone();
        let writer = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(100));
            std::fs::write(writer_path, "hello\n".repeat(50_000)).unwrap();
        });
        let mut text = String::new();
        open_fifo(&fifo, std::time::Duration::from_secs(60))
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        writer.join().unwrap();
        assert_eq!(text.len(), 6 * 50_000);
    }

    #[test]
    fn every_input_is_judged_by_what_was_opened_not_by_its_name() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("weights.safetensors");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo on a path in a fresh temporary folder.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // A file read in place refuses a FIFO at once, saying why; no wait.
        let t0 = std::time::Instant::now();
        let e = open_regular(&fifo, "it is read in place").unwrap_err();
        assert!(
            e.to_string().contains("FIFO") && e.to_string().contains("read in place"),
            "{e}"
        );
        assert!(t0.elapsed() < std::time::Duration::from_secs(5));
        // A folder, a device and a link to a device are refused by what they are.
        let e = open_input(dir.path()).unwrap_err();
        assert!(e.to_string().contains("a folder"), "{e}");
        assert!(open_input(Path::new("/dev/zero"))
            .unwrap_err()
            .to_string()
            .contains("a device"));
        let link = dir.path().join("tokenizer.json");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        assert!(read_bytes(&link).unwrap_err().to_string().contains("a device"));
        // A file ember wrote itself refuses a FIFO in its place at once.
        assert!(open_own(&fifo)
            .unwrap_err()
            .to_string()
            .contains("not a regular file"));
        // Text with a size bound: a larger file is refused, not read whole.
        let big = dir.path().join("config.json");
        std::fs::write(&big, "x".repeat(100)).unwrap();
        assert_eq!(read_small_text(&big, 100).unwrap().len(), 100);
        assert!(read_small_text(&big, 99)
            .unwrap_err()
            .to_string()
            .contains("larger than 99"));
    }

    #[test]
    fn a_device_is_not_read_as_text() {
        let e = read_text(Path::new("/dev/zero"), Some("data.corpus.path"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("data.corpus.path") && e.contains("a device"), "{e}");
    }

    #[test]
    fn lines_handle_crlf_and_missing_final_newline() {
        assert_eq!(lines("a\r\nb\n"), vec!["a", "b"]);
        assert_eq!(lines("a\nb"), vec!["a", "b"]);
        assert_eq!(lines("a\n\nb\n"), vec!["a", "", "b"]);
        assert_eq!(lines(""), Vec::<&str>::new());
        assert_eq!(lines("\n"), vec![""]);
    }

    #[test]
    fn write_atomic_replaces_the_file_and_a_link_in_its_place_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        write_atomic(&path, b"old").unwrap();
        write_atomic(&path, b"new").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");

        let target = dir.path().join("elsewhere");
        std::fs::write(&target, b"untouched").unwrap();
        let link = dir.path().join("link.json");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        write_atomic(&link, b"written").unwrap();
        assert_eq!(
            std::fs::read(&target).unwrap(),
            b"untouched",
            "written through the link"
        );
        assert!(!std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
        assert_eq!(std::fs::read(&link).unwrap(), b"written");

        let missing = dir.path().join("no-such-dir").join("file");
        assert!(write_atomic(&missing, b"x").is_err());
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left.len(), 3, "only the three files written: {left:?}");
    }
}
