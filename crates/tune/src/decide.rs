//! Where the recommendation is decided: from the evidence of `advise` (each
//! device's measured curve, the plan, the noise run or a sweep's measured
//! steps) to a recommendation per device, every (device, batch, accumulation)
//! option ranked by predicted time to target, the batch-size ramp per device,
//! and the diagnosis. Pure: it spawns nothing, so it is tested on constructed
//! evidence. `run` decides with [`crate::run::advise_run`], through the same
//! per-device rule ([`crate::advice::recommend`]).

use crate::advice::{
    DeviceEvidence, LrAdviceInput, MaxBatchSource, NoiseBand, NoiseHint, Recommendation, recommend,
};
use crate::basis::{PredictionBasis, prediction_basis};
use crate::diagnose::{self, Finding, StepPoint};
use crate::lr::{LrRule, LrScaling};
use crate::noise::NoiseRun;
use crate::probe::DeviceProbe;
use crate::schedule::DeviceSchedule;
use crate::target::{Rows, StepsCurve, TimeToTarget, rank};
use batchfit_plan::{Bytes, Plan};

/// What the decision is made from: measurements only.
pub struct Evidence<'a> {
    pub probes: &'a [DeviceProbe],
    /// The CPU plan, for the largest batch this machine's RAM holds.
    pub plan_cpu: &'a Plan,
    pub host_memory: Option<Bytes>,
    pub noise: Option<&'a NoiseRun>,
    /// S(B) measured by a sweep: used instead of the noise run's prediction.
    pub measured: Option<&'a PredictionBasis>,
    /// The learning-rate rule every batch trains with, and the (batch, rate) it scales from.
    pub rule: LrRule,
    pub reference: (u64, f64),
    /// Seconds to gather one batch of `b` rows from the data, when there is data.
    pub input_seconds: &'a dyn Fn(u64) -> Option<f64>,
    /// Rows a training holds (the data less the validation share `sweep`
    /// holds out by default): no larger batch is an option.
    pub data_rows: Option<u64>,
    /// The batch whose rule rate the rate checks held the rule at
    /// ([`crate::stability::cap_from`]): every larger batch trains with its rate.
    pub rate_cap: Option<u64>,
    /// The smallest batch at which no rate tried made the predicted progress
    /// ([`crate::stability::failed_from`]): only smaller ones are recommended.
    pub rate_failed_from: Option<u64>,
    /// The largest batch whose check was slower than predicted
    /// ([`crate::stability::unreached_to`]): only larger ones are recommended.
    pub rate_unreached_to: Option<u64>,
    /// B_noise the rate checks measured ([`crate::stability::checked_b_noise`]):
    /// S(B) is refitted to it.
    pub checked_b_noise: Option<f64>,
    /// The mean updates the check at the noise run's own batch and rate took
    /// ([`crate::stability::reference_updates`]): S(B) is drawn through it.
    pub checked_reference: Option<f64>,
    /// The loss of ignoring the inputs ([`crate::dataset::DataProfile::prior_loss`]):
    /// a noise run that ends no lower learned nothing to predict from.
    pub prior_loss: Option<f64>,
}

/// How far the noise run learned: the loss it ended at beside the loss of
/// ignoring the inputs.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Learning {
    /// The noise run's final loss on its fixed rows (the target, where it learned).
    pub run_loss: f64,
    pub prior_loss: f64,
    /// `run_loss < prior_loss`: without it there is no target to predict for,
    /// and no batch is ranked by time to target.
    pub learned: bool,
}

/// The recommendations, time-to-target table and findings.
#[derive(Clone, Debug)]
pub struct Decision {
    pub recommendations: Vec<Recommendation>,
    pub time_to_target: Vec<TimeToTarget>,
    /// The loss the noise run reached: the target the times are predicted for.
    pub target_loss: Option<f64>,
    /// S_min through the noise run (predicted).
    pub s_min: Option<f64>,
    /// What the time to target rests on.
    pub basis: Option<PredictionBasis>,
    /// The batch-size ramp on each device (predicted), when the basis has stretches.
    pub schedules: Vec<DeviceSchedule>,
    pub findings: Vec<Finding>,
    /// The noise run's loss beside the loss of ignoring the inputs.
    pub learning: Option<Learning>,
}

/// The noise scale the probes weigh batches with before the decision: a
/// sweep's measured one, else the noise run's effective one, else its B_simple.
pub fn b_noise_for_probing(
    measured: Option<&PredictionBasis>,
    noise: Option<&NoiseRun>,
    rule: LrRule,
    reference: (u64, f64),
) -> Option<f64> {
    measured.map(|m| m.curve.b_noise).or_else(|| {
        noise.and_then(|n| {
            prediction_basis(n, rule, reference)
                .map(|b| b.curve.b_noise)
                .or(n.b_simple)
        })
    })
}

/// What a device's measured curve says, whoever measured it (`advise`, `run`):
/// throughput flat above some batch, a large fixed cost per step, other
/// virtual machines taking the CPU while it was timed, and the knee or the
/// largest batch far above the critical batch.
pub fn curve_findings(
    p: &DeviceProbe,
    points: &[StepPoint],
    b_noise: Option<f64>,
    rows: Option<Rows>,
) -> Vec<Finding> {
    let mut findings = Vec::new();
    findings.extend(diagnose::flat_throughput(points, p.device));
    findings.extend(diagnose::fixed_overhead(points, p.device));
    let steal: Vec<(u64, f64)> = p
        .points
        .iter()
        .filter_map(|q| Some((q.batch, q.cpu_steal_share?)))
        .collect();
    findings.extend(diagnose::cpu_steal(&steal, p.device));
    if let Some(bn) = b_noise {
        let largest = points.iter().map(|q| q.batch).max().unwrap_or(0);
        findings.extend(
            [p.knee_batch.unwrap_or(0), largest]
                .into_iter()
                .find_map(|b| diagnose::above_critical(b, bn, rows, p.device)),
        );
    }
    findings
}

/// B_noise with its 90 % band, from a sweep's measured curve (exact) or the
/// noise run's B_simple band carried over to the effective value.
fn noise_band(
    measured: Option<&PredictionBasis>,
    noise: Option<&NoiseRun>,
    basis: Option<&PredictionBasis>,
    b_noise: Option<f64>,
) -> Option<NoiseBand> {
    if let Some(m) = measured {
        return Some(NoiseBand::exact(m.curve.b_noise));
    }
    // The band of the stretches' own estimate, where the noise run resolved them.
    if let Some(b) = basis
        && let Some((low, high)) = b.band()
    {
        return Some(NoiseBand {
            b_noise: b.curve.b_noise,
            low,
            high,
        });
    }
    let (n, bn) = (noise?, b_noise?);
    let b = n.b_simple?;
    let ratio = bn / b;
    Some(NoiseBand {
        b_noise: bn,
        low: n.b_simple_low.unwrap_or(b) * ratio,
        high: n.b_simple_high.map(|h| h * ratio),
    })
}

/// From the evidence to the advice: per device a recommendation, every option
/// ranked by predicted time to target, the diagnosis. Spawns nothing.
pub fn decide(e: &Evidence) -> Decision {
    let run_basis = e
        .noise
        .and_then(|n| prediction_basis(n, e.rule, e.reference));
    let learning = run_basis
        .as_ref()
        .zip(e.prior_loss)
        .map(|(b, prior)| Learning {
            run_loss: b.target_loss,
            prior_loss: prior,
            learned: b.target_loss < prior,
        });
    // A run that learned nothing from the inputs has no target worth a
    // prediction and no noise scale of a training that learns.
    let noise = e.noise.filter(|_| learning.is_none_or(|l| l.learned));
    let mut basis = e
        .measured
        .cloned()
        .or(run_basis.filter(|_| noise.is_some()));
    if let (Some(b), Some(cap)) = (basis.as_mut(), e.rate_cap) {
        b.lr.cap_batch = Some(b.lr.cap_batch.map_or(cap, |c| c.min(cap)));
    }
    if e.checked_b_noise.is_some() || e.checked_reference.is_some() {
        basis = basis.map(|b| b.held_to_checks(e.checked_b_noise, e.checked_reference));
    }
    let b_noise = basis
        .as_ref()
        .map(|b| b.curve.b_noise)
        .or(noise.and_then(|n| n.b_simple));
    let band = noise_band(e.measured, noise, basis.as_ref(), b_noise);
    // The rows batches are drawn from without replacement, as S(B) counts them.
    let rows = match &basis {
        Some(b) => b.curve.rows,
        None => noise.and_then(|n| crate::target::rows_drawn_from(n.rows, n.optimizer)),
    };
    let mut recommendations = Vec::new();
    let mut options = Vec::new();
    let mut findings: Vec<Finding> = Vec::new();
    for p in e.probes {
        let points = p.step_points();
        let mut updates = p.update_points(e.input_seconds);
        updates.retain(|q| e.data_rows.is_none_or(|rows| q.batch <= rows));
        let (max_batch, max_batch_source) = match p.max_batch {
            Some(m) => (Some(m), MaxBatchSource::Measured),
            None if p.device.is_cpu() => (
                e.host_memory.and_then(|m| e.plan_cpu.max_batch(m)),
                MaxBatchSource::PredictedForRam,
            ),
            None => (None, MaxBatchSource::NotSearched),
        };
        // A batch larger than the data set is not a batch one can train
        // with: the knee among the batches it holds.
        let knee_batch = match e.data_rows {
            Some(rows) if p.knee_batch.is_some_and(|k| k > rows) => {
                let within: Vec<_> = p
                    .points
                    .iter()
                    .filter(|q| q.batch <= rows)
                    .cloned()
                    .collect();
                crate::measure::knee_of(&within, p.efficiency)
            }
            _ => p.knee_batch,
        };
        let (mut rec, opts) = recommend(
            &DeviceEvidence {
                device: p.device,
                points: &updates,
                knee_batch,
                efficiency: p.efficiency,
                max_batch,
                max_batch_source,
                noise_hint: match (e.noise, learning) {
                    (Some(_), Some(l)) if !l.learned => NoiseHint::NotLearning {
                        run_loss: l.run_loss,
                        prior_loss: l.prior_loss,
                    },
                    (Some(_), _) => NoiseHint::NoneFromTheRun,
                    (None, _) => NoiseHint::GiveData,
                },
                rate_failed_from: e.rate_failed_from,
                rate_unreached_to: e.rate_unreached_to,
                rows,
            },
            band,
            LrAdviceInput {
                rule: e.rule,
                reference: Some(e.reference),
            },
        );
        findings.extend(curve_findings(p, &points, b_noise, rows));
        if let (Some(b), Some(m), MaxBatchSource::Measured) =
            (rec.recommended_batch, rec.max_batch, rec.max_batch_source)
        {
            findings.extend(diagnose::near_memory_limit(b, m, p.device));
        }
        if let Some(b) = rec.recommended_batch
            && let Some(step) = points.iter().find(|q| q.batch == b)
            && let Some(load_s) = (e.input_seconds)(b)
        {
            findings.extend(diagnose::input_bound(load_s, step.step_s, b, p.device));
        }
        if let (Some(b), Some(basis)) = (rec.recommended_batch, &basis) {
            rec.learning_rate = Some(basis.lr.at(b));
        }
        recommendations.push(rec);
        options.extend(opts);
    }
    let s_min = basis.as_ref().map(|b| b.curve.s_min);
    let mut time_to_target = b_noise
        .map(|bn| rank(&options, bn, s_min, rows))
        .unwrap_or_default();
    let lr = basis.as_ref().map_or(
        LrScaling {
            rule: e.rule,
            ref_batch: e.reference.0,
            ref_lr: e.reference.1,
            cap_batch: None,
        },
        |b| b.lr,
    );
    for t in &mut time_to_target {
        t.learning_rate = Some(lr.at(t.option.effective_batch()));
        t.steps_band = basis
            .as_ref()
            .zip(band)
            .and_then(|(b, band)| steps_band(b, band, t.option.effective_batch()));
    }
    let schedules = basis
        .as_ref()
        .map(|b| device_schedules(b, e, &time_to_target))
        .unwrap_or_default();
    Decision {
        recommendations,
        time_to_target,
        target_loss: basis.as_ref().map(|b| b.target_loss),
        s_min,
        basis,
        schedules,
        findings,
        learning,
    }
}

/// The ramp over the basis's stretches on each measured device, beside the
/// device's fastest fixed option in the time-to-target table.
fn device_schedules(
    basis: &PredictionBasis,
    e: &Evidence,
    table: &[TimeToTarget],
) -> Vec<DeviceSchedule> {
    use crate::schedule::{doubling, noise_so_far, on_device, ramp};
    let segments = basis.segments();
    if segments.is_empty() {
        return Vec::new();
    }
    let widest = noise_so_far(segments).into_iter().fold(1.0, f64::max);
    e.probes
        .iter()
        .filter_map(|p| {
            let times: Vec<(u64, f64)> = p
                .update_points(e.input_seconds)
                .iter()
                .map(|q| (q.batch, q.step_s))
                .collect();
            let smallest = times.first()?.0;
            let r = ramp(
                segments,
                &doubling(smallest, widest),
                &basis.lr,
                basis.curve.rows,
            )?;
            let best = table
                .iter()
                .filter(|t| t.option.device == p.device)
                .min_by(|a, b| a.vs_best.total_cmp(&b.vs_best))
                .and_then(|t| Some((t.option.effective_batch(), t.steps?, t.seconds?)));
            Some(on_device(p.device, &r, &times, p.max_batch, best))
        })
        .collect()
}

/// Predicted updates at `batch` for B_noise at either end of its band, the
/// curve held through the noise run's own batch and updates (which it
/// measured); `None` without a run or an upper bound.
fn steps_band(basis: &PredictionBasis, band: NoiseBand, batch: u64) -> Option<(f64, f64)> {
    let run = basis.run()?;
    let anchor = basis.curve.steps(run.batch as f64);
    let rows = basis.curve.rows;
    let at = |bn: f64| StepsCurve::through(anchor, run.batch as f64, bn, rows).steps(batch as f64);
    let (a, b) = (at(band.low), at(band.high?));
    Some((a.min(b), a.max(b)))
}

/// What `advise` was given: the model (null: the default model with the
/// shipped digits), the data options and the optimizer.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AdviceInputs {
    pub model: Option<String>,
    pub data: Option<String>,
    pub labels: Option<String>,
    pub label_col: Option<crate::dataset::LabelCol>,
    /// `mse`, `ce` or `ctc` when the model's loss was replaced.
    pub loss: Option<String>,
    /// The output's class axis the loss read, where one was named (`--class-axis`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class_axis: Option<i64>,
    /// CTC's blank class, where one was named (`--blank`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blank: Option<usize>,
    pub optimizer: batchfit_plan::Optimizer,
    /// Whether batchfit's runs trained on standardised inputs (`--standardize`);
    /// `sweep --verify` trains the same.
    #[serde(default)]
    pub standardize: bool,
    /// `--seed`: the first seed of the noise runs and rate checks (0 in
    /// documents before it).
    #[serde(default)]
    pub seed: u64,
}

/// One noise run of `--noise-seeds`, decided on alone: how far the seeds agree.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SeedNoise {
    pub seed: u64,
    /// The effective noise scale of this run alone (`None`: not resolved).
    pub b_noise: Option<f64>,
    /// The batch this run alone would recommend on each device, in device order.
    pub recommended: Vec<Option<u64>>,
}

/// Everything `advise` measured and decided, for the report.
#[derive(Clone, Debug)]
pub struct Advice {
    pub model: String,
    pub parameters: u64,
    /// The command line, recorded in the report.
    pub command: String,
    /// The model and data as given, so `sweep --verify` trains the same.
    pub inputs: AdviceInputs,
    /// "AMD EPYC ... (2 cores), 23.4 GiB RAM".
    pub machine: String,
    /// The data the noise run trained on.
    pub data: Option<String>,
    pub plan: Plan,
    pub devices: Vec<DeviceProbe>,
    pub noise: Option<NoiseRun>,
    pub decision: Decision,
    /// Memory budget per device, for the memory figure.
    pub budgets: Vec<(crate::device::DeviceSpec, Bytes)>,
    /// `--gpus`: time to target across data-parallel world sizes (predicted).
    pub world_sizes: Option<crate::world::WorldSizes>,
    /// With no `--device`: the kinds of device this build or machine could
    /// not use, each with the reason.
    pub devices_not_used: Vec<String>,
    /// What the data looks like, as read (before `--standardize`).
    pub data_profile: Option<crate::dataset::DataProfile>,
    /// Each noise run of `--noise-seeds` decided on alone (empty with one run).
    pub noise_seeds: Vec<SeedNoise>,
    /// The short runs at the rule's rate (and its halvings) at the recommended
    /// and the largest batches.
    pub rate_checks: Vec<crate::stability::RateCheck>,
    /// The batch the rate checks held the rule at ([`crate::stability::cap_from`]).
    pub rate_cap: Option<u64>,
    /// The smallest checked batch where no rate trained; the advice is below it.
    pub rate_failed_from: Option<u64>,
    /// The largest checked batch whose check was slower than predicted; the
    /// advice is above it.
    pub rate_unreached_to: Option<u64>,
    /// `--b-small` as asked, where the data had fewer rows than its B_big and
    /// the noise run measured with smaller micro-batches (`noise.b_small`).
    pub b_small_asked: Option<usize>,
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::basis::prediction_basis;
    use crate::device::DeviceSpec;
    use crate::diagnose::Rule;
    use crate::noise::NoiseRecord;
    use crate::probe::ProbePoint;
    use crate::stats::summarize;
    use batchfit_plan::{Optimizer, TrainOptions, plan};

    fn no_input(_: u64) -> Option<f64> {
        None
    }

    /// The evidence of `probes` and the noise run `noise`: the square-root
    /// rule from (16, 1e-3), no data, no rate checks.
    fn evidence<'a>(
        probes: &'a [DeviceProbe],
        plan_cpu: &'a Plan,
        noise: Option<&'a NoiseRun>,
    ) -> Evidence<'a> {
        Evidence {
            probes,
            plan_cpu,
            host_memory: None,
            noise,
            measured: None,
            rule: LrRule::Sqrt,
            reference: (16, 1e-3),
            input_seconds: &no_input,
            rate_cap: None,
            data_rows: None,
            rate_failed_from: None,
            rate_unreached_to: None,
            checked_b_noise: None,
            checked_reference: None,
            prior_loss: None,
        }
    }

    fn probe(device: &str, steps: &[(u64, f64)], max_batch: Option<u64>) -> DeviceProbe {
        let points = steps
            .iter()
            .map(|&(b, s)| ProbePoint::measured(b, &summarize(&[s, s, s]), None, None, None))
            .collect();
        DeviceProbe {
            max_batch,
            knee_batch: Some(steps[0].0),
            ..DeviceProbe::of_points(device.parse().unwrap(), points)
        }
    }

    /// Each batch is timed in its own process: the error of a step time
    /// includes how far two processes' medians of one batch stray apart.
    #[test]
    fn step_time_errors_include_the_between_process_error() {
        let mut p = probe("cpu", &[(64, 0.010), (128, 0.016)], None);
        let within: Vec<f64> = p.step_points().iter().map(|q| q.rel_err).collect();
        p.between_process_error = Some(0.1);
        let widened = p.step_points();
        let updates = p.update_points(&|_| None);
        for ((q, u), w) in widened.iter().zip(&updates).zip(within) {
            assert!((q.rel_err - w.hypot(0.1)).abs() < 1e-12, "{q:?}");
            assert_eq!(u.rel_err, q.rel_err);
        }
    }

    /// A knee above the data set's rows is no batch to train with: the
    /// recommendation is the knee among the batches the data holds.
    #[test]
    fn the_knee_is_taken_among_batches_the_data_holds() {
        let graph = batchfit_graph::load("zoo:digits-mlp").unwrap();
        let plan_cpu = plan(&graph, &TrainOptions::default());
        let mut p = probe(
            "cpu",
            &[(8, 0.0010), (16, 0.0011), (32, 0.0012), (512, 0.0100)],
            None,
        );
        p.knee_batch = Some(512);
        let d = decide(&Evidence {
            data_rows: Some(32),
            ..evidence(&[p], &plan_cpu, None)
        });
        let rec = &d.recommendations[0];
        assert_eq!(
            (rec.recommended_batch, rec.knee_batch),
            (Some(32), Some(32))
        );
        assert!(matches!(
            rec.reason,
            crate::advice::Reason::Knee {
                hint: NoiseHint::GiveData,
                ..
            }
        ));
    }

    /// The 6 GB card question as measurements: a GPU that fits 25 at 10 ms a
    /// step, a CPU that takes 250 at 400 ms; B_noise 250. The table ranks GPU
    /// at 25 first, accumulation on the GPU second, the CPU last.
    #[test]
    fn gpu_at_25_beside_cpu_at_250_decided_without_processes() {
        let graph = batchfit_graph::load("zoo:digits-mlp").unwrap();
        let plan_cpu = plan(&graph, &TrainOptions::default());
        let probes = [
            probe("cuda:0", &[(25, 0.010)], Some(25)),
            probe("cpu", &[(250, 0.400)], Some(700)),
        ];
        let noise_doc = noise_with_b_simple(250.0);
        let d = decide(&evidence(&probes, &plan_cpu, Some(&noise_doc)));
        let order: Vec<(DeviceSpec, u64, u64)> = d
            .time_to_target
            .iter()
            .map(|t| (t.option.device, t.option.micro_batch, t.option.accumulation))
            .collect();
        let (gpu, cpu) = (DeviceSpec::Cuda(0), DeviceSpec::Cpu);
        // On the run's 1,000 rows, trained by Adam, the critical batch is
        // where (250 / B) sqrt(1 - B/1000) = 1, the root of B^2 + 62.5 B -
        // 62,500, 220.7: 9 x 25 accumulated.
        assert_eq!(order, [(gpu, 25, 1), (gpu, 25, 9), (cpu, 250, 1)]);
        // Batches of those rows, 1 + (250 / B) sqrt(1 - B/1000): (1 + 10
        // sqrt(0.975)) x 10 ms; x9 accumulation: (1 + (250/225) sqrt(0.775))
        // x 90 ms; CPU (1 + sqrt(0.75)) x 400 ms.
        let gpu_25 = (1.0 + 10.0 * 0.975f64.sqrt()) * 10.0;
        let gpu_225 = (1.0 + 250.0 / 225.0 * 0.775f64.sqrt()) * 90.0;
        let cpu_250 = (1.0 + 0.75f64.sqrt()) * 400.0;
        assert!((d.time_to_target[1].vs_best - gpu_225 / gpu_25).abs() < 1e-9);
        assert!((d.time_to_target[2].vs_best - cpu_250 / gpu_25).abs() < 1e-9);
        let gpu = &d.recommendations[0];
        assert_eq!(gpu.recommended_batch, Some(25));
        assert_eq!(gpu.accumulation.as_ref().map(|a| a.steps), Some(9));
        assert!(d.findings.iter().all(|f| f.rule() != Rule::AboveCritical));
    }

    /// A noise run whose stretches all measure B = 200 and whose loss falls
    /// linearly: the prediction is S(B) through the updates it took to its
    /// final loss, the rate is held from B_noise, and every row and the
    /// recommendation state that rate.
    #[test]
    fn the_noise_run_sets_the_target_the_curve_and_the_held_rate() {
        let doc = run_at_b_noise_200();
        let basis = prediction_basis(&doc, LrRule::Sqrt, (16, 1e-3)).unwrap();
        // The target is the mean of the evaluations in the last 10 % (at 90 and 99), reached at 94.5.
        let target = (2.0 - 0.015 * 90.0 + 2.0 - 0.015 * 99.0) / 2.0;
        assert!((basis.target_loss - target).abs() < 1e-12);
        assert!(
            (basis.updates_to_target().unwrap() - 94.5).abs() < 1e-9,
            "{basis:?}"
        );
        // Adam's preconditioned estimates, not the raw ones, set B_noise.
        assert!((basis.curve.b_noise - 200.0).abs() < 1e-9);
        assert!((basis.curve.steps(128.0) - 94.5).abs() < 1e-9);
        assert_eq!(basis.lr.cap_batch, Some(200));

        let graph = batchfit_graph::load("zoo:digits-mlp").unwrap();
        let plan_cpu = plan(&graph, &TrainOptions::default());
        let probes = [probe(
            "cpu",
            &[(64, 0.001), (256, 0.002), (1024, 0.006)],
            None,
        )];
        let d = decide(&evidence(&probes, &plan_cpu, Some(&doc)));
        for t in &d.time_to_target {
            let b = t.option.micro_batch.min(200) as f64;
            assert!((t.learning_rate.unwrap() - 1e-3 * (b / 16.0).sqrt()).abs() < 1e-15);
            assert!(
                (t.steps.unwrap() - basis.curve.steps(t.option.micro_batch as f64)).abs() < 1e-9
            );
        }
        let rec = &d.recommendations[0];
        let b = rec.recommended_batch.unwrap();
        assert_eq!(rec.learning_rate, Some(basis.lr.at(b)));
    }

    /// A noise run at 128 whose stretches all measure B = 200 (Adam's
    /// geometry) and whose loss on the fixed rows falls linearly from 2.
    fn run_at_b_noise_200() -> NoiseRun {
        let mut doc = noise_with_b_simple(150.0);
        doc.lr = 1e-3 * 8f64.sqrt();
        doc.steps = 100;
        doc.history = (0..100)
            .map(|i| NoiseRecord {
                step: i,
                loss: 1.0,
                train_loss: (i % 10 == 0 || i == 99).then_some(2.0 - 0.015 * i as f64),
                b_simple: Some(150.0),
                b_simple_low: None,
                b_simple_high: None,
                g2: None,
                trace: None,
                g2_raw: 1.0,
                trace_raw: 150.0,
                g2_raw_preconditioned: Some(2.0),
                trace_raw_preconditioned: Some(400.0),
                epoch: 0,
            })
            .collect();
        doc
    }

    /// A run whose loss ends no lower than ignoring the inputs costs learned
    /// nothing: no target, no time to target, the knee by throughput with the
    /// reason; a loss just under it is a target like any other.
    #[test]
    fn a_run_that_learned_nothing_from_the_inputs_sets_no_target() {
        let doc = run_at_b_noise_200();
        let target = prediction_basis(&doc, LrRule::Sqrt, (16, 1e-3))
            .unwrap()
            .target_loss;
        let graph = batchfit_graph::load("zoo:digits-mlp").unwrap();
        let plan_cpu = plan(&graph, &TrainOptions::default());
        let probes = [probe("cpu", &[(64, 0.001), (256, 0.002)], None)];
        let with_prior = |prior_loss| {
            decide(&Evidence {
                prior_loss: Some(prior_loss),
                ..evidence(&probes, &plan_cpu, Some(&doc))
            })
        };
        let d = with_prior(target);
        assert_eq!(
            d.learning,
            Some(Learning {
                run_loss: target,
                prior_loss: target,
                learned: false
            })
        );
        assert!(d.basis.is_none() && d.target_loss.is_none());
        assert!(d.time_to_target.is_empty() && d.schedules.is_empty());
        let rec = &d.recommendations[0];
        assert_eq!(rec.recommended_batch, rec.knee_batch);
        assert!(matches!(
            rec.reason,
            crate::advice::Reason::Knee {
                hint: NoiseHint::NotLearning { .. },
                ..
            }
        ));
        let d = with_prior(target * 1.01);
        assert_eq!(d.learning.map(|l| l.learned), Some(true));
        assert_eq!(d.target_loss, Some(target));
        assert!(!d.time_to_target.is_empty());
    }

    /// A noise run as the decision reads it: B_simple, no run (lr 0, so no S_min).
    fn noise_with_b_simple(b_simple: f64) -> NoiseRun {
        NoiseRun {
            model: "test".into(),
            data: "test".into(),
            rows: 1000,
            b_small: 16,
            b_big: 128,
            lr: 0.0,
            optimizer: Optimizer::Adam,
            steps: 0,
            b_simple: Some(b_simple),
            b_simple_low: None,
            b_simple_high: None,
            critical_batch: None,
            history: Vec::new(),
            predictions: Vec::new(),
            lr_advice: None,
        }
    }
}
