//! `sweep`: real short trainings at several batch sizes and seeds on real
//! data, with validation, to test the noise-scale predictions and answer "does
//! this batch size hurt quality?". This module trains the runs and keeps their
//! records (`crate::sweep_out`); what they conclude is `batchfit_tune::sweep`'s.

use crate::noise::{DataSource, NoiseSettings, load_data, run_noise};
use crate::output::check_html_output;
use crate::sweep_out::{prepare_out, read_record, run_file, write_record};
use crate::{Error, Progress, Result};
use batchfit_data::Dataset;
pub use batchfit_data::{DEFAULT_SPLIT_SEED, DEFAULT_VAL_SPLIT};
use batchfit_engine::sweep::{JudgedOn, RunSpec, target_rows, train_run};
use batchfit_engine::{DeviceSpec, TrainConfig};
use batchfit_plan::Optimizer;
use batchfit_tune::basis::{prediction_basis, prediction_basis_to};
use batchfit_tune::lr::{LrRule, LrScaling};
use batchfit_tune::noise::{DEFAULT_B_SMALL, DEFAULT_K, NoiseRun};
use batchfit_tune::schedule::{Schedule, powers_of_two, ramp};
use batchfit_tune::sweep::summary::{measured_for_verify, run_order, warmup_steps};
use batchfit_tune::sweep::{
    ScheduleSource, SweepRun, SweepSettings, SweepSummary, schedule_summary, summarize,
};
use batchfit_tune::verify::{CheckedAdvice, VerifyReport};
use std::path::PathBuf;
use std::time::Instant;

pub use crate::sweep_out::read_measured_steps;

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
    /// Seeds per batch: 0, 1, ...; under `verify`, from the advice's
    /// [`CheckedAdvice::first_seed`].
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
    pub verify: Option<CheckedAdvice>,
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

/// The checks on the flags that need the data: the batches in the order
/// given, each once, none above the training rows; the devices each once.
/// Checking an advice by default (its recommended batch and neighbours), a
/// neighbour above the training rows is left out: the advice ranks batches
/// up to the rows the default split trains on, and a larger `--val-split`
/// holds more out.
fn check(cfg: &SweepConfig, train: &Dataset) -> Result<Vec<u64>> {
    let by_default = cfg
        .verify
        .as_ref()
        .filter(|a| a.default_batches() == cfg.batches);
    let mut batches: Vec<u64> = Vec::new();
    for &b in &cfg.batches {
        let neighbour_too_big =
            b as usize > train.rows && by_default.is_some_and(|a| a.recommended != b);
        if !batches.contains(&b) && !neighbour_too_big {
            batches.push(b);
        }
    }
    if batches.is_empty() {
        return Err(Error::input("--batches: give at least one batch size"));
    }
    if let Some(&b) = batches.iter().find(|&&b| b as usize > train.rows) {
        let whose = if by_default.is_some() {
            ", the advice's recommended batch (a smaller --val-split holds fewer rows out)"
        } else {
            ""
        };
        return Err(Error::input(format!(
            "--batches: {b} exceeds the {} training rows of {}{whose}",
            train.rows, train.source
        )));
    }
    if cfg.devices.is_empty() {
        return Err(Error::input("--device: give at least one device"));
    }
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
    Ok(batches)
}

/// Runs the sweep and summarises it.
pub fn sweep(cfg: &SweepConfig, progress: &dyn Progress) -> Result<SweepSummary> {
    let started = Instant::now();
    let default_model = cfg.model.is_none();
    let graph = batchfit_graph::load_trainable(
        cfg.model.as_deref().unwrap_or(crate::DEFAULT_MODEL),
        cfg.data.loss.as_ref(),
    )?;
    batchfit_engine::model::check_trainable(&graph)?;
    let seq_len = graph.default_seq_len.unwrap_or(1);
    let (data, _) = load_data(&cfg.data, &graph, seq_len, default_model)?;
    if data.rows < 4 {
        return Err(Error::input(format!(
            "{}: {} rows are too few to split into training and validation",
            data.source, data.rows
        )));
    }
    let (train_rows, val_rows) = data.split_rows(cfg.val_split, cfg.split_seed);
    let (train, val) = (data.subset(&train_rows), data.subset(&val_rows));
    let batches = check(cfg, &train)?;
    // A loss level is a property of the rows it is measured on: `advise`
    // trains on the rows the default split trains on and measures its target
    // on their fixed rows, so with that split a check judges on the very rows
    // (another subset puts a heavy-tailed target at another level: randhie's
    // visit counts, 17 against 25 before any step).
    let judged_rows = target_rows(train.rows);
    let judged = JudgedOn {
        data: &train,
        rows: &judged_rows,
    };
    let smallest = *batches.iter().min().expect("checked: at least one");
    if let Some(p) = &cfg.html {
        check_html_output("--html", p)?;
    }
    if let Some(n) = cfg.threads {
        let _ = batchfit_engine::set_threads(n);
    }
    let rule = cfg
        .lr_rule
        .unwrap_or_else(|| LrRule::for_optimizer(cfg.optimizer.is_adaptive()));
    let ref_batch = cfg.ref_batch.unwrap_or(smallest);
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
        devices: cfg.devices.clone(),
        train_rows: train.rows,
        val_rows: val.rows,
        val_split: cfg.val_split,
        split_seed: cfg.split_seed,
        batches: batches.clone(),
        // A check trains from seeds the advice's own trainings did not use.
        seeds: {
            let first = cfg.verify.as_ref().map_or(0, |a| a.first_seed);
            (first..first + cfg.seeds).collect()
        },
        optimizer: cfg.optimizer,
        lr_rule: rule,
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

    let order = run_order(&settings, planned.is_some());
    progress.set_length(order.len() as u64 * UNIT);
    let first_device = settings.first_device();
    let mut runs: Vec<SweepRun> = Vec::new();
    for (i, &(device, fixed, seed)) in order.iter().enumerate() {
        let schedule = match fixed {
            Some(_) => None,
            None => planned.as_ref().map(|p| p.schedule.clone()),
        };
        let batch = fixed.unwrap_or_else(|| schedule.as_ref().map_or(0, |s| s.stages[0].batch));
        let file = cfg.out.as_ref().map(|d| {
            let tag = (device != first_device).then_some(device);
            run_file(d, tag, fixed, seed)
        });
        if cfg.resume
            && let Some(f) = &file
            && f.exists()
        {
            // A record is this run's only where it says so: one edited or
            // copied from another run is trained again, not read as this one.
            let this_run = |r: &batchfit_tune::sweep::RunRecord| match fixed {
                Some(b) => r.batch == b && r.seed == seed,
                None => r.seed == seed,
            };
            match read_record(f).and_then(|r| match this_run(&r) {
                true => Ok(r),
                false => Err(format!(
                    "{} holds the run at batch {}, seed {}, not this one",
                    f.display(),
                    r.batch,
                    r.seed
                )),
            }) {
                Ok(record) => {
                    runs.push(SweepRun::new(record, device, true));
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
        let spec = RunSpec {
            batch: batch as usize,
            lr,
            lr_start: cfg.ref_lr.min(lr),
            warmup_steps: match schedule {
                Some(_) => 0,
                None => warmup_steps(cfg.warmup_epochs, train.rows, batch, ref_batch),
            },
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
        let base = TrainConfig {
            optimizer: cfg.optimizer,
            lr: cfg.ref_lr,
            seq_len,
            seed: 0,
            device,
            init_random: true,
        };
        let record = train_run(&graph, &base, &train, &val, judged, &spec, |done| {
            progress.set_position(i as u64 * UNIT + (done * UNIT as f64) as u64);
        })?;
        if let Some(f) = &file {
            write_record(f, &record)?;
        }
        runs.push(SweepRun::new(record, device, false));
        progress.set_position((i as u64 + 1) * UNIT);
    }

    let noise = if cfg.no_noise {
        None
    } else {
        crate::noise::b_simple_on(
            &NoiseSettings::defaults(cfg.optimizer, cfg.ref_lr, cfg.threads),
            &graph,
            &train,
            seq_len,
        )?
    };
    let mut summary = summarize(settings, runs, noise, started.elapsed().as_secs_f64());
    if let Some(p) = planned {
        let segments = summary
            .target_loss
            .and_then(|t| prediction_basis_to(&p.noise, scaling.rule, p.reference, Some(t)))
            .map(|b| b.segments().to_vec())
            .filter(|s| !s.is_empty());
        summary.schedule = Some(schedule_summary(
            p.source,
            p.schedule,
            segments.as_deref(),
            &summary,
        ));
    }
    if let Some(advice) = &cfg.verify {
        summary.verify = Some(VerifyReport::new(advice, &measured_for_verify(&summary)));
    }
    summary.seconds = started.elapsed().as_secs_f64();
    Ok(summary)
}

/// A schedule to train, and the noise run that predicts its steps.
struct PlannedSchedule {
    schedule: Schedule,
    /// The rate cap the noise run's B_noise implies (never below its batch).
    cap: Option<u64>,
    source: ScheduleSource,
    noise: NoiseRun,
    reference: (u64, f64),
}

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
    let big = DEFAULT_B_SMALL * DEFAULT_K;
    if big > train.rows {
        return Err(Error::input(format!(
            "--schedule: the noise run behind it needs {big} training rows; {} has {}",
            train.source, train.rows
        )));
    }
    let settings = NoiseSettings::defaults(cfg.optimizer, scaling.at(big as u64), cfg.threads);
    progress.message("noise scale along a run, for the schedule".into());
    let noise = run_noise(&settings, graph, train, seq_len, |_| {})?;
    let reference = (scaling.ref_batch, scaling.ref_lr);
    let basis =
        prediction_basis(&noise, scaling.rule, reference).filter(|b| !b.segments().is_empty());
    let cap = basis.as_ref().and_then(|b| b.lr.cap_batch);
    let (schedule, source) = match choice {
        ScheduleChoice::Given { schedule, source } => {
            (schedule.clone(), ScheduleSource::File(source.clone()))
        }
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
            let lo = *batches.iter().min().unwrap_or(&1);
            let hi = *batches.iter().max().unwrap_or(&1);
            let r = ramp(
                basis.segments(),
                &powers_of_two(lo, hi),
                &scaling,
                basis.curve.rows,
            )
            .ok_or_else(|| {
                Error::input("--schedule ramp: the noise run has no stretch to build it from")
            })?;
            (r.schedule, ScheduleSource::Ramp)
        }
    };
    Ok(PlannedSchedule {
        schedule,
        cap,
        source,
        noise,
        reference,
    })
}
