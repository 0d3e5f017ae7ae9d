//! Diagnosis from measurements: each rule fires with the numbers behind it, or stays silent.

use serde::Serialize;

/// One finding, with the figures that support it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Finding {
    /// Stable identifier (`flat_throughput`, `fixed_overhead`, ...).
    pub rule: &'static str,
    pub message: String,
}

/// A measured point of the throughput curve: batch, median step seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepPoint {
    pub batch: u64,
    pub step_s: f64,
    /// Standard error of `step_s` relative to it (0 when unknown).
    pub rel_err: f64,
}

impl StepPoint {
    pub fn samples_per_s(&self) -> f64 {
        self.batch as f64 / self.step_s
    }
}

/// Throughput flat above some batch: a bigger batch then only cuts updates per
/// epoch (the dual-input regressor: 512 -> 8192 made training slower). Fires when the largest
/// measured batch is at least 4x a smaller one yet under 15 % faster per sample.
pub fn flat_throughput(points: &[StepPoint], device: &str) -> Option<Finding> {
    let largest = points.iter().max_by_key(|p| p.batch)?;
    let flat_from = points
        .iter()
        .filter(|p| p.batch * 4 <= largest.batch)
        .filter(|p| largest.samples_per_s() < 1.15 * p.samples_per_s())
        .min_by_key(|p| p.batch)?;
    let gain = largest.samples_per_s() / flat_from.samples_per_s() - 1.0;
    Some(Finding {
        rule: "flat_throughput",
        message: format!(
            "{device}: from batch {} to {} throughput changes by {:+.0} % ({:.0} -> {:.0} samples/s) while updates per epoch fall {}x; above batch {} a bigger batch mostly means fewer, not faster, updates",
            flat_from.batch,
            largest.batch,
            100.0 * gain,
            flat_from.samples_per_s(),
            largest.samples_per_s(),
            largest.batch / flat_from.batch,
            flat_from.batch
        ),
    })
}

/// Fits `step = fixed + per_sample x B` by least squares.
pub fn step_line(points: &[StepPoint]) -> Option<(f64, f64)> {
    let pts: Vec<(u64, f64)> = points.iter().map(|p| (p.batch, p.step_s)).collect();
    crate::search::Line::fit(&pts).map(|l| (l.fixed, l.per_sample))
}

/// A large fixed cost per step (launch or dispatch overhead, a small model): at
/// small batches the device mostly waits (a GPU at 5 % utilisation). Fires when the
/// fitted fixed time is over half the step at the smallest measured batch.
pub fn fixed_overhead(points: &[StepPoint], device: &str) -> Option<Finding> {
    let (fixed, per) = step_line(points)?;
    let small = points.iter().min_by_key(|p| p.batch)?;
    let share = fixed / small.step_s;
    (fixed > 0.0 && share > 0.5).then(|| Finding {
        rule: "fixed_overhead",
        message: format!(
            "{device}: each step costs about {:.2} ms whatever the batch (fit: {:.2} ms + {:.3} ms per sample); at batch {} that is {:.0} % of the step, so the device is mostly idle: raise the batch{}",
            fixed * 1e3,
            fixed * 1e3,
            per * 1e3,
            small.batch,
            100.0 * share.min(1.0),
            if device.starts_with("cuda") || device.starts_with("wgpu") {
                " or train this model on the CPU"
            } else {
                ""
            }
        ),
    })
}

/// The GPU sat idle much of the time (NVML's utilisation: the share of time a
/// kernel ran). Fires below half: the step is then bound by something else
/// than the GPU (input pipeline, Python overhead, synchronisation).
pub fn gpu_idle(util_mean_pct: f64, batch: u64, device: &str) -> Option<Finding> {
    (util_mean_pct < 50.0).then(|| Finding {
        rule: "gpu_idle",
        message: format!(
            "{device}: at batch {batch} the GPU ran kernels {util_mean_pct:.0} % of the time (NVML, measured): the step waits on something else (input pipeline, Python overhead, synchronisation); raise the batch, or prefetch and overlap data loading"
        ),
    })
}

/// Input pipeline bound: preparing a batch takes a large share of the step.
pub fn input_bound(load_s: f64, step_s: f64, batch: u64, device: &str) -> Option<Finding> {
    let share = load_s / (load_s + step_s);
    (share > 0.2).then(|| Finding {
        rule: "input_pipeline",
        message: format!(
            "{device}: at batch {batch} preparing a batch takes {:.2} ms against {:.2} ms of compute ({:.0} % of the time): the input pipeline limits training; prefetch or prepare batches in parallel",
            load_s * 1e3,
            step_s * 1e3,
            100.0 * share
        ),
    })
}

/// The batch is far above the critical batch: many more epochs will be needed.
pub fn above_critical(batch: u64, critical: f64) -> Option<Finding> {
    (batch as f64 > 4.0 * critical).then(|| Finding {
        rule: "above_critical_batch",
        message: format!(
            "batch {batch} is {:.0}x the critical batch ({critical:.0}): it needs about {:.1}x the epochs of a small batch to reach the same loss (E(B) = E_min (1 + B/B_noise))",
            batch as f64 / critical,
            1.0 + batch as f64 / critical
        ),
    })
}

/// The recommended batch sits within 10 % of the memory limit.
pub fn near_memory_limit(batch: u64, max_batch: u64, device: &str) -> Option<Finding> {
    (max_batch > 0 && batch as f64 > 0.9 * max_batch as f64).then(|| {
        let safe = ((max_batch as f64 * 0.9).floor() as u64).max(1);
        Finding {
            rule: "near_memory_limit",
            message: format!(
                "{device}: batch {batch} is within 10 % of the largest that fits ({max_batch}); fragmentation or a longer sequence can still run it out of memory later; {safe} is the safe value"
            ),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn curve(f: impl Fn(u64) -> f64) -> Vec<StepPoint> {
        [16, 64, 256, 1024, 4096]
            .iter()
            .map(|&b| StepPoint {
                rel_err: 0.0,
                batch: b,
                step_s: f(b),
            })
            .collect()
    }

    #[test]
    fn flat_throughput_fires_on_a_plateau_only() {
        // 1 ms a step up to batch 256, then proportional to the batch: a plateau.
        let plateau = curve(|b| 0.001 * (b as f64 / 256.0).max(1.0));
        let f = flat_throughput(&plateau, "cpu").unwrap();
        assert_eq!(f.rule, "flat_throughput");
        // Overhead-dominated: throughput keeps rising with the batch.
        let rising = curve(|b| 0.01 + b as f64 * 1e-7);
        assert!(flat_throughput(&rising, "cpu").is_none());
    }

    #[test]
    fn fixed_overhead_fires_when_the_step_barely_depends_on_the_batch() {
        let overhead = curve(|b| 0.005 + b as f64 * 1e-7);
        assert!(
            fixed_overhead(&overhead, "cuda:0")
                .unwrap()
                .message
                .contains("CPU")
        );
        let compute = curve(|b| 1e-5 + b as f64 * 1e-4);
        assert!(fixed_overhead(&compute, "cpu").is_none());
    }

    #[test]
    fn input_critical_and_memory_rules() {
        assert!(input_bound(0.004, 0.010, 64, "cpu").is_some());
        assert!(input_bound(0.0001, 0.010, 64, "cpu").is_none());
        assert!(above_critical(8192, 300.0).is_some());
        assert!(above_critical(256, 300.0).is_none());
        let f = near_memory_limit(98, 100, "cuda:0").unwrap();
        assert!(f.message.contains("90 is the safe value"), "{}", f.message);
        assert!(near_memory_limit(50, 100, "cuda:0").is_none());
    }
}
