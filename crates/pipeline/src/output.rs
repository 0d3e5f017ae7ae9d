//! Files a pipeline writes: whole or not at all.

use crate::{Error, Result};
use std::io::Write as _;
use std::path::{Path, PathBuf};

/// How every HTML report batchfit writes begins.
pub const HTML_START: &str = "<!DOCTYPE html>";

/// Checks an HTML report's path before any work starts: its folder exists,
/// and what is there already is a report to replace: a regular file (a
/// symlink's target) that is empty or begins as batchfit's reports do
/// ([`HTML_START`]). A folder, a device or a pipe is no place for one, and a
/// file of another kind (the data, the model) is not overwritten.
pub fn check_html_output(flag: &str, path: &Path) -> Result {
    if let Some(parent) = path.parent()
        && !parent.as_os_str().is_empty()
        && !parent.is_dir()
    {
        return Err(Error::input(format!(
            "{flag}: folder {} does not exist",
            parent.display()
        )));
    }
    let Ok(meta) = std::fs::metadata(path) else {
        return Ok(());
    };
    if !meta.is_file() {
        return Err(Error::input(format!(
            "{flag} {}: not a regular file (a folder, a device or a pipe): give a file name",
            path.display()
        )));
    }
    let mut start = [0u8; HTML_START.len()];
    let read = std::fs::File::open(path).and_then(|mut f| {
        use std::io::Read as _;
        let mut n = 0;
        while n < start.len() {
            match f.read(&mut start[n..])? {
                0 => break,
                k => n += k,
            }
        }
        Ok(n)
    });
    match read {
        Ok(0) => Ok(()),
        Ok(n) if start[..n] == HTML_START.as_bytes()[..n] && n == start.len() => Ok(()),
        _ => Err(Error::input(format!(
            "{flag} {}: the file exists and is not an HTML report; batchfit replaces only its own reports (give another name, or remove the file)",
            path.display()
        ))),
    }
}

/// Writes `contents` to a temporary file beside `path`, flushed to the disk,
/// then renames it into place: `path` is either its old self or whole, never
/// half-written, whether the write fails (a full disk, no permission) or
/// batchfit is ended meanwhile (the signal handler removes the temporary
/// file). A failed write is a failure naming `path` (exit 1).
pub fn write_atomically(flag: &str, path: &Path, contents: &str) -> Result {
    // Through a symlink to its target: the rename replaces a name, and the
    // link is the user's.
    let resolved = match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => std::fs::canonicalize(path).ok(),
        _ => None,
    };
    let path = resolved.as_deref().unwrap_or(path);
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

    /// A report replaces only a report: the data or a folder in its place is
    /// refused before any work (exit 2), a symlink is written through.
    #[test]
    fn an_html_path_must_be_free_or_a_report() {
        let dir = std::env::temp_dir().join(format!("batchfit-output-h-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (data, report, folder) = (dir.join("d.csv"), dir.join("r.html"), dir.join("sub"));
        std::fs::write(&data, "a,b\n1,2\n").unwrap();
        std::fs::create_dir(&folder).unwrap();
        for bad in [&data, &folder] {
            let e = check_html_output("--html", bad).unwrap_err();
            assert!(
                e.is_input() && e.to_string().contains(&bad.display().to_string()),
                "{e}"
            );
        }
        assert!(
            check_html_output("--html", &report).is_ok(),
            "not there yet"
        );
        write_atomically("--html", &report, &format!("{HTML_START}<p>old")).unwrap();
        assert!(
            check_html_output("--html", &report).is_ok(),
            "an earlier report"
        );
        #[cfg(unix)]
        {
            let link = dir.join("link.html");
            std::os::unix::fs::symlink(&report, &link).unwrap();
            write_atomically("--html", &link, &format!("{HTML_START}<p>new")).unwrap();
            assert!(
                std::fs::symlink_metadata(&link)
                    .unwrap()
                    .file_type()
                    .is_symlink()
            );
            assert!(std::fs::read_to_string(&report).unwrap().ends_with("new"));
        }
        assert_eq!(std::fs::read_to_string(&data).unwrap(), "a,b\n1,2\n");
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
