//! Files a pipeline writes: whole or not at all.

use crate::{Error, Result};
use std::io::Write as _;
use std::path::{Path, PathBuf};

/// Checks an output file's folder exists before any work starts.
pub fn check_output_folder(flag: &str, path: &Path) -> Result {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() && !parent.is_dir() => Err(Error::input(
            format!("{flag}: folder {} does not exist", parent.display()),
        )),
        _ => Ok(()),
    }
}

/// Writes `contents` to a temporary file beside `path`, flushed to the disk,
/// then renames it into place: `path` is either its old self or whole, never
/// half-written, whether the write fails (a full disk, no permission) or
/// batchfit is ended meanwhile (the signal handler removes the temporary
/// file). A failed write is a failure naming `path` (exit 1).
pub fn write_atomically(flag: &str, path: &Path, contents: &str) -> Result {
    let tmp = temporary_beside(path);
    #[cfg(unix)]
    batchfit_exec::interrupt::register_partial(tmp.clone());
    let result = write_synced(&tmp, contents.as_bytes()).and_then(|_| std::fs::rename(&tmp, path));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    #[cfg(unix)]
    batchfit_exec::interrupt::unregister_partial(&tmp);
    result.map_err(|e| Error::failure(format!("{flag}: cannot write {}", path.display()), e))
}

/// A hidden name in `path`'s folder, unique to this process (two outputs
/// with one stem, or two batchfits writing one folder, never share one).
fn temporary_beside(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.{}.partial", std::process::id()))
}

/// Writes and flushes to the disk: a full disk can surface only at the flush
/// on some filesystems, and a rename must not publish data still in memory.
fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut file = std::fs::File::create(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_replaces_the_file_whole_and_leaves_nothing_beside_it() {
        let dir = std::env::temp_dir().join(format!("batchfit-output-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("report.html");
        std::fs::write(&path, "old").unwrap();
        write_atomically("--html", &path, "new").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new");
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["report.html"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_failed_write_names_the_path_and_leaves_the_old_file() {
        let dir = std::env::temp_dir().join(format!("batchfit-output-f-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // A folder in the file's place: the rename fails after the write.
        let path = dir.join("out.json");
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join("keep"), "old").unwrap();
        let e = write_atomically("--out", &path, "new").unwrap_err();
        assert!(!e.is_input(), "a failed write is a failure (exit 1)");
        assert!(e.to_string().contains(&path.display().to_string()), "{e}");
        assert_eq!(std::fs::read_to_string(path.join("keep")).unwrap(), "old");
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["out.json"], "the temporary file was removed");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
