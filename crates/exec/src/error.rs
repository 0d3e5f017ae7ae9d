//! What can go wrong before a trial runs: the command, the step reader, the
//! signal handler.

/// Why trials cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// Nothing after `--`.
    #[error(
        "no command given; write it after `--`, e.g. batchfit run -- python train.py --batch-size {{batch}}"
    )]
    NoCommand,
    /// The command does not say where the batch size goes.
    #[error(
        "the command `{command}` has no `{{batch}}`; put it where the batch size goes, e.g. --batch-size {{batch}} (it is also exported as BATCHFIT_BATCH)"
    )]
    NoPlaceholder { command: String },
    /// `--throughput-regex` does not compile.
    #[error("not a regular expression")]
    Regex(#[source] regex::Error),
    /// `--throughput-regex` names neither group a step time can come from.
    #[error(
        "needs a named group `(?P<seconds>...)` (seconds per step) or `(?P<samples_per_s>...)`, e.g. '(?P<samples_per_s>[0-9.]+) samples/s'"
    )]
    RegexGroups,
    /// `--launcher` asked for a topology that cannot run.
    #[error("{0}")]
    Launcher(String),
    /// The signal handler could not be installed.
    #[error("cannot watch for SIGINT, SIGTERM and SIGHUP")]
    Interrupt(#[source] std::io::Error),
}

/// Why one output line that looked like a step report could not be read.
#[derive(Debug, thiserror::Error)]
pub enum StepLineError {
    #[error("bad protocol line `{line}`")]
    Json {
        line: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("`seconds` must be positive in `{0}`")]
    NotPositive(String),
    #[error("no number in the match on `{0}`")]
    NoNumber(String),
    #[error("`noise` needs finite, non-negative norms and b_big > b_small > 0 in `{0}`")]
    BadNoise(String),
}
