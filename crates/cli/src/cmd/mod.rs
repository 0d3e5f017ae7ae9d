//! One module per subcommand.

pub mod advise;
pub mod noise;
pub mod plan;
pub mod probe;
pub mod run;
pub mod sweep;

use crate::error::{CliError, CliResult};

/// The hidden subcommand that runs the reaper (`batchfit_exec::reaper`).
pub const REAPER_SUBCOMMAND: &str = "__reaper";

/// Whatever ends batchfit (SIGINT, SIGTERM, SIGHUP, even SIGKILL) ends the
/// trials it started: the signal handler, and the reaper started with the
/// first trial (`batchfit_exec::interrupt`).
pub fn end_trials_with_batchfit() -> CliResult {
    #[cfg(unix)]
    {
        let reaper =
            std::env::current_exe()
                .ok()
                .map(|program| batchfit_exec::reaper::ReaperCommand {
                    program,
                    args: vec![REAPER_SUBCOMMAND.into()],
                });
        batchfit_exec::interrupt::install(reaper).map_err(|e| {
            CliError::Pipeline(batchfit_pipeline::Error::failure(
                "cannot watch for the signals that end batchfit",
                e,
            ))
        })?;
    }
    Ok(())
}

/// The reaper's process: reads the trials' process groups from stdin until
/// batchfit's end closes it.
pub fn reap() -> CliResult {
    #[cfg(unix)]
    batchfit_exec::reaper::serve(std::io::stdin().lock());
    Ok(())
}
