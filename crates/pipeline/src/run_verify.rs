//! `run --verify RUN.json -- CMD`: `run`'s time-to-target prediction held
//! against trainings of the user's own command: the recommended batch and its
//! neighbours, at the rates the run trained them at, each trial ended when its
//! reported losses reach the run's target. `batchfit_tune::verify` puts
//! predicted beside measured, as for `sweep --verify`.

use crate::run::{RUN_TRIAL_SEED, RunConfig};
use crate::{Error, Progress, Result};
use batchfit_exec::{CommandTemplate, StepReader, TrialOptions, run_trial};
use batchfit_tune::run::{LossTarget, RunRate};
use batchfit_tune::target::TimeToTarget;
use batchfit_tune::verify::{
    CheckedRun, Measured, Predicted, RunVerifyReport, VerifyTrial, verify,
};
use serde::Deserialize;
use std::path::Path;

/// The parts of `run --json` a check needs.
#[derive(Deserialize)]
struct RunFile {
    kind: String,
    time_to_target: Vec<TimeToTarget>,
    recommendation: Option<RecommendedBatch>,
    target_loss: Option<f64>,
    noise: Option<NoiseSteps>,
    learning_rate: RunRate,
}

#[derive(Deserialize)]
struct RecommendedBatch {
    recommended_batch: Option<u64>,
    /// Absent in documents before it.
    #[serde(default)]
    tied_batches: Vec<u64>,
}

#[derive(Deserialize)]
struct NoiseSteps {
    steps: usize,
    /// Absent in the JSON of runs before the fixed rows' loss.
    #[serde(default)]
    target_on_fixed_rows: bool,
}

/// Reads `run --json` output; exit 2 when it is not one or predicts no steps.
pub fn read_run_advice(path: &Path) -> Result<CheckedRun> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::input_because(format!("--verify {name}"), e))?;
    let file: RunFile = serde_json::from_str(&text).map_err(|e| {
        Error::input_because(
            format!("--verify {name}: not the JSON of `batchfit run --json`"),
            e,
        )
    })?;
    if file.kind != "run" {
        return Err(Error::input(format!(
            "--verify {name}: a `{}` document; give the JSON of `batchfit run --json`",
            file.kind
        )));
    }
    if let RunRate::Handed { scaling, .. } = &file.learning_rate
        && let Some(why) = scaling.invalid()
    {
        return Err(Error::input(format!(
            "--verify {name}: learning_rate: {why}; give the file `batchfit run --json` wrote"
        )));
    }
    let (Some(target), Some(noise)) = (file.target_loss, file.noise) else {
        return Err(Error::input(format!(
            "--verify {name}: the run predicts no time to target (its command printed no noise \
             measurements and losses: docs/run.md)"
        )));
    };
    let Some((recommended, tied)) = file
        .recommendation
        .and_then(|r| r.recommended_batch.map(|b| (b, r.tied_batches)))
        .filter(|&(b, _)| b > 0)
    else {
        return Err(Error::input(format!(
            "--verify {name}: the run recommends no batch"
        )));
    };
    let mut predicted: Vec<Predicted> = file
        .time_to_target
        .iter()
        .filter(|t| t.option.accumulation == 1)
        .filter_map(|t| {
            t.steps.map(|steps| Predicted {
                batch: t.option.micro_batch,
                steps,
                seconds: t.seconds,
            })
        })
        .collect();
    predicted.sort_by_key(|p| p.batch);
    Ok(CheckedRun {
        path: name,
        recommended,
        tied,
        predicted,
        target: LossTarget::of_run(target, noise.steps).on(noise.target_on_fixed_rows),
        rate: file.learning_rate,
    })
}

/// Trains `batches` (empty: the recommended one and its neighbours) under
/// `seeds` seeds each, to the run's target.
pub fn run_verify(
    cfg: &RunConfig,
    advice: &CheckedRun,
    batches: &[u64],
    seeds: u64,
    progress: &dyn Progress,
) -> Result<RunVerifyReport> {
    let template = CommandTemplate::new(cfg.command.clone())?;
    let batches = if batches.is_empty() {
        advice.default_batches()
    } else {
        batches.to_vec()
    };
    let mut predicted = Vec::new();
    for &b in &batches {
        match advice.predicted.iter().find(|p| p.batch == b) {
            Some(p) => predicted.push(*p),
            None => {
                return Err(Error::input(format!(
                    "--batches {b}: {} predicts no steps at batch {b} (its table has {})",
                    advice.path,
                    advice
                        .predicted
                        .iter()
                        .map(|p| p.batch.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
        }
    }
    let lr = match advice.rate {
        RunRate::Handed { scaling, .. } => Some(scaling),
        RunRate::CommandsOwn { .. } if template.takes_lr() => {
            return Err(Error::input(format!(
                "the command takes {{lr}}, but the run of {} trained at the command's own rate: \
                 verify the command as it ran",
                advice.path
            )));
        }
        RunRate::CommandsOwn { .. } => None,
    };
    if let Some(l) = &cfg.launcher {
        l.check()?;
    }
    batchfit_exec::interrupt::set_message(
        "the running trial's process tree was ended; no report was written",
    );
    let opts = TrialOptions {
        timeout: cfg.timeout,
        reader: StepReader::Protocol,
        warmup_steps: cfg.warmup_steps,
        echo: cfg.show_output,
        memory_limit: cfg.memory_limit.map(|b| b.0),
        launcher: cfg.launcher.clone(),
        lr,
        seed: None,
        stop_at: Some(advice.target),
        noise_every: None,
    };
    progress.add_length(batches.len() as u64 * seeds);
    let mut trials = Vec::new();
    let mut measured = Vec::new();
    for &b in &batches {
        let mut m = Measured {
            batch: b,
            runs: 0,
            steps: Vec::new(),
            seconds: Vec::new(),
        };
        // Seeds the run's own trials did not train with.
        for seed in (RUN_TRIAL_SEED + 1)..=(RUN_TRIAL_SEED + seeds) {
            progress.message(format!("batch {b}, seed {seed}: training to the target"));
            let result = run_trial(
                &template,
                b,
                &TrialOptions {
                    seed: Some(seed),
                    ..opts.clone()
                },
                &mut |steps| progress.message(format!("batch {b}, seed {seed}: {steps} steps")),
            );
            progress.advance(1);
            if let batchfit_tune::trial::Outcome::NotStarted(why) = &result.outcome {
                return Err(Error::input(format!("{why}; check the command after `--`")));
            }
            let reached = result
                .outcome
                .ran()
                .then(|| advice.target.steps_to(&result.reports, cfg.warmup_steps))
                .flatten();
            m.runs += 1;
            if let Some((steps, seconds)) = reached {
                m.steps.push(steps);
                m.seconds.push(seconds);
            }
            trials.push(VerifyTrial {
                batch: b,
                seed,
                steps_to_target: reached.map(|r| r.0),
                seconds_to_target: reached.map(|r| r.1),
                result,
            });
        }
        measured.push(m);
    }
    let (rows, verdict) = verify(&predicted, &measured, advice.recommended, &advice.tied);
    Ok(RunVerifyReport {
        advice: advice.path.clone(),
        command: template.display(),
        target: advice.target,
        learning_rate: advice.rate,
        seeds,
        rows,
        verdict,
        trials,
    })
}
