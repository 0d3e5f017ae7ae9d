//! Files a pipeline writes: whole or not at all.

use crate::{Error, Result};
use std::path::Path;

/// Checks an output file's folder exists before any work starts.
pub fn check_output_folder(flag: &str, path: &Path) -> Result {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() && !parent.is_dir() => Err(Error::input(
            format!("{flag}: folder {} does not exist", parent.display()),
        )),
        _ => Ok(()),
    }
}

/// Writes `contents` beside `path`, then renames: never a half-written file,
/// also when interrupted (the partial file is removed by the Ctrl-C handler).
pub fn write_atomically(flag: &str, path: &Path, contents: &str) -> Result {
    let tmp = path.with_extension("partial");
    #[cfg(unix)]
    batchfit_exec::interrupt::register_partial(tmp.clone());
    let result = std::fs::write(&tmp, contents).and_then(|_| std::fs::rename(&tmp, path));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    #[cfg(unix)]
    batchfit_exec::interrupt::unregister_partial(&tmp);
    result.map_err(|e| Error::input_because(format!("{flag} {}", path.display()), e))
}
