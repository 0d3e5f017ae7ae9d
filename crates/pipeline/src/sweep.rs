//! `sweep`: real short trainings at several batch sizes and seeds on real
//! data, with validation, to test the noise-scale predictions and answer "does
//! this batch size hurt quality?". Each finished run can be kept in a folder,
//! so an interrupted sweep resumes where it stopped.

use crate::noise::{DataSource, Init, NoiseSettings, apply_loss, load_data, run_noise};
use crate::output::{check_output_folder, write_atomically};
use crate::{Error, Progress, Result};
use batchfit_data::Dataset;
use batchfit_engine::sweep::{RunSpec, train_run};
use batchfit_engine::{DeviceSpec, TrainConfig};
use batchfit_plan::Optimizer;
use batchfit_report::sweep::{
    BatchSummary, DeviceBatchTimes, DeviceTimes, MeasuredNoise, ScheduleSummary, SweepDocument,
    SweepRun, SweepSettings, quality_statement,
};
use batchfit_tune::lr::{LrRule, LrScaling};
use batchfit_tune::schedule::{Schedule, predict, ramp};
use batchfit_tune::sweep::{
    RunRecord, RunStatus, difference, first_reach, fit_s_min, fit_steps, mean_std, quality,
};
use batchfit_tune::target::StepsCurve;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// How to sweep.
#[derive(Clone, Debug)]
pub struct SweepConfig {
    /// `None`: the default model with the shipped digits.
    pub model: Option<String>,
    pub data: DataSource,
    /// Batch sizes, trained in this order.
    pub batches: Vec<u64>,
    /// How the learning rate follows the batch (default: by optimizer).
    pub lr_rule: Option<LrRule>,
    /// The batch the reference learning rate belongs to (default: the smallest).
    pub ref_batch: Option<u64>,
    pub ref_lr: f64,
    /// Batches above this train at its learning rate.
    pub lr_cap: Option<u64>,
    pub optimizer: Optimizer,
    /// Epochs of linear warm-up from the reference rate to the scaled one.
    pub warmup_epochs: f64,
    /// Train to this training loss; `None`: the lowest every run reached.
    pub target_loss: Option<f64>,
    pub epochs: u32,
    /// Share of the rows held out for validation.
    pub val_split: f64,
    /// Seeds 0..seeds per batch.
    pub seeds: u64,
    pub split_seed: u64,
    /// Skip the noise-scale measurement the fit is compared with.
    pub no_noise: bool,
    /// Keep each run's record here as it finishes.
    pub out: Option<PathBuf>,
    /// With `out`: train only the runs missing there.
    pub resume: bool,
    pub threads: Option<usize>,
    /// Where the runs train: every run on each, in this order (at least one).
    pub devices: Vec<DeviceSpec>,
    /// Checked before any work (the binary writes it).
    pub html: Option<PathBuf>,
    /// A batch-size schedule trained beside the fixed batches, on every seed.
    pub schedule: Option<ScheduleChoice>,
    /// `--verify`: the advice whose prediction the runs check (its rule,
    /// target and device are already in the fields above); runs get epochs
    /// enough for three times their predicted steps.
    pub verify: Option<crate::verify::Advice>,
}

/// Which batch-size schedule a sweep trains beside its fixed batches.
#[derive(Clone, Debug)]
pub enum ScheduleChoice {
    /// The ramp from the noise scale along a noise run on the training split,
    /// with the sweep's learning-rate rule, over the powers of two from the
    /// smallest to the largest batch swept.
    Ramp,
    /// A schedule from a file (`batchfit schedule --json`, or written by hand).
    Given { schedule: Schedule, source: String },
}

/// Progress units per run.
const UNIT: u64 = 1000;

/// Runs the sweep and summarises it.
pub fn sweep(cfg: &SweepConfig, progress: &dyn Progress) -> Result<SweepDocument> {
    let started = Instant::now();
    let default_model = cfg.model.is_none();
    let mut graph = batchfit_graph::load(cfg.model.as_deref().unwrap_or(crate::DEFAULT_MODEL))?;
    apply_loss(&mut graph, cfg.data.loss)?;
    batchfit_engine::model::check_trainable(&graph)?;
    let seq_len = graph.default_seq_len.unwrap_or(1);
    let data = load_data(&cfg.data, &graph, seq_len, default_model)?;
    if data.rows < 4 {
        return Err(Error::input(format!(
            "{}: {} rows are too few to split into training and validation",
            data.source, data.rows
        )));
    }
    let (train, val) = data.split(cfg.val_split, cfg.split_seed);
    // In the order given (the runs train in it), each once.
    let mut batches: Vec<u64> = Vec::new();
    for &b in &cfg.batches {
        if !batches.contains(&b) {
            batches.push(b);
        }
    }
    let Some(&smallest) = batches.iter().min() else {
        return Err(Error::input("--batches: give at least one batch size"));
    };
    if let Some(&b) = batches.iter().find(|&&b| b as usize > train.rows) {
        return Err(Error::input(format!(
            "--batches: {b} exceeds the {} training rows of {}",
            train.rows, data.source
        )));
    }
    let Some(&first_device) = cfg.devices.first() else {
        return Err(Error::input("--device: give at least one device"));
    };
    if let Some((i, d)) = cfg
        .devices
        .iter()
        .enumerate()
        .find(|(i, d)| cfg.devices[..*i].contains(d))
    {
        return Err(Error::input(format!(
            "--device: {d} is listed twice (positions {} and {})",
            cfg.devices.iter().position(|x| x == d).unwrap_or(0) + 1,
            i + 1
        )));
    }
    if let Some(p) = &cfg.html {
        check_output_folder("--html", p)?;
    }
    if let Some(n) = cfg.threads {
        let _ = batchfit_engine::set_threads(n);
    }

    let rule = cfg
        .lr_rule
        .unwrap_or_else(|| LrRule::for_optimizer(cfg.optimizer.is_adaptive()));
    let ref_batch = cfg.ref_batch.unwrap_or(smallest);
    let seeds: Vec<u64> = (0..cfg.seeds).collect();
    let mut scaling = LrScaling {
        rule,
        ref_batch,
        ref_lr: cfg.ref_lr,
        cap_batch: cfg.lr_cap,
    };
    // The schedule first: the ramp's stages come from a noise run, whose
    // noise scale also caps the rate of every run unless --lr-cap is given
    // (the rule advise predicts with).
    let planned = match &cfg.schedule {
        None => None,
        Some(choice) => {
            let p = plan_schedule(
                choice, cfg, &scaling, &batches, &graph, &train, seq_len, progress,
            )?;
            if scaling.cap_batch.is_none() && matches!(choice, ScheduleChoice::Ramp) {
                scaling.cap_batch = p.cap;
            }
            Some(p)
        }
    };
    let settings = SweepSettings {
        model: graph.name.clone(),
        data: data.source.clone(),
        device: cfg
            .devices
            .iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(","),
        train_rows: train.rows,
        val_rows: val.rows,
        val_split: cfg.val_split,
        split_seed: cfg.split_seed,
        batches: batches.clone(),
        seeds: seeds.clone(),
        optimizer: cfg.optimizer.name().to_string(),
        lr_rule: format!("{rule:?}").to_lowercase(),
        ref_batch,
        ref_lr: cfg.ref_lr,
        lr_cap: scaling.cap_batch,
        schedule: cfg.schedule.as_ref().map(|c| match c {
            ScheduleChoice::Ramp => "ramp".to_string(),
            ScheduleChoice::Given { source, .. } => source.clone(),
        }),
        warmup_epochs: cfg.warmup_epochs,
        target_loss: cfg.target_loss,
        max_epochs: cfg.epochs,
    };
    if let Some(dir) = &cfg.out {
        prepare_out(dir, &settings, cfg.resume)?;
    }
    #[cfg(unix)]
    batchfit_exec::interrupt::set_message(match &cfg.out {
        Some(d) => format!(
            "the runs finished so far are in {}; add --resume to the same command to train only the rest",
            d.display()
        ),
        None => "nothing was written (--out DIR keeps finished runs)".into(),
    });

    // Device-major, then seed-major: an interrupted sweep has whole comparisons
    // across batches (and the schedule, after them), on the first device first.
    let mut order: Vec<(DeviceSpec, Option<u64>, u64)> = Vec::new();
    for &d in &cfg.devices {
        for &s in &seeds {
            order.extend(batches.iter().map(|&b| (d, Some(b), s)));
            if planned.is_some() {
                order.push((d, None, s));
            }
        }
    }
    progress.set_length(order.len() as u64 * UNIT);
    let mut runs: Vec<SweepRun> = Vec::new();
    for (i, &(device, fixed, seed)) in order.iter().enumerate() {
        let schedule = match fixed {
            Some(_) => None,
            None => planned.as_ref().map(|p| p.schedule.clone()),
        };
        let batch = fixed.unwrap_or_else(|| schedule.as_ref().map_or(0, |s| s.stages[0].batch));
        let base = TrainConfig {
            optimizer: cfg.optimizer,
            lr: cfg.ref_lr,
            seq_len,
            seed: 0,
            device,
            init_random: true,
        };
        let tag = (device != first_device).then(|| device.to_string());
        let file = cfg
            .out
            .as_ref()
            .map(|d| run_file(d, tag.as_deref(), fixed, seed));
        if cfg.resume
            && let Some(f) = &file
            && f.exists()
        {
            match read_record(f) {
                Ok(record) => {
                    runs.push(sweep_run(record, device, true));
                    progress.set_position((i as u64 + 1) * UNIT);
                    continue;
                }
                Err(e) => progress.warn(format!("--resume: {e}; training that run again")),
            }
        }
        let lr = match &schedule {
            Some(s) => s.stages[0].lr,
            None => scaling.at(batch),
        };
        let warmup_steps = if batch > ref_batch && schedule.is_none() {
            (cfg.warmup_epochs * (train.rows as u64 / batch) as f64).round() as u64
        } else {
            0
        };
        let spec = RunSpec {
            batch: batch as usize,
            lr,
            lr_start: cfg.ref_lr.min(lr),
            warmup_steps,
            seed,
            target_loss: cfg.target_loss,
            max_epochs: cfg.verify.as_ref().map_or(cfg.epochs, |a| {
                cfg.epochs.max(a.epochs_for(batch, train.rows))
            }),
            schedule: schedule.clone(),
        };
        progress.message(match &schedule {
            Some(s) => format!(
                "{}/{}: {device}, schedule {}, seed {seed}",
                i + 1,
                order.len(),
                s.stages
                    .iter()
                    .map(|x| x.batch.to_string())
                    .collect::<Vec<_>>()
                    .join("→")
            ),
            None => format!(
                "{}/{}: {device}, batch {batch}, seed {seed}, lr {lr:.2e}",
                i + 1,
                order.len()
            ),
        });
        let record = train_run(&graph, &base, &train, &val, &spec, |done| {
            progress.set_position(i as u64 * UNIT + (done * UNIT as f64) as u64);
        })?;
        if let Some(f) = &file {
            write_atomically(
                "--out",
                f,
                &serde_json::to_string_pretty(&record).expect("serialises"),
            )?;
        }
        runs.push(sweep_run(record, device, false));
        progress.set_position((i as u64 + 1) * UNIT);
    }

    let noise = if cfg.no_noise {
        None
    } else {
        measure_noise(cfg, &graph, &train, seq_len)?
    };
    let first = first_device.to_string();
    let mut doc = document(settings, runs, noise, started, &first);
    if let Some(p) = planned {
        doc.schedule = Some(schedule_summary(p, &doc, &first));
    }
    if let Some(advice) = &cfg.verify {
        let of_first: Vec<SweepRun> = doc
            .runs
            .iter()
            .filter(|r| r.device == first)
            .cloned()
            .collect();
        doc.verify = Some(crate::verify::report(advice, &doc.per_batch, &of_first));
    }
    Ok(doc)
}

/// A schedule to train, and the noise run that predicts its steps.
struct PlannedSchedule {
    schedule: Schedule,
    /// The rate cap the noise run's B_noise implies (never below its batch).
    cap: Option<u64>,
    source: String,
    noise: batchfit_report::noise::NoiseDocument,
    rule: LrRule,
    reference: (u64, f64),
}

/// B_small and k of the sweep's noise runs (`noise`'s defaults: B_big = 128).
const SCHEDULE_NOISE_BATCH: (usize, usize) = (16, 8);

/// The noise run on the training split, trained as the sweep's runs are (its
/// rule at B_big), and the schedule: the ramp over its stretches, or the one given.
#[allow(clippy::too_many_arguments)]
fn plan_schedule(
    choice: &ScheduleChoice,
    cfg: &SweepConfig,
    scaling: &LrScaling,
    batches: &[u64],
    graph: &batchfit_graph::Graph,
    train: &Dataset,
    seq_len: usize,
    progress: &dyn Progress,
) -> Result<PlannedSchedule> {
    let (b_small, k) = SCHEDULE_NOISE_BATCH;
    if b_small * k > train.rows {
        return Err(Error::input(format!(
            "--schedule: the noise run behind it needs {} training rows; {} has {}",
            b_small * k,
            train.source,
            train.rows
        )));
    }
    let settings = noise_settings(cfg, scaling.at((b_small * k) as u64));
    progress.message("noise scale along a run, for the schedule".into());
    let outcome = run_noise(&settings, graph, train, seq_len, |_| {})?;
    let noise = crate::noise::document(&settings, graph, train, outcome);
    let reference = (scaling.ref_batch, scaling.ref_lr);
    let basis = crate::advise::prediction_basis(&noise, scaling.rule, reference)
        .filter(|b| !b.segments.is_empty());
    let cap = basis.as_ref().and_then(|b| b.lr.cap_batch);
    let (schedule, source) = match choice {
        ScheduleChoice::Given { schedule, source } => (schedule.clone(), source.clone()),
        ScheduleChoice::Ramp => {
            let basis = basis.ok_or_else(|| {
                Error::input(
                    "--schedule ramp: the noise run behind it did not reach a lower loss (raise --ref-lr, or give a schedule file)",
                )
            })?;
            // The rates of the stages follow the rule with the cap every run uses.
            let scaling = LrScaling {
                cap_batch: scaling.cap_batch.or(cap),
                ..*scaling
            };
            // Powers of two from the smallest batch swept to the largest.
            let (lo, hi) = (
                batches[0].min(*batches.iter().min().unwrap_or(&1)),
                *batches.iter().max().unwrap_or(&1),
            );
            let allowed: Vec<u64> = std::iter::successors(Some(lo), |b| Some(b * 2))
                .take_while(|&b| b <= hi)
                .collect();
            let r = ramp(&basis.segments, &allowed, &scaling).ok_or_else(|| {
                Error::input("--schedule ramp: the noise run has no stretch to build it from")
            })?;
            (
                r.schedule,
                format!("ramp: {}, from a noise run on the training split", r.rule),
            )
        }
    };
    Ok(PlannedSchedule {
        schedule,
        cap,
        source,
        noise,
        rule: scaling.rule,
        reference,
    })
}

/// The schedule's runs on the first device beside the fastest fixed batch,
/// and its predicted steps to the sweep's target.
fn schedule_summary(p: PlannedSchedule, doc: &SweepDocument, first: &str) -> ScheduleSummary {
    let of: Vec<&SweepRun> = doc
        .runs
        .iter()
        .filter(|r| r.device == first && r.record.schedule.is_some())
        .collect();
    let segments = doc
        .target_loss
        .and_then(|t| crate::advise::prediction_basis_to(&p.noise, p.rule, p.reference, Some(t)))
        .map(|b| b.segments)
        .filter(|s| !s.is_empty());
    let predicted = segments.as_ref().map(|s| predict(&p.schedule, s));
    let stat = |v: Vec<f64>| (!v.is_empty()).then(|| mean_std(&v));
    let steps: Vec<f64> = of.iter().filter_map(|r| r.steps_to_target).collect();
    let seconds: Vec<f64> = of.iter().filter_map(|r| r.seconds_to_target).collect();
    let st = stat(steps.clone());
    let sec = stat(seconds.clone());
    let acc = stat(
        of.iter()
            .filter_map(|r| r.record.final_val_accuracy)
            .collect(),
    );
    let best = doc
        .per_batch
        .iter()
        .filter(|b| b.runs > 0 && b.reached == b.runs)
        .filter_map(|b| b.seconds_mean.map(|s| (b.batch, s)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(b, _)| b);
    let fixed_of = |f: fn(&SweepRun) -> Option<f64>| -> Vec<f64> {
        doc.runs
            .iter()
            .filter(|r| {
                r.device == first && r.record.schedule.is_none() && Some(r.record.batch) == best
            })
            .filter_map(f)
            .collect()
    };
    // Ratio of means and z of their difference (schedule minus fixed).
    let compare = |a: &[f64], b: &[f64]| {
        difference(a, b).map(|(ratio, diff, se)| (ratio, if se > 0.0 { diff / se } else { 0.0 }))
    };
    let complete = !of.is_empty() && seconds.len() == of.len();
    let secs = compare(&seconds, &fixed_of(|r| r.seconds_to_target)).filter(|_| complete);
    let steps_cmp = compare(&steps, &fixed_of(|r| r.steps_to_target)).filter(|_| complete);
    let beats = secs.is_some_and(|(_, z)| z < -2.0);
    let statement = match (secs, best) {
        (Some((r, z)), Some(b)) => format!(
            "the schedule took {:.0} % {} seconds to the target than the fastest fixed batch ({b}), {:.1} standard errors of the seeds: {}; {}",
            100.0 * (r - 1.0).abs(),
            if r < 1.0 { "fewer" } else { "more" },
            z.abs(),
            if beats {
                "it beats every fixed batch beyond the seeds' noise"
            } else if z > 2.0 {
                "the fixed batch is faster beyond the seeds' noise"
            } else {
                "within the seeds' noise"
            },
            match steps_cmp {
                Some((r, _)) => format!("{:.0} % {} steps", 100.0 * (r - 1.0).abs(), if r < 1.0 { "fewer" } else { "more" }),
                None => String::new(),
            }
        ),
        _ => "the schedule cannot be compared: it, or every fixed batch, did not reach the target in every run".to_string(),
    };
    ScheduleSummary {
        source: p.source,
        predicted_steps: predicted.map(|p| p.0),
        predicted_samples: predicted.map(|p| p.1),
        predicted_steps_best_fixed: segments
            .as_ref()
            .zip(best)
            .map(|(s, b)| predict(&Schedule::fixed(b, 1.0), s).0),
        schedule: p.schedule,
        runs: of.len(),
        reached: steps.len(),
        steps_mean: st.map(|s| s.0),
        steps_std: st.map(|s| s.1),
        samples_mean: stat(of.iter().filter_map(|r| r.samples_to_target).collect()).map(|s| s.0),
        seconds_mean: sec.map(|s| s.0),
        seconds_std: sec.map(|s| s.1),
        steps_error_pct: predicted.zip(st).map(|(p, m)| 100.0 * (p.0 - m.0) / m.0),
        val_loss_mean: stat(of.iter().filter_map(|r| r.record.final_val_loss).collect())
            .map(|s| s.0),
        val_accuracy_mean: acc.map(|s| s.0),
        val_accuracy_std: acc.map(|s| s.1),
        best_fixed: best,
        seconds_ratio: secs.map(|s| s.0),
        seconds_z: secs.map(|s| s.1),
        steps_ratio: steps_cmp.map(|s| s.0),
        steps_z: steps_cmp.map(|s| s.1),
        beats_best_fixed: beats,
        statement,
    }
}

const SETTINGS_FILE: &str = "sweep.json";

/// A run's record in `--out`: `run-b{batch}-s{seed}.json` on the first device
/// (`run-schedule-s{seed}.json` for the schedule), with the device's name in
/// front (`run-wgpu0-b…`) on the others.
fn run_file(dir: &Path, device: Option<&str>, batch: Option<u64>, seed: u64) -> PathBuf {
    let device: String = device
        .map(|d| format!("{}-", d.replace(':', "")))
        .unwrap_or_default();
    let what = batch.map_or("schedule".to_string(), |b| format!("b{b}"));
    dir.join(format!("run-{device}{what}-s{seed}.json"))
}

/// Checks `--out DIR` against the settings: a new sweep needs an empty (or new)
/// folder; a resumed one the same settings.
fn prepare_out(dir: &Path, settings: &SweepSettings, resume: bool) -> Result {
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

fn sweep_run(record: RunRecord, device: DeviceSpec, resumed: bool) -> SweepRun {
    SweepRun {
        device: device.to_string(),
        resumed,
        steps_to_target: None,
        seconds_to_target: None,
        samples_to_target: None,
        record,
    }
}

/// `noise`'s defaults (200 measurements, B_small 16, B_big 128, random
/// initial weights) at learning rate `lr`.
fn noise_settings(cfg: &SweepConfig, lr: f64) -> NoiseSettings {
    let (b_small, k) = SCHEDULE_NOISE_BATCH;
    NoiseSettings {
        lr,
        optimizer: cfg.optimizer,
        steps: 200,
        b_small,
        k,
        beta: None,
        batches: Vec::new(),
        reference: None,
        init: Init::Random,
        seed: 0,
        threads: cfg.threads,
    }
}

/// B_simple on the training split, with `noise`'s defaults at the reference learning rate.
fn measure_noise(
    cfg: &SweepConfig,
    graph: &batchfit_graph::Graph,
    train: &Dataset,
    seq_len: usize,
) -> Result<Option<(f64, f64, f64)>> {
    let flags = noise_settings(cfg, cfg.ref_lr);
    if flags.b_small * flags.k > train.rows {
        return Ok(None);
    }
    Ok(run_noise(&flags, graph, train, seq_len, |_| {})?.b_simple)
}

/// Target, steps to it, fits and the quality verdicts.
/// The steps, fits and quality are the first device's runs' (`first`); seconds to
/// target are compared across every device.
pub fn document(
    settings: SweepSettings,
    mut runs: Vec<SweepRun>,
    noise: Option<(f64, f64, f64)>,
    started: Instant,
    first: &str,
) -> SweepDocument {
    let finished = |r: &SweepRun| !matches!(r.record.status, RunStatus::Diverged { .. });
    let records: Vec<&RunRecord> = runs.iter().map(|r| &r.record).collect();
    let (target, source) = common_target(&settings, &records);
    for r in &mut runs {
        if let Some(t) = target
            && finished(r)
            && let Some((steps, seconds, samples)) = first_reach(&r.record.curve, t)
        {
            r.steps_to_target = Some(steps);
            r.seconds_to_target = Some(seconds);
            r.samples_to_target = Some(samples);
        }
    }
    // The schedule's runs share the target; the fits, tables and verdicts are the fixed batches'.
    let (scheduled, runs): (Vec<SweepRun>, Vec<SweepRun>) =
        runs.into_iter().partition(|r| r.record.schedule.is_some());
    let by_device = by_device(&settings, &runs);
    let runs_all = runs;
    let (runs, others): (Vec<SweepRun>, Vec<SweepRun>) =
        runs_all.into_iter().partition(|r| r.device == first);
    let points: Vec<(f64, f64)> = runs
        .iter()
        .filter_map(|r| r.steps_to_target.map(|s| (r.record.batch as f64, s)))
        .collect();
    let fit = fit_steps(&points);
    let noise = noise.map(|(b, low, high)| MeasuredNoise {
        b_simple: b,
        low,
        high: high.is_finite().then_some(high),
        s_min: fit_s_min(b, &points),
    });

    let stat = |v: Vec<f64>| -> (Option<f64>, Option<f64>) {
        if v.is_empty() {
            (None, None)
        } else {
            let (m, s) = mean_std(&v);
            (Some(m), Some(s))
        }
    };
    let steps_per_epoch = |b: u64| (settings.train_rows as u64 / b).max(1) as f64;
    let per_batch: Vec<BatchSummary> = settings
        .batches
        .iter()
        .map(|&b| {
            let of_b: Vec<&SweepRun> = runs.iter().filter(|r| r.record.batch == b).collect();
            let steps: Vec<f64> = of_b.iter().filter_map(|r| r.steps_to_target).collect();
            let (steps_mean, steps_std) = stat(steps.clone());
            let err = |pred: Option<f64>| pred.zip(steps_mean).map(|(p, m)| 100.0 * (p - m) / m);
            let steps_fitted = fit.map(|f| f.steps(b as f64));
            let steps_from_noise = noise.as_ref().and_then(|n| {
                n.s_min.map(|s_min| {
                    StepsCurve {
                        s_min,
                        b_noise: n.b_simple,
                    }
                    .steps(b as f64)
                })
            });
            let (val_loss_mean, val_loss_std) = stat(
                of_b.iter()
                    .filter_map(|r| r.record.final_val_loss)
                    .collect(),
            );
            let (val_accuracy_mean, val_accuracy_std) = stat(
                of_b.iter()
                    .filter_map(|r| r.record.final_val_accuracy)
                    .collect(),
            );
            BatchSummary {
                batch: b,
                lr: of_b.first().map_or(f64::NAN, |r| r.record.lr),
                runs: of_b.len(),
                reached: steps.len(),
                diverged: of_b.iter().filter(|r| !finished(r)).count(),
                steps_mean,
                steps_std,
                seconds_mean: stat(of_b.iter().filter_map(|r| r.seconds_to_target).collect()).0,
                epochs_mean: steps_mean.map(|s| s / steps_per_epoch(b)),
                steps_fitted,
                fitted_error_pct: err(steps_fitted),
                steps_from_noise,
                noise_error_pct: err(steps_from_noise),
                val_loss_mean,
                val_loss_std,
                val_accuracy_mean,
                val_accuracy_std,
            }
        })
        .collect();
    let groups = |f: fn(&RunRecord) -> Option<f64>| -> Vec<(u64, Vec<f64>)> {
        settings
            .batches
            .iter()
            .map(|&b| {
                (
                    b,
                    runs.iter()
                        .filter(|r| r.record.batch == b)
                        .filter_map(|r| f(&r.record))
                        .collect(),
                )
            })
            .collect()
    };
    let quality_loss = quality(&groups(|r| r.final_val_loss), false);
    let quality_accuracy = quality(&groups(|r| r.final_val_accuracy), true);
    SweepDocument {
        schema_version: batchfit_report::SCHEMA_VERSION,
        kind: "sweep",
        quality_statement: quality_statement(
            quality_loss.as_ref(),
            quality_accuracy.as_ref(),
            settings.seeds.len(),
        ),
        settings,
        target_loss: target,
        target_source: source,
        runs: runs.into_iter().chain(others).chain(scheduled).collect(),
        per_batch,
        by_device,
        fit,
        noise,
        quality_loss,
        quality_accuracy,
        verify: None,
        schedule: None,
        seconds: started.elapsed().as_secs_f64(),
    }
}

/// The loss every run is compared at, and where it comes from: `--target-loss`,
/// else the lowest loss every run that did not diverge reached.
fn common_target(settings: &SweepSettings, runs: &[&RunRecord]) -> (Option<f64>, String) {
    match settings.target_loss {
        Some(t) => (Some(t), "--target-loss".to_string()),
        None => {
            let t = runs
                .iter()
                .filter(|r| !matches!(r.status, RunStatus::Diverged { .. }))
                .map(|r| r.curve.iter().map(|p| p.loss).fold(f64::INFINITY, f64::min))
                .fold(f64::NEG_INFINITY, f64::max);
            (
                t.is_finite().then_some(t),
                format!(
                    "the lowest loss every run reached within {} epochs",
                    settings.max_epochs
                ),
            )
        }
    }
}

/// A finished sweep read back from its `--out` folder, for `advise
/// --from-sweep`: S(B) fitted to the first device's steps to target.
pub struct MeasuredSteps {
    pub settings: SweepSettings,
    pub target_loss: f64,
    pub curve: batchfit_tune::target::StepsCurve,
    /// Runs whose steps the fit used, and the batches.
    pub runs: usize,
    pub batches: Vec<u64>,
}

/// One run's record, or why it is not one (a file cut short by a full disk or
/// a kill before records were written whole, or edited by hand), naming it.
fn read_record(path: &Path) -> std::result::Result<RunRecord, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    serde_json::from_str(&text)
        .map_err(|e| format!("{} is not a sweep run record ({e})", path.display()))
}

/// Reads `DIR/sweep.json` and the first device's `DIR/run-b*-s*.json` and fits
/// S(B) to their steps to the sweep's target; exit 2 when the folder holds no
/// sweep or its steps do not follow S(B).
pub fn read_measured_steps(dir: &Path, progress: &dyn Progress) -> Result<MeasuredSteps> {
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
    let refs: Vec<&RunRecord> = records.iter().collect();
    let (target, _) = common_target(&settings, &refs);
    let Some(target) = target else {
        return Err(Error::input(format!(
            "--from-sweep {name}: no finished runs to take steps to a target from"
        )));
    };
    let points: Vec<(f64, f64)> = records
        .iter()
        .filter(|r| !matches!(r.status, RunStatus::Diverged { .. }))
        .filter_map(|r| first_reach(&r.curve, target).map(|(s, _, _)| (r.batch as f64, s)))
        .collect();
    let Some(curve) = fit_steps(&points) else {
        return Err(Error::input(format!(
            "--from-sweep {name}: the steps to target of its {} runs do not follow S(B) = S_min (1 + B_noise/B) (they need two or more batches whose steps fall with the batch no faster than 1/B)",
            points.len()
        )));
    };
    let mut batches: Vec<u64> = points.iter().map(|p| p.0 as u64).collect();
    batches.sort_unstable();
    batches.dedup();
    Ok(MeasuredSteps {
        settings,
        target_loss: target,
        curve,
        runs: points.len(),
        batches,
    })
}

/// Steps and seconds to target per batch on each device.
fn by_device(settings: &SweepSettings, runs: &[SweepRun]) -> Vec<DeviceTimes> {
    settings
        .device
        .split(',')
        .map(|device| {
            let per_batch: Vec<DeviceBatchTimes> = settings
                .batches
                .iter()
                .map(|&batch| {
                    let of: Vec<&SweepRun> = runs
                        .iter()
                        .filter(|r| r.device == device && r.record.batch == batch)
                        .collect();
                    let stat = |v: Vec<f64>| (!v.is_empty()).then(|| mean_std(&v));
                    let steps = stat(of.iter().filter_map(|r| r.steps_to_target).collect());
                    let seconds = stat(of.iter().filter_map(|r| r.seconds_to_target).collect());
                    DeviceBatchTimes {
                        batch,
                        runs: of.len(),
                        reached: of.iter().filter(|r| r.seconds_to_target.is_some()).count(),
                        steps_mean: steps.map(|s| s.0),
                        seconds_mean: seconds.map(|s| s.0),
                        seconds_std: seconds.map(|s| s.1),
                    }
                })
                .collect();
            let fastest = per_batch
                .iter()
                .filter(|b| b.reached == b.runs && b.runs > 0)
                .filter_map(|b| b.seconds_mean.map(|s| (b.batch, s)))
                .min_by(|a, b| a.1.total_cmp(&b.1))
                .map(|(b, _)| b);
            DeviceTimes {
                device: device.to_string(),
                per_batch,
                fastest,
            }
        })
        .collect()
}
