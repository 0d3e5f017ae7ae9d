//! Helpers shared by the integration tests: the real binary, and its JSON output.

#![allow(dead_code)] // each test file uses its own subset

use assert_cmd::Command;

/// Flags that keep `advise` and `schedule` quick on the built-in default model.
pub const QUICK_ADVISE: &[&str] = &[
    "--noise-steps",
    "60",
    "--batches",
    "8,32,128",
    "--time-cap",
    "0.2",
    "--warmup",
    "1",
];

/// The `batchfit` binary built for these tests.
pub fn batchfit() -> Command {
    Command::cargo_bin("batchfit").unwrap()
}

/// Runs `batchfit ARGS --json`, asserts success, and parses the document.
pub fn json(args: &[&str]) -> serde_json::Value {
    document(batchfit().args(args).arg("--json").output().unwrap())
}

/// The JSON document a successful run printed (the run's stderr if it failed).
pub fn document(out: std::process::Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The path of a file in `tests/fixtures` (the stand-in trainer and launcher).
pub fn fixture(name: &str) -> String {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
        .display()
        .to_string()
}

/// The rows of a data set of `rows` rows whose loss `advise` judges its target
/// by, as indices into the whole set: the fixed rows
/// (`batchfit_engine::sweep::target_rows`) of the training rows the default
/// split keeps, which advise trains on.
pub fn advice_fixed_rows(rows: usize) -> Vec<usize> {
    let (train, _) = batchfit_data::split_indices(
        rows,
        batchfit_data::DEFAULT_VAL_SPLIT,
        batchfit_data::DEFAULT_SPLIT_SEED,
    );
    batchfit_engine::sweep::target_rows(train.len())
        .into_iter()
        .map(|i| train[i])
        .collect()
}
