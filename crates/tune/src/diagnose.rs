//! Diagnosis from measurements: each rule fires with the numbers behind it, or
//! stays silent. A finding is data (its rule, device and figures); the report
//! says it in words.

use crate::device::DeviceSpec;
use crate::target::{Rows, critical_batch_on, epochs_vs_min_on};
use serde::Serialize;

/// One finding on one device, with the figures that support it.
#[derive(Clone, Debug, PartialEq)]
pub struct Finding {
    pub device: DeviceSpec,
    pub kind: FindingKind,
}

/// What was found, with its figures.
#[derive(Clone, Debug, PartialEq)]
pub enum FindingKind {
    /// Throughput flat above `from_batch`: from there to `to_batch` it changed
    /// by `gain` (a share) while updates per epoch fell `to_batch / from_batch`x.
    FlatThroughput {
        from_batch: u64,
        to_batch: u64,
        gain: f64,
        from_samples_per_s: f64,
        to_samples_per_s: f64,
    },
    /// A fixed cost per step: `fixed_s + per_sample_s x B`, `share` of the step at `batch`.
    FixedOverhead {
        fixed_s: f64,
        per_sample_s: f64,
        batch: u64,
        share: f64,
    },
    /// NVML saw the GPU run kernels `util_pct` of the time at `batch`.
    GpuIdle { util_pct: f64, batch: u64 },
    /// Gathering a batch takes `load_s` against `step_s` of compute, `share` of the time.
    InputBound {
        load_s: f64,
        step_s: f64,
        batch: u64,
        share: f64,
    },
    /// `batch` is far above the critical batch (on the data set's rows), and
    /// needs `epochs_vs_min` times the fewest epochs to the target.
    AboveCritical {
        batch: u64,
        critical: f64,
        epochs_vs_min: f64,
    },
    /// `batch` is within 10 % of the largest that fits; `safe` leaves 10 % free.
    NearMemoryLimit {
        batch: u64,
        max_batch: u64,
        safe: u64,
    },
    /// Other virtual machines took `share` of the host's CPU time while `batch`
    /// was timed (the most of any batch).
    CpuSteal { share: f64, batch: u64 },
}

/// A finding's rule as a stable identifier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    FlatThroughput,
    FixedOverhead,
    GpuIdle,
    #[serde(rename = "input_pipeline")]
    InputBound,
    #[serde(rename = "above_critical_batch")]
    AboveCritical,
    NearMemoryLimit,
    CpuSteal,
}

impl Finding {
    /// The rule that fired.
    pub fn rule(&self) -> Rule {
        match self.kind {
            FindingKind::FlatThroughput { .. } => Rule::FlatThroughput,
            FindingKind::FixedOverhead { .. } => Rule::FixedOverhead,
            FindingKind::GpuIdle { .. } => Rule::GpuIdle,
            FindingKind::InputBound { .. } => Rule::InputBound,
            FindingKind::AboveCritical { .. } => Rule::AboveCritical,
            FindingKind::NearMemoryLimit { .. } => Rule::NearMemoryLimit,
            FindingKind::CpuSteal { .. } => Rule::CpuSteal,
        }
    }
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
pub fn flat_throughput(points: &[StepPoint], device: DeviceSpec) -> Option<Finding> {
    let largest = points.iter().max_by_key(|p| p.batch)?;
    let flat_from = points
        .iter()
        .filter(|p| p.batch * 4 <= largest.batch)
        .filter(|p| largest.samples_per_s() < 1.15 * p.samples_per_s())
        .min_by_key(|p| p.batch)?;
    Some(Finding {
        device,
        kind: FindingKind::FlatThroughput {
            from_batch: flat_from.batch,
            to_batch: largest.batch,
            gain: largest.samples_per_s() / flat_from.samples_per_s() - 1.0,
            from_samples_per_s: flat_from.samples_per_s(),
            to_samples_per_s: largest.samples_per_s(),
        },
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
pub fn fixed_overhead(points: &[StepPoint], device: DeviceSpec) -> Option<Finding> {
    let (fixed, per) = step_line(points)?;
    let small = points.iter().min_by_key(|p| p.batch)?;
    let share = fixed / small.step_s;
    (fixed > 0.0 && share > 0.5).then_some(Finding {
        device,
        kind: FindingKind::FixedOverhead {
            fixed_s: fixed,
            per_sample_s: per,
            batch: small.batch,
            share,
        },
    })
}

/// The GPU sat idle much of the time (NVML's utilisation: the share of time a
/// kernel ran). Fires below half: the step is then bound by something else
/// than the GPU (input pipeline, Python overhead, synchronisation).
pub fn gpu_idle(util_mean_pct: f64, batch: u64, device: DeviceSpec) -> Option<Finding> {
    (util_mean_pct < 50.0).then_some(Finding {
        device,
        kind: FindingKind::GpuIdle {
            util_pct: util_mean_pct,
            batch,
        },
    })
}

/// Input pipeline bound: preparing a batch takes a large share of the step.
pub fn input_bound(load_s: f64, step_s: f64, batch: u64, device: DeviceSpec) -> Option<Finding> {
    let share = load_s / (load_s + step_s);
    (share > 0.2).then_some(Finding {
        device,
        kind: FindingKind::InputBound {
            load_s,
            step_s,
            batch,
            share,
        },
    })
}

/// The batch is far above the critical batch of `b_noise` on `rows` training
/// rows ([`critical_batch_on`]): many more epochs will be needed.
pub fn above_critical(
    batch: u64,
    b_noise: f64,
    rows: Option<Rows>,
    device: DeviceSpec,
) -> Option<Finding> {
    let critical = critical_batch_on(b_noise, rows);
    (batch as f64 > 4.0 * critical).then(|| Finding {
        device,
        kind: FindingKind::AboveCritical {
            batch,
            critical,
            epochs_vs_min: epochs_vs_min_on(b_noise, batch as f64, rows),
        },
    })
}

/// The recommended batch sits within 10 % of the memory limit.
pub fn near_memory_limit(batch: u64, max_batch: u64, device: DeviceSpec) -> Option<Finding> {
    (max_batch > 0 && batch as f64 > 0.9 * max_batch as f64).then(|| Finding {
        device,
        kind: FindingKind::NearMemoryLimit {
            batch,
            max_batch,
            safe: ((max_batch as f64 * 0.9).floor() as u64).max(1),
        },
    })
}

/// Steal time above this share of the CPU is named: a step is then timed
/// that much slower, in bursts, and two batches timed at different moments
/// differ by more than the few percent the advice tells apart.
pub const STEAL_WARN: f64 = 0.05;

/// The hypervisor gave other virtual machines more than [`STEAL_WARN`] of the
/// CPU while some batch's steps were timed (`(batch, steal share)`).
pub fn cpu_steal(points: &[(u64, f64)], device: DeviceSpec) -> Option<Finding> {
    let &(batch, share) = points.iter().max_by(|a, b| a.1.total_cmp(&b.1))?;
    (share > STEAL_WARN).then_some(Finding {
        device,
        kind: FindingKind::CpuSteal { share, batch },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steal_is_named_above_its_threshold_at_the_worst_batch() {
        let f = cpu_steal(&[(8, 0.01), (64, 0.12), (512, 0.07)], DeviceSpec::Cpu).unwrap();
        assert_eq!(
            f.kind,
            FindingKind::CpuSteal {
                share: 0.12,
                batch: 64
            }
        );
        assert_eq!(f.rule(), Rule::CpuSteal);
        assert_eq!(cpu_steal(&[(8, 0.01), (64, 0.05)], DeviceSpec::Cpu), None);
        assert_eq!(cpu_steal(&[], DeviceSpec::Cpu), None);
    }

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
        let f = flat_throughput(&plateau, DeviceSpec::Cpu).unwrap();
        assert_eq!(f.rule(), Rule::FlatThroughput);
        // Overhead-dominated: throughput keeps rising with the batch.
        let rising = curve(|b| 0.01 + b as f64 * 1e-7);
        assert!(flat_throughput(&rising, DeviceSpec::Cpu).is_none());
    }

    #[test]
    fn fixed_overhead_fires_when_the_step_barely_depends_on_the_batch() {
        let overhead = curve(|b| 0.005 + b as f64 * 1e-7);
        let f = fixed_overhead(&overhead, DeviceSpec::Cuda(0)).unwrap();
        assert!(matches!(f.kind, FindingKind::FixedOverhead { share, .. } if share > 0.9));
        let compute = curve(|b| 1e-5 + b as f64 * 1e-4);
        assert!(fixed_overhead(&compute, DeviceSpec::Cpu).is_none());
    }

    #[test]
    fn input_critical_and_memory_rules() {
        let cpu = DeviceSpec::Cpu;
        assert!(input_bound(0.004, 0.010, 64, cpu).is_some());
        assert!(input_bound(0.0001, 0.010, 64, cpu).is_none());
        assert!(above_critical(8192, 300.0, None, cpu).is_some());
        assert!(above_critical(256, 300.0, None, cpu).is_none());
        // On 1,500 rows the critical batch is 250: 1,024 is more than 4x it.
        let f = above_critical(1024, 300.0, crate::target::sgd_rows(1500.0), cpu).unwrap();
        match f.kind {
            FindingKind::AboveCritical {
                critical,
                epochs_vs_min,
                ..
            } => {
                assert!((critical - 250.0).abs() < 1e-9);
                assert!((epochs_vs_min - (1.0 + 1024.0 / 300.0 - 1024.0 / 1500.0)).abs() < 1e-9);
            }
            _ => unreachable!(),
        }
        let f = near_memory_limit(98, 100, DeviceSpec::Cuda(0)).unwrap();
        assert!(
            matches!(f.kind, FindingKind::NearMemoryLimit { safe: 90, .. }),
            "{f:?}"
        );
        assert!(near_memory_limit(50, 100, DeviceSpec::Cuda(0)).is_none());
    }
}
