//! A sweep's `--out` folder: `sweep.json` (its settings) and one record per
//! finished run, written whole as each run ends, so an interrupted sweep
//! resumes where it stopped and `advise --from-sweep` reads the steps back.

use crate::output::write_atomically;
use crate::{Error, Progress, Result};
use batchfit_tune::device::DeviceSpec;
use batchfit_tune::sweep::{MeasuredSteps, RunRecord, SweepSettings, measured_steps};
use std::path::{Path, PathBuf};

const SETTINGS_FILE: &str = "sweep.json";

/// A run's record in `--out`: `run-b{batch}-s{seed}.json` on the first device
/// (`run-schedule-s{seed}.json` for the schedule), with the device's name in
/// front (`run-wgpu0-b…`) on the others.
pub(crate) fn run_file(
    dir: &Path,
    device: Option<DeviceSpec>,
    batch: Option<u64>,
    seed: u64,
) -> PathBuf {
    let device: String = device
        .map(|d| format!("{}-", d.to_string().replace(':', "")))
        .unwrap_or_default();
    let what = batch.map_or("schedule".to_string(), |b| format!("b{b}"));
    dir.join(format!("run-{device}{what}-s{seed}.json"))
}

/// Checks `--out DIR` against the settings: a new sweep needs an empty (or new)
/// folder; a resumed one the same settings.
pub(crate) fn prepare_out(dir: &Path, settings: &SweepSettings, resume: bool) -> Result {
    let file = dir.join(SETTINGS_FILE);
    if file.exists() {
        if !resume {
            return Err(Error::input(format!(
                "--out {}: it already holds a sweep; add --resume to continue it, or choose another folder",
                dir.display()
            )));
        }
        let text = std::fs::read_to_string(&file)
            .map_err(|e| Error::input_because(file.display().to_string(), e))?;
        let old: SweepSettings = serde_json::from_str(&text).map_err(|e| {
            Error::input_because(format!("{}: not a batchfit sweep", file.display()), e)
        })?;
        if &old != settings {
            return Err(Error::input(format!(
                "--resume: {} was written by a sweep with other settings ({}); rerun with the same flags or another --out",
                file.display(),
                settings_difference(&old, settings)
            )));
        }
        return Ok(());
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::input_because(format!("--out {}", dir.display()), e))?;
    write_atomically(
        "--out",
        &file,
        &serde_json::to_string_pretty(settings).expect("serialises"),
    )
}

/// Keeps one finished run's record.
pub(crate) fn write_record(file: &Path, record: &RunRecord) -> Result {
    write_atomically(
        "--out",
        file,
        &serde_json::to_string_pretty(record).expect("serialises"),
    )
}

/// The fields that differ, named as in the JSON.
fn settings_difference(a: &SweepSettings, b: &SweepSettings) -> String {
    let (a, b) = (
        serde_json::to_value(a).expect("serialises"),
        serde_json::to_value(b).expect("serialises"),
    );
    let (a, b) = (
        a.as_object().expect("object"),
        b.as_object().expect("object"),
    );
    a.iter()
        .filter(|(k, v)| b.get(*k) != Some(v))
        .map(|(k, v)| format!("{k}: {v} there, {} now", b[k]))
        .collect::<Vec<_>>()
        .join("; ")
}

/// One run's record, or why it is not one (a file cut short by a full disk or
/// a kill before records were written whole, or edited by hand), naming it.
pub(crate) fn read_record(path: &Path) -> std::result::Result<RunRecord, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    serde_json::from_str(&text)
        .map_err(|e| format!("{} is not a sweep run record ({e})", path.display()))
}

/// Reads `DIR/sweep.json` and the first device's `DIR/run-b*-s*.json` and fits
/// S(B) to their steps to the sweep's target; exit 2 when the folder holds no
/// sweep or its steps do not follow S(B).
pub fn read_measured_steps(
    dir: &Path,
    progress: &dyn Progress,
) -> Result<(SweepSettings, MeasuredSteps)> {
    let name = dir.display();
    let file = dir.join(SETTINGS_FILE);
    let text = std::fs::read_to_string(&file)
        .map_err(|e| Error::input_because(format!("--from-sweep {}", file.display()), e))?;
    let settings: SweepSettings = serde_json::from_str(&text).map_err(|e| {
        Error::input_because(
            format!("--from-sweep {}: not a batchfit sweep", file.display()),
            e,
        )
    })?;
    let entries = std::fs::read_dir(dir)
        .map_err(|e| Error::input_because(format!("--from-sweep {name}"), e))?;
    let mut records: Vec<RunRecord> = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let file_name = entry.file_name().to_string_lossy().to_string();
        if !(file_name.starts_with("run-b") && file_name.ends_with(".json")) {
            continue;
        }
        match read_record(&path) {
            Ok(record) => records.push(record),
            Err(e) => progress.warn(format!("--from-sweep: {e}; going on without it")),
        }
    }
    let m = measured_steps(&settings, &records)
        .map_err(|e| Error::input(format!("--from-sweep {name}: {e}")))?;
    Ok((settings, m))
}
