//! Timing training steps at one batch size, with warm-up and a stopping rule.

use crate::alloc;
use crate::data;
use crate::trainer::Trainer;
use batchfit_graph::Graph;
use batchfit_plan::Bytes;
use batchfit_tune::stats::{StopRule, Summary, summarize};
use burn::tensor::Device;
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
    /// Peak memory. On the CPU: bytes live at the high-water mark of the timed
    /// steps (counting allocator). On a GPU: the most bytes the device runtime
    /// reserved after any step, warm-up included (CubeCL's pools keep their
    /// pages): what the device must have free.
    pub peak_bytes: Option<u64>,
    /// Peak resident set size of the process, for comparison.
    pub peak_rss_bytes: Option<u64>,
    /// Loss of the first warm-up step.
    pub first_loss: f32,
    /// Loss of the last timed step.
    pub last_loss: f32,
    /// Share of the machine's CPU time the hypervisor gave to other virtual
    /// machines while the steps were timed (steal time, /proc/stat); `None`
    /// where the system does not report it.
    #[serde(default)]
    pub cpu_steal_share: Option<f64>,
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
        /// The loss it gave (as text: JSON, which carries the answer from a worker, has
        /// no NaN or infinity).
        loss: String,
    },
    /// The device runtime reserved more than the memory limit: the step would
    /// not fit a device of that size.
    #[error(
        "the device reserved {} at step {step} (batch {batch}), over the limit of {}",
        Bytes(*.reserved),
        Bytes(*.limit)
    )]
    DeviceOutOfMemory {
        /// The step, counting warm-up steps from 0.
        step: usize,
        /// The batch size.
        batch: u64,
        /// Bytes the runtime held after the step.
        reserved: u64,
        /// The limit.
        limit: u64,
    },
}

/// Bytes a GPU's runtime holds in its memory pools (CubeCL's reserved
/// memory, padding and pages kept for reuse included); `None` on the CPU,
/// whose memory the counting allocator sees instead.
pub fn device_reserved(device: &Device) -> Option<u64> {
    device.memory_pool_usage().map(|u| u.bytes_reserved)
}

/// Runs `warmup` steps, then timed steps until `stop` is satisfied, on a synthetic batch.
/// On a GPU, `device_limit` fails the step after which the runtime holds more
/// than that many bytes, as a device of that size would have (CubeCL keeps
/// its pages until told to free them, so the reading after a step is the
/// step's high-water mark).
pub fn measure_point(
    trainer: &mut Trainer,
    graph: &Graph,
    batch: u64,
    warmup: usize,
    stop: &StopRule,
    device_limit: Option<u64>,
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
    let device = trainer.device.clone();
    let mut device_peak: Option<u64> = None;
    let mut check = |step: usize, loss: f32| -> Result<(), MeasureError> {
        if let Some(reserved) = device_reserved(&device) {
            device_peak = device_peak.max(Some(reserved));
            if let Some(limit) = device_limit.filter(|&l| reserved > l) {
                return Err(MeasureError::DeviceOutOfMemory {
                    step,
                    batch,
                    reserved,
                    limit,
                });
            }
        }
        if !loss.is_finite() {
            return Err(MeasureError::NonFiniteLoss {
                step,
                batch,
                loss: loss.to_string(),
            });
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
        trainer.sync();
        check(s, loss)?;
    }
    let mut times = Vec::new();
    let mut peak = 0u64;
    let counting = alloc::counting();
    let steal_before = cpu_steal_ticks();
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
        peak_bytes: if trainer.config.device.is_gpu() {
            device_peak
        } else {
            counting.then_some(peak)
        },
        peak_rss_bytes: alloc::peak_rss(),
        first_loss,
        last_loss,
        cpu_steal_share: steal_share(steal_before, cpu_steal_ticks()),
    })
}

/// The machine's stolen and total CPU ticks so far (`/proc/stat`'s `cpu` line),
/// `None` off Linux or where the line has no steal field.
fn cpu_steal_ticks() -> Option<(u64, u64)> {
    parse_steal(&std::fs::read_to_string("/proc/stat").ok()?)
}

/// Stolen and total ticks from `/proc/stat`'s text: the `cpu` line's eighth
/// field is steal; guest time (ninth, tenth) is already counted in user time.
fn parse_steal(stat: &str) -> Option<(u64, u64)> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    let steal = *ticks.get(7)?;
    Some((steal, ticks.iter().take(8).sum()))
}

/// The share of ticks stolen between two readings.
fn steal_share(before: Option<(u64, u64)>, after: Option<(u64, u64)>) -> Option<f64> {
    let ((s0, t0), (s1, t1)) = (before?, after?);
    (t1 > t0).then(|| s1.saturating_sub(s0) as f64 / (t1 - t0) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steal_is_read_from_the_cpu_line() {
        let stat = "cpu  100 0 50 800 10 0 5 35 0 0\ncpu0 50 0 25 400 5 0 2 18 0 0\n";
        assert_eq!(parse_steal(stat), Some((35, 1000)));
        // A kernel without the steal field, and no cpu line at all.
        assert_eq!(parse_steal("cpu  100 0 50 800 10 0 5\n"), None);
        assert_eq!(parse_steal("intr 5\n"), None);
        let share = steal_share(Some((35, 1000)), Some((85, 1200)));
        assert!((share.unwrap() - 0.25).abs() < 1e-12);
        assert_eq!(steal_share(Some((35, 1000)), Some((35, 1000))), None);
    }

    /// A diverged step reaches the parent as itself: its loss survives JSON, which has no
    /// NaN (a NaN written as `null` read back as an unreadable answer, a crash).
    #[test]
    fn a_non_finite_loss_survives_the_worker_answer() {
        let diverged = MeasureError::NonFiniteLoss {
            step: 3,
            batch: 8,
            loss: f32::NAN.to_string(),
        };
        let json = serde_json::to_string(&diverged).expect("serialises");
        let back: MeasureError = serde_json::from_str(&json).expect("reads back");
        assert_eq!(back.to_string(), "the loss became NaN at step 3 (batch 8)");
    }
}
