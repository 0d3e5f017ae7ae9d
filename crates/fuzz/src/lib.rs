//! Fuzz targets for every reader of outside input batchfit has: the ONNX
//! importer, the TOML layer spec, npy, npz, CSV and IDX data, the `BATCHFIT`
//! step line of a user's command, the advice JSON that `--verify` reads, and
//! a sweep's records that `--from-sweep` and `--resume` read.
//!
//! Each [`Target`] makes structure-aware inputs: a generator draws every
//! choice (which op, which dimension, which field to break) from an
//! [`arbitrary::Unstructured`] byte source, either building a file from the
//! format's grammar or mutating a seed (the shapes the tests use) at the
//! format's own level (a JSON node, a TOML token, a protobuf field) and then,
//! now and then, at the byte level. A reader must answer every input with a
//! value or an error; a panic, an abort or a hang is a bug.
//!
//! The driver is `tests/fuzz.rs` (on the stable toolchain: coverage-guided
//! fuzzers need nightly's sanitizer flags). Inputs that once crashed a reader
//! live in `regressions/TARGET/` and are replayed by every test run.

mod mutate;
mod onnx;
mod targets;

pub use targets::TARGETS;

use arbitrary::Unstructured;

/// One reader and how to make inputs for it.
pub struct Target {
    /// Also the folder of its regression inputs.
    pub name: &'static str,
    /// One input, built or mutated from the choices in `u`.
    pub generate: fn(&mut Unstructured) -> arbitrary::Result<Vec<u8>>,
    /// Feeds one input to the reader: whether it was read as valid. Errors
    /// are right answers; a panic is a bug.
    pub check: fn(&[u8]) -> bool,
}

impl Target {
    /// The target called `name`.
    pub fn named(name: &str) -> &'static Target {
        TARGETS
            .iter()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("no fuzz target `{name}`"))
    }
}
