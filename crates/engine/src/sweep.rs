//! One run of a sweep: a real short training at one batch size on real data,
//! with warm-up, a target loss, validation per epoch and divergence caught.

use crate::data::from_rows;
use crate::trainer::{EngineError, TrainConfig, Trainer};
use batchfit_data::{Batcher, Dataset, Targets};
use batchfit_graph::Graph;
use batchfit_tune::schedule::Schedule;
use batchfit_tune::sweep::{CurvePoint, EpochRecord, RunRecord, RunStatus, first_reach};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use std::time::Instant;

/// Training rows whose loss decides when the target is reached: a fixed
/// subset, so every run is judged on the same rows and evaluation stays cheap.
pub const TARGET_ROWS: usize = 1024;
/// Evaluations of that loss per epoch (the resolution of steps to target).
pub const CHECKS_PER_EPOCH: u64 = 10;
/// Evaluations are also at least this share of the steps so far apart. An
/// evaluation between two steps evicts the step's data from the caches and
/// slows the next steps (measured +13 % at batch 256 and +25 % at 1,024 on
/// digits when it came after every step), so a run that takes one step per
/// epoch would time a slower loop than the training it stands for; linear
/// interpolation over 5 % of the steps keeps steps to target within a few
/// percent on a smooth loss curve.
const CHECK_SPACING: f64 = 0.05;
/// Rows per forward pass when evaluating.
const EVAL_CHUNK: usize = 512;

/// One run.
#[derive(Clone, Debug)]
pub struct RunSpec {
    /// Samples per step.
    pub batch: usize,
    /// Learning rate after warm-up.
    pub lr: f64,
    /// Learning rate at the first step; it rises linearly to `lr` over
    /// `warmup_steps` (Goyal et al. 2017 start from the small-batch rate).
    pub lr_start: f64,
    /// Steps of the linear warm-up.
    pub warmup_steps: u64,
    /// Initial weights and data order.
    pub seed: u64,
    /// Training loss that ends the run early, if any.
    pub target_loss: Option<f64>,
    /// Epochs at most.
    pub max_epochs: u32,
    /// A batch-size schedule in samples seen: it sets the batch and the rate of
    /// every step (no warm-up); `batch` and `lr` are then its first stage's.
    pub schedule: Option<Schedule>,
}

/// The rows of a training set of `rows` rows whose loss decides when a target
/// is reached: the same fixed subset for every run, whatever its seed, so
/// sweeps and the noise run judge by the same loss. `advise` trains on the
/// rows `sweep`'s default split trains on, so `sweep --verify` with that split
/// judges an advice's target on exactly the rows `advise` measured it on: on
/// other rows the level differs, and near a plateau a level 3 % higher is
/// never reached (statsmodels' fair, standardised: 0 of 3 seeds at any batch).
pub fn target_rows(rows: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..rows).collect();
    order.shuffle(&mut StdRng::seed_from_u64(0x5eed));
    order.truncate(TARGET_ROWS);
    order
}

/// When a run evaluates its training loss: [`CHECKS_PER_EPOCH`] times an
/// epoch, and at least 5 % of the steps so far apart.
#[derive(Clone, Debug)]
pub struct Checks {
    every: u64,
    next: u64,
}

impl Checks {
    /// For batches of `batch` from `rows` rows.
    pub fn new(rows: usize, batch: usize) -> Checks {
        let steps_per_epoch = (rows / batch.max(1)).max(1) as u64;
        let every = (steps_per_epoch / CHECKS_PER_EPOCH).max(1);
        Checks { every, next: every }
    }

    /// Whether to evaluate after `step` steps (and, if so, schedules the next).
    pub fn due(&mut self, step: u64) -> bool {
        if step < self.next {
            return false;
        }
        self.next = step + self.every.max((step as f64 * CHECK_SPACING).ceil() as u64);
        true
    }
}

/// A rate check's run: at most `max_steps` updates at `batch` and `lr` from
/// the initial weights `base` gives (the noise run's), shuffled by its seed,
/// until the loss on the fixed training rows ([`target_rows`]), evaluated as
/// a sweep evaluates it ([`Checks`]), reaches `target`. Returns that loss
/// before the first update and at the last evaluation, and the updates to the
/// target (interpolated between evaluations) when it was reached. A NaN loss
/// ends it at once.
pub fn run_to_target(
    graph: &Graph,
    base: &TrainConfig,
    data: &Dataset,
    batch: usize,
    lr: f64,
    target: f64,
    max_steps: u64,
) -> Result<(f64, f64, Option<f64>), EngineError> {
    let mut trainer = Trainer::new(graph, TrainConfig { lr, ..base.clone() })?;
    let rows = target_rows(data.rows);
    let start = training_loss(&trainer, graph, data, &rows);
    let mut checks = Checks::new(data.rows, batch);
    let mut batcher = Batcher::new(data.rows, base.seed);
    let mut last = (0.0, start);
    for step in 1..=max_steps {
        let idx = batcher.next(batch);
        let b = from_rows(data, graph, &idx, &trainer.device);
        if !trainer.step(&b).is_finite() {
            return Ok((start, f64::NAN, None));
        }
        if checks.due(step) || step == max_steps {
            let loss = training_loss(&trainer, graph, data, &rows);
            if !loss.is_finite() {
                return Ok((start, f64::NAN, None));
            }
            let now = (step as f64, loss);
            if let Some(at) = batchfit_tune::trajectory::reach(&[last, now], target) {
                return Ok((start, loss, Some(at)));
            }
            last = now;
        }
    }
    Ok((start, last.1, None))
}

/// The mean loss on rows `idx` of `data` at the current weights.
pub fn training_loss(trainer: &Trainer, graph: &Graph, data: &Dataset, idx: &[usize]) -> f64 {
    evaluate(trainer, graph, data, idx).0
}

/// Loss (and accuracy, for single-label classification) on rows `idx`.
fn evaluate(trainer: &Trainer, graph: &Graph, data: &Dataset, idx: &[usize]) -> (f64, Option<f64>) {
    let (mut loss, mut correct) = (0.0, 0usize);
    let labels = match &data.targets {
        Targets::Classes {
            labels, per_row: 1, ..
        } => Some(labels),
        _ => None,
    };
    for chunk in idx.chunks(EVAL_CHUNK) {
        let batch = from_rows(data, graph, chunk, &trainer.device);
        let out = trainer.program.forward(trainer.params(), &batch, false);
        if let Some(labels) = labels {
            let classes = out.dims()[1];
            let v = out
                .clone()
                .into_data()
                .try_to_vec::<f32>()
                .expect("outputs are f32");
            for (row, &r) in v.chunks(classes).zip(chunk) {
                let arg = row
                    .iter()
                    .enumerate()
                    .max_by(|a, b| a.1.total_cmp(b.1))
                    .map(|(i, _)| i);
                correct += usize::from(arg == Some(labels[r]));
            }
        }
        let l = trainer
            .program
            .loss(out, &batch.target)
            .into_scalar::<f32>();
        loss += f64::from(l) * chunk.len() as f64;
    }
    let n = idx.len() as f64;
    (loss / n, labels.map(|_| correct as f64 / n))
}

/// One timed step of a run.
#[derive(Clone, Copy, Debug)]
struct TimedStep {
    seconds: f64,
    /// The step came right after an evaluation of the loss.
    after_check: bool,
    batch: usize,
}

/// A run's step times, read without the cost batchfit's own checks add.
///
/// An evaluation between two steps evicts the weights, the optimizer state
/// and the step's buffers from the caches, and the step after it refills
/// them: +60 to +100 us a step on digits at batches 16 to 128 (+30 to +60 %),
/// nothing measurable at 512 and over. A small data set is evaluated after
/// nearly every step early on and takes few steps, so this cost, which a
/// training without batchfit's checks never pays, would weigh most on the
/// batches with the fewest steps and bend time to target towards them.
#[derive(Debug, Default)]
struct StepClock {
    steps: Vec<TimedStep>,
}

impl StepClock {
    /// Seconds after each number of steps (index 0: none), a step that came
    /// after an evaluation counted at the mean time of the steps at its batch
    /// that did not (at its own time where every step at its batch did).
    fn elapsed(&self) -> Vec<f64> {
        let mut plain: std::collections::HashMap<usize, (f64, u32)> = Default::default();
        for s in self.steps.iter().filter(|s| !s.after_check) {
            let e = plain.entry(s.batch).or_default();
            *e = (e.0 + s.seconds, e.1 + 1);
        }
        let mut out = Vec::with_capacity(self.steps.len() + 1);
        out.push(0.0);
        let mut total = 0.0;
        for s in &self.steps {
            total += match plain.get(&s.batch) {
                Some(&(sum, n)) if s.after_check => sum / f64::from(n),
                _ => s.seconds,
            };
            out.push(total);
        }
        out
    }
}

/// The rows whose loss the curve records and the target is judged on: a
/// data set and row indices into it.
#[derive(Clone, Copy, Debug)]
pub struct JudgedOn<'a> {
    pub data: &'a Dataset,
    pub rows: &'a [usize],
}

/// Trains `spec` on `train`, validating on `val`, its curve's loss on
/// `judged` (the training split's [`target_rows`] unless a target was
/// measured on other rows). `progress` sees the share of the epoch budget
/// done (a run that reaches its target ends early).
pub fn train_run(
    graph: &Graph,
    base: &TrainConfig,
    train: &Dataset,
    val: &Dataset,
    judged: JudgedOn,
    spec: &RunSpec,
    mut progress: impl FnMut(f64),
) -> Result<RunRecord, EngineError> {
    // As the probe's workers do: a step that page-faults its tensors in again
    // would be timed slower than the probe timed it (+30 to +60 % at batch
    // 1,024 on digits, where evaluations between steps freed their memory).
    crate::alloc::keep_freed_memory();
    let mut trainer = Trainer::new(
        graph,
        TrainConfig {
            lr: spec.lr_start,
            seed: spec.seed,
            ..base.clone()
        },
    )?;
    let val_rows: Vec<usize> = (0..val.rows).collect();

    let steps_per_epoch = (train.rows / spec.batch).max(1) as u64;
    let mut checks = Checks::new(train.rows, spec.batch);
    let mut samples = 0u64;
    let mut batcher = Batcher::new(train.rows, spec.seed);
    let mut curve = vec![CurvePoint {
        step: 0,
        seconds: 0.0,
        samples: 0,
        loss: evaluate(&trainer, graph, judged.data, judged.rows).0,
    }];
    let mut epochs = Vec::new();
    let mut step = 0u64;
    let mut clock = StepClock::default();
    let mut after_check = true;
    let mut status = RunStatus::Budget;
    let reached = |loss: f64| spec.target_loss.is_some_and(|t| loss <= t);
    'epochs: for epoch in 1..=spec.max_epochs {
        let mut epoch_loss = 0.0;
        let mut epoch_steps = 0u64;
        let mut epoch_samples = 0usize;
        let mut checked = false;
        loop {
            // An epoch is as many whole batches as its rows hold (the rest is
            // dropped), at least one: rows / batch steps for a fixed batch.
            let (batch_size, lr) = match &spec.schedule {
                Some(s) => {
                    let stage = s.at(samples);
                    (stage.batch as usize, stage.lr)
                }
                None if step < spec.warmup_steps => {
                    let t = (step + 1) as f64 / spec.warmup_steps as f64;
                    (spec.batch, spec.lr_start + t * (spec.lr - spec.lr_start))
                }
                None => (spec.batch, spec.lr),
            };
            if epoch_steps > 0 && epoch_samples + batch_size > train.rows {
                break;
            }
            trainer.config.lr = lr;
            let started = Instant::now();
            let idx = batcher.next(batch_size);
            let batch = from_rows(train, graph, &idx, &trainer.device);
            let loss = f64::from(trainer.step(&batch));
            trainer.sync();
            clock.steps.push(TimedStep {
                seconds: started.elapsed().as_secs_f64(),
                after_check,
                batch: batch_size,
            });
            after_check = false;
            step += 1;
            samples += batch_size as u64;
            epoch_samples += batch_size;
            if !loss.is_finite() {
                status = RunStatus::Diverged {
                    step,
                    loss: (!loss.is_nan()).then_some(loss),
                };
                break 'epochs;
            }
            epoch_loss += loss;
            epoch_steps += 1;
            if checks.due(step) {
                checked = true;
                after_check = true;
                let loss = evaluate(&trainer, graph, judged.data, judged.rows).0;
                curve.push(CurvePoint {
                    step,
                    seconds: 0.0, // set from the clock below
                    samples,
                    loss,
                });
                if !loss.is_finite() {
                    status = RunStatus::Diverged {
                        step,
                        loss: (!loss.is_nan()).then_some(loss),
                    };
                    break 'epochs;
                }
                if reached(loss) {
                    status = RunStatus::Reached;
                    break 'epochs;
                }
            }
            progress(
                ((epoch - 1) as f64 + (epoch_samples as f64 / train.rows as f64).min(1.0))
                    / spec.max_epochs as f64,
            );
        }
        // Validated in the epochs the curve was evaluated in (every epoch of a
        // run with ten or more steps per epoch), and the last.
        if !checked && epoch < spec.max_epochs {
            continue;
        }
        let (val_loss, val_accuracy) = evaluate(&trainer, graph, val, &val_rows);
        after_check = true;
        epochs.push(EpochRecord {
            epoch,
            step,
            seconds: 0.0, // set from the clock below
            train_loss: epoch_loss / epoch_steps.max(1) as f64,
            val_loss,
            val_accuracy,
        });
    }
    let (final_val_loss, final_val_accuracy) = match status {
        RunStatus::Diverged { .. } => (None, None),
        // Ended mid-epoch at the target: validate where it stopped.
        RunStatus::Reached => {
            let (l, a) = evaluate(&trainer, graph, val, &val_rows);
            (Some(l), a)
        }
        RunStatus::Budget => epochs
            .last()
            .map_or((None, None), |e| (Some(e.val_loss), e.val_accuracy)),
    };
    let elapsed = clock.elapsed();
    for p in &mut curve {
        p.seconds = elapsed[p.step as usize];
    }
    for e in &mut epochs {
        e.seconds = elapsed[e.step as usize];
    }
    let seconds = elapsed[step as usize];
    let at_target = spec.target_loss.and_then(|t| first_reach(&curve, t));
    let per_epoch = steps_per_epoch as f64;
    Ok(RunRecord {
        batch: spec.batch as u64,
        seed: spec.seed,
        lr: spec.lr,
        warmup_steps: spec.warmup_steps,
        target_loss: spec.target_loss,
        status,
        steps_to_target: at_target.map(|a| a.0),
        epochs_to_target: at_target.map(|a| match spec.schedule {
            Some(_) => a.2 / train.rows as f64,
            None => a.0 / per_epoch,
        }),
        samples_to_target: at_target.map(|a| a.2),
        seconds_to_target: at_target.map(|a| a.1),
        steps: step,
        seconds,
        curve,
        epochs,
        final_val_loss,
        final_val_accuracy,
        schedule: spec.schedule.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timed(seconds: f64, after_check: bool, batch: usize) -> TimedStep {
        TimedStep {
            seconds,
            after_check,
            batch,
        }
    }

    #[test]
    fn a_step_after_a_check_counts_at_its_batchs_plain_mean() {
        let clock = StepClock {
            steps: vec![
                timed(9.0, true, 4), // after the first evaluation
                timed(1.0, false, 4),
                timed(3.0, false, 4),
                timed(7.0, true, 4),
                timed(5.0, true, 8), // no plain step at 8: its own time
                timed(2.0, false, 16),
            ],
        };
        assert_eq!(clock.elapsed(), vec![0.0, 2.0, 3.0, 6.0, 8.0, 13.0, 15.0]);
    }

    #[test]
    fn a_run_without_checks_is_its_sum() {
        let clock = StepClock {
            steps: vec![timed(1.5, false, 2), timed(2.5, false, 2)],
        };
        assert_eq!(clock.elapsed(), vec![0.0, 1.5, 4.0]);
        assert_eq!(StepClock::default().elapsed(), vec![0.0]);
    }
}
