//! Timing training steps at one batch size, with warm-up and a stopping rule.

use crate::alloc;
use crate::data;
use crate::trainer::Trainer;
use batchfit_graph::Graph;
use batchfit_tune::stats::{StopRule, Summary, summarize};
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// What timing one batch size found.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PointResult {
    /// The batch size.
    pub batch: u64,
    /// Seconds of each timed step (after warm-up), device synchronised.
    pub step_times_s: Vec<f64>,
    /// Untimed steps before the timed ones.
    pub warmup_steps: usize,
    /// Bytes live at the high-water mark of the timed steps (counting allocator;
    /// `None` where the allocator does not see the device's memory).
    pub peak_bytes: Option<u64>,
    /// Peak resident set size of the process, for comparison.
    pub peak_rss_bytes: Option<u64>,
    /// Loss of the first warm-up step.
    pub first_loss: f32,
    /// Loss of the last timed step.
    pub last_loss: f32,
}

impl PointResult {
    /// Median, spread and outliers of the step times.
    pub fn summary(&self) -> Summary {
        summarize(&self.step_times_s)
    }
}

/// Why a measurement stopped early.
#[derive(Clone, Debug, Serialize, Deserialize, thiserror::Error)]
pub enum MeasureError {
    /// A step's loss was NaN or infinite.
    #[error("the loss became {loss} at step {step} (batch {batch})")]
    NonFiniteLoss {
        /// The step, counting warm-up steps from 0.
        step: usize,
        /// The batch size.
        batch: u64,
        /// The loss it gave.
        loss: f32,
    },
}

/// Runs `warmup` steps, then timed steps until `stop` is satisfied, on a synthetic batch.
pub fn measure_point(
    trainer: &mut Trainer,
    graph: &Graph,
    batch: u64,
    warmup: usize,
    stop: &StopRule,
) -> Result<PointResult, MeasureError> {
    let data = data::synthetic(
        graph,
        trainer.program.seq_len,
        batch as usize,
        trainer.config.seed,
        &trainer.device,
    );
    let mut first_loss = f32::NAN;
    let mut last_loss = f32::NAN;
    let mut check = |step: usize, loss: f32| -> Result<(), MeasureError> {
        if !loss.is_finite() {
            return Err(MeasureError::NonFiniteLoss { step, batch, loss });
        }
        if step == 0 {
            first_loss = loss;
        }
        last_loss = loss;
        Ok(())
    };
    // At least one warm-up step: the first step creates the optimizer state.
    let warmup = warmup.max(1);
    for s in 0..warmup {
        let loss = trainer.step(&data);
        check(s, loss)?;
    }
    trainer.sync();
    let mut times = Vec::new();
    let mut peak = 0u64;
    let counting = alloc::counting();
    while !stop.done(&times) {
        alloc::reset_peak();
        let t0 = Instant::now();
        let loss = trainer.step(&data);
        trainer.sync();
        times.push(t0.elapsed().as_secs_f64());
        peak = peak.max(alloc::peak_bytes());
        check(warmup + times.len() - 1, loss)?;
    }
    Ok(PointResult {
        batch,
        step_times_s: times,
        warmup_steps: warmup,
        peak_bytes: (counting && !trainer.config.device.is_gpu()).then_some(peak),
        peak_rss_bytes: alloc::peak_rss(),
        first_loss,
        last_loss,
    })
}
