//! How a pipeline reports progress, without knowing what shows it (the binary
//! implements this for an indicatif bar; tests and libraries use [`NoProgress`]).

/// Progress of a long pipeline: work units done out of a growing total, and
/// what is being done now.
pub trait Progress {
    /// What is being done now.
    fn message(&self, _msg: String) {}
    /// Sets the total amount of work.
    fn set_length(&self, _len: u64) {}
    /// Adds to the total amount of work.
    fn add_length(&self, _more: u64) {}
    /// Sets the work done.
    fn set_position(&self, _pos: u64) {}
    /// Marks `n` units of work done.
    fn advance(&self, _n: u64) {}
    /// Something the user should know that does not stop the pipeline (a
    /// record skipped); on stderr unless the implementation shows it itself.
    fn warn(&self, msg: String) {
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), "warning: {msg}");
    }
}

/// Shows nothing.
pub struct NoProgress;

impl Progress for NoProgress {}
