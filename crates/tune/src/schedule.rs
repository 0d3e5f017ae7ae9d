//! A batch-size schedule from the noise scale along a run: small batches while
//! the noise scale is small (early, when a few samples already point the right
//! way), doubling as it grows. Stages are given in samples seen, so a schedule
//! is independent of how many steps each stage takes.

use crate::lr::LrScaling;
use crate::target::{Rows, updates_vs_min_on};
use crate::trajectory::Segment;
use serde::{Deserialize, Serialize};

/// From `from_samples` samples seen on, train at `batch` with `lr`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stage {
    pub from_samples: u64,
    pub batch: u64,
    pub lr: f64,
}

/// Stages in order of `from_samples`, the first from 0.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Schedule {
    pub stages: Vec<Stage>,
}

impl Schedule {
    /// The stage in force after `samples` samples.
    pub fn at(&self, samples: u64) -> &Stage {
        self.stages
            .iter()
            .rev()
            .find(|s| s.from_samples <= samples)
            .unwrap_or(&self.stages[0])
    }

    /// One stage: a fixed batch.
    pub fn fixed(batch: u64, lr: f64) -> Schedule {
        Schedule {
            stages: vec![Stage {
                from_samples: 0,
                batch,
                lr,
            }],
        }
    }

    /// Checks a schedule read from a file: at least one stage, the first from
    /// 0, increasing `from_samples`, positive batches and rates.
    pub fn check(&self) -> Result<(), String> {
        let Some(first) = self.stages.first() else {
            return Err("a schedule needs at least one stage".into());
        };
        if first.from_samples != 0 {
            return Err(format!(
                "the first stage must start at 0 samples, not {}",
                first.from_samples
            ));
        }
        for (i, s) in self.stages.iter().enumerate() {
            if s.batch == 0 || !(s.lr > 0.0 && s.lr.is_finite()) {
                return Err(format!(
                    "stage {}: batch {} and lr {} must be positive",
                    i + 1,
                    s.batch,
                    s.lr
                ));
            }
            if i > 0 && s.from_samples <= self.stages[i - 1].from_samples {
                return Err(format!(
                    "stage {}: from_samples {} does not come after {}",
                    i + 1,
                    s.from_samples,
                    self.stages[i - 1].from_samples
                ));
            }
        }
        Ok(())
    }
}

/// The ramp and what it is predicted to cost.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Ramp {
    pub schedule: Schedule,
    /// Predicted updates and samples of each stage, and in all.
    pub stage_steps: Vec<f64>,
    pub stage_samples: Vec<f64>,
    pub steps: f64,
    pub samples: f64,
}

/// The noise scale of training so far at each stretch: the ΔS_min-weighted
/// mean of the stretches' noise scales up to and including it (the run's
/// B_eff had it stopped there). One stretch's estimate rests on 20
/// measurements and can be far off (a near-zero |G|^2 reads as a huge noise
/// scale); the running value moves only as much as the stretch weighs.
pub fn noise_so_far(segments: &[Segment]) -> Vec<f64> {
    let (mut w, mut wb) = (0.0, 0.0);
    segments
        .iter()
        .map(|s| {
            w += s.s_min;
            wb += s.s_min * s.b_noise;
            if w > 0.0 { wb / w } else { s.b_noise }
        })
        .collect()
}

/// The ramp over a run's stretches: each stretch trains at the largest batch
/// of `batches` (ascending) not above the noise scale of training so far
/// ([`noise_so_far`]), never smaller than the stretch before (the smallest of
/// `batches` where that is below it), with `lr` at that batch. So the batch
/// doubles (between powers of two) once the noise scale has grown past twice
/// the batch. A stretch needs ΔS_min,i (1 + B_i / B) updates at batch B
/// (McCandlish et al. 2018, applied stretch by stretch); its samples are
/// those updates times B (noise-effective on `rows` training rows:
/// [`crate::target::noise_batch`]).
pub fn ramp(
    segments: &[Segment],
    batches: &[u64],
    lr: &LrScaling,
    rows: Option<Rows>,
) -> Option<Ramp> {
    let smallest = *batches.first()?;
    let mut stages: Vec<Stage> = Vec::new();
    let (mut stage_steps, mut stage_samples) = (Vec::<f64>::new(), Vec::<f64>::new());
    let mut current = smallest;
    let mut seen = 0.0f64;
    for (s, guide) in segments.iter().zip(noise_so_far(segments)) {
        let fits = batches
            .iter()
            .copied()
            .filter(|&b| b as f64 <= guide)
            .max()
            .unwrap_or(smallest);
        current = current.max(fits);
        let steps = s.s_min * updates_vs_min_on(s.b_noise, current as f64, rows);
        let samples = steps * current as f64;
        match stages.last() {
            Some(last) if last.batch == current => {
                *stage_steps.last_mut().expect("one per stage") += steps;
                *stage_samples.last_mut().expect("one per stage") += samples;
            }
            _ => {
                stages.push(Stage {
                    from_samples: seen.round() as u64,
                    batch: current,
                    lr: lr.at(current),
                });
                stage_steps.push(steps);
                stage_samples.push(samples);
            }
        }
        seen += samples;
    }
    if stages.is_empty() {
        return None;
    }
    Some(Ramp {
        steps: stage_steps.iter().sum(),
        samples: stage_samples.iter().sum(),
        schedule: Schedule { stages },
        stage_steps,
        stage_samples,
    })
}

/// Predicted updates and samples of `schedule` over a run's stretches: each
/// stretch at the batch in force where it starts (in samples seen),
/// ΔS_min,i (1 + B_i / B) updates, B noise-effective on `rows`. A fixed
/// batch gets [`crate::trajectory::Trajectory::steps`].
pub fn predict(schedule: &Schedule, segments: &[Segment], rows: Option<Rows>) -> (f64, f64) {
    let (mut steps, mut samples) = (0.0f64, 0.0f64);
    for s in segments {
        let b = schedule.at(samples.round() as u64).batch as f64;
        let n = s.s_min * updates_vs_min_on(s.b_noise, b, rows);
        steps += n;
        samples += n * b;
    }
    (steps, samples)
}

/// One stage of a schedule on one device: the batch as micro-batch x
/// accumulation where it does not fit, and its measured update time.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct StagePlan {
    pub from_samples: u64,
    pub batch: u64,
    pub lr: f64,
    pub micro_batch: u64,
    pub accumulation: u64,
    /// Seconds of one update (measured micro-batch step x accumulation).
    pub update_s: Option<f64>,
    /// Predicted updates and samples of the stage.
    pub steps: f64,
    pub samples: f64,
}

/// A ramp planned on one device, beside its best fixed batch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceSchedule {
    pub device: crate::device::DeviceSpec,
    pub stages: Vec<StagePlan>,
    /// Predicted in all: updates, samples, seconds (when every stage's update was measured).
    pub steps: f64,
    pub samples: f64,
    pub seconds: Option<f64>,
    /// The fixed batch with the lowest predicted time on this device: (batch, updates, seconds).
    pub best_fixed: Option<(u64, f64, f64)>,
}

/// Powers of two times `lo` from `lo` up to `hi` (the batches a ramp over a
/// sweep's range may use).
pub fn powers_of_two(lo: u64, hi: u64) -> Vec<u64> {
    std::iter::successors(Some(lo.max(1)), |b| Some(b * 2))
        .take_while(|&b| b <= hi)
        .collect()
}

/// Powers of two from `smallest` until one reaches `at_least`.
pub fn doubling(smallest: u64, at_least: f64) -> Vec<u64> {
    let mut out = vec![smallest.max(1)];
    while (*out.last().expect("one") as f64) < at_least {
        let next = out.last().expect("one") * 2;
        out.push(next);
    }
    out
}

/// `ramp` on a device whose measured update times are `update_s` (batch,
/// seconds; ascending) and whose largest batch is `max_batch`: a stage above
/// it runs as the largest measured batch that fits x accumulation.
pub fn on_device(
    device: crate::device::DeviceSpec,
    ramp: &Ramp,
    update_s: &[(u64, f64)],
    max_batch: Option<u64>,
    best_fixed: Option<(u64, f64, f64)>,
) -> DeviceSchedule {
    let fits = |b: u64| max_batch.is_none_or(|m| b <= m);
    let largest_fitting = update_s.iter().filter(|p| fits(p.0)).map(|p| p.0).max();
    let stages: Vec<StagePlan> = ramp
        .schedule
        .stages
        .iter()
        .zip(ramp.stage_steps.iter().zip(&ramp.stage_samples))
        .map(|(st, (&steps, &samples))| {
            let measured = update_s.iter().find(|p| p.0 == st.batch && fits(p.0));
            let (micro, acc, t) = match (measured, largest_fitting) {
                (Some(&(b, t)), _) => (b, 1, Some(t)),
                (None, Some(m)) if st.batch > m => {
                    let acc = st.batch.div_ceil(m);
                    let t = update_s.iter().find(|p| p.0 == m).map(|p| p.1 * acc as f64);
                    (m, acc, t)
                }
                _ => (st.batch, 1, None),
            };
            StagePlan {
                from_samples: st.from_samples,
                batch: st.batch,
                lr: st.lr,
                micro_batch: micro,
                accumulation: acc,
                update_s: t,
                steps,
                samples,
            }
        })
        .collect();
    let seconds = stages
        .iter()
        .map(|s| s.update_s.map(|t| t * s.steps))
        .sum::<Option<f64>>();
    DeviceSchedule {
        device,
        stages,
        steps: ramp.steps,
        samples: ramp.samples,
        seconds,
        best_fixed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lr::LrRule;

    fn seg(s_min: f64, b_noise: f64) -> Segment {
        Segment {
            first_update: 0.0,
            updates: 0.0,
            loss_start: 0.0,
            loss_end: 0.0,
            b_noise,
            s_min,
        }
    }

    const LR: LrScaling = LrScaling {
        rule: LrRule::Sqrt,
        ref_batch: 16,
        ref_lr: 1e-3,
        cap_batch: Some(256),
    };

    #[test]
    fn the_batch_doubles_as_the_noise_scale_grows_and_never_falls() {
        let batches = [16, 32, 64, 128, 256, 512];
        let segments = [
            seg(10.0, 40.0),
            seg(10.0, 100.0),
            seg(10.0, 640.0),
            seg(10.0, 20.0),
            seg(20.0, 1640.0),
        ];
        // So far: 40, 70, 260, 200, 680.
        let so_far = noise_so_far(&segments);
        assert!((so_far[2] - 260.0).abs() < 1e-9 && (so_far[4] - 680.0).abs() < 1e-9);
        let r = ramp(&segments, &batches, &LR, None).unwrap();
        let b: Vec<u64> = r.schedule.stages.iter().map(|s| s.batch).collect();
        // 40 -> 32; 70 -> 64; 260 -> 256; 200 stays at 256; 680 -> 512.
        assert_eq!(b, [32, 64, 256, 512]);
        // Steps of each stretch: s_min (1 + B_i / B), with the stretch's own B_i.
        let want = [10.0 * (1.0 + 40.0 / 32.0), 10.0 * (1.0 + 100.0 / 64.0)];
        assert!((r.stage_steps[0] - want[0]).abs() < 1e-9);
        assert!((r.stage_steps[1] - want[1]).abs() < 1e-9);
        let third = 10.0 * (1.0 + 640.0 / 256.0) + 10.0 * (1.0 + 20.0 / 256.0);
        assert!((r.stage_steps[2] - third).abs() < 1e-9);
        // Stages start where the samples of the earlier ones end.
        assert_eq!(r.schedule.stages[0].from_samples, 0);
        assert_eq!(
            r.schedule.stages[1].from_samples,
            (want[0] * 32.0).round() as u64
        );
        // The rate follows the rule and is held past its cap.
        assert_eq!(r.schedule.stages[3].lr, LR.at(256));
        assert!((r.steps - r.stage_steps.iter().sum::<f64>()).abs() < 1e-9);
        assert!(r.schedule.check().is_ok());
        assert_eq!(r.schedule.at(0).batch, 32);
        assert_eq!(r.schedule.at(u64::MAX).batch, 512);
        // Predicting the ramp's own schedule gives back its steps and samples.
        let (steps, samples) = predict(&r.schedule, &segments, None);
        assert!((steps - r.steps).abs() < 1e-6 && (samples - r.samples).abs() < 1e-3);
        // A fixed batch: the sum of the stretches at that batch.
        let (fixed, _) = predict(&Schedule::fixed(64, 1e-3), &segments, None);
        let want: f64 = segments
            .iter()
            .map(|s| s.s_min * (1.0 + s.b_noise / 64.0))
            .sum();
        assert!((fixed - want).abs() < 1e-9);
    }

    #[test]
    fn a_stage_above_the_largest_batch_accumulates() {
        // So far: 40, then (400 + 17,600) / 20 = 900.
        let segments = [seg(10.0, 40.0), seg(10.0, 1760.0)];
        let r = ramp(&segments, &doubling(32, 900.0), &LR, None).unwrap();
        let b: Vec<u64> = r.schedule.stages.iter().map(|s| s.batch).collect();
        assert_eq!(b, [32, 512]);
        let times = [(32, 0.001), (64, 0.0015), (128, 0.0025)];
        let cpu = crate::device::DeviceSpec::Cpu;
        let d = on_device(cpu, &r, &times, Some(128), Some((128, 200.0, 0.5)));
        assert_eq!(
            (d.stages[1].micro_batch, d.stages[1].accumulation),
            (128, 4)
        );
        assert!((d.stages[1].update_s.unwrap() - 0.01).abs() < 1e-12);
        let want = r.stage_steps[0] * 0.001 + r.stage_steps[1] * 0.01;
        assert!((d.seconds.unwrap() - want).abs() < 1e-12);
        assert_eq!(d.best_fixed, Some((128, 200.0, 0.5)));
    }

    #[test]
    fn schedules_from_files_are_checked() {
        let mut s = Schedule::fixed(32, 1e-3);
        assert!(s.check().is_ok());
        s.stages.push(Stage {
            from_samples: 0,
            batch: 64,
            lr: 1e-3,
        });
        assert!(s.check().unwrap_err().contains("does not come after"));
        s.stages[1].from_samples = 100;
        s.stages[1].batch = 0;
        assert!(s.check().unwrap_err().contains("must be positive"));
        assert!(Schedule { stages: vec![] }.check().is_err());
    }
}
