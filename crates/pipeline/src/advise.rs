//! `advise`: plan -> noise scale on the data -> probe on every device -> the
//! recommendation, the time-to-target table and the diagnosis. The decisions
//! are pure functions of `batchfit_tune` (`advice::recommend`, `target::rank`,
//! `diagnose`); this module gathers their evidence.

use crate::noise::{DataSource, Init, NoiseSettings, apply_loss, document, load_data, run_noise};
use crate::probe::{MeasureConfig, Target, probe_device_for};
use crate::{Progress, Result};
use batchfit_data::Dataset;
use batchfit_engine::DeviceSpec;
use batchfit_graph::Graph;
use batchfit_plan::{Plan, TrainOptions, plan};
use batchfit_report::advise::{AdviceInputs, AdviseDocument, WorldSizes};
use batchfit_report::noise::NoiseDocument;
use batchfit_report::probe::DeviceProbe;
use batchfit_tune::advice::{DeviceEvidence, LrAdviceInput, MaxBatchSource, NoiseBand, recommend};
use batchfit_tune::diagnose::{self, Finding, StepPoint};
use batchfit_tune::lr::{LrRule, LrScaling, scale};
use batchfit_tune::target::{PredictionBasis, StepsCurve, rank};
use batchfit_tune::trajectory::{RunPoint, SEGMENT_MEASUREMENTS, trajectory};
use std::time::Instant;

/// What `advise` needs beyond the measuring flags.
#[derive(Clone, Debug)]
pub struct AdviseConfig {
    /// `None`: the default model with the shipped digits.
    pub model: Option<String>,
    pub measure: MeasureConfig,
    pub data: DataSource,
    /// Devices to measure; empty: every device this build can see.
    pub devices: Vec<DeviceSpec>,
    /// Steps of the noise run (0 skips it).
    pub noise_steps: usize,
    pub b_small: usize,
    pub k: usize,
    /// The user's tuned (batch, learning rate).
    pub reference: Option<(u64, f64)>,
    /// The command line, recorded in the report.
    pub command: String,
    /// Data-parallel world sizes to predict time to target for (empty: none).
    pub gpus: Vec<u64>,
    /// How the model states are sharded across them.
    pub strategy: batchfit_plan::distributed::Strategy,
    /// The ring's link.
    pub link: batchfit_plan::distributed::Link,
    /// A finished sweep's `--out` folder: its measured steps to target replace
    /// the noise run's prediction (no noise run then).
    pub from_sweep: Option<std::path::PathBuf>,
}

/// Runs the whole advice pipeline.
pub fn advise(cfg: &AdviseConfig, progress: &dyn Progress) -> Result<AdviseDocument> {
    let started = std::time::Instant::now();
    let default_model = cfg.model.is_none();
    let source = cfg.model.as_deref().unwrap_or(crate::DEFAULT_MODEL);
    let mut graph = batchfit_graph::load(source)?;
    apply_loss(&mut graph, cfg.data.loss)?;
    batchfit_engine::model::check_trainable(&graph)?;
    let (devices, devices_not_used) = if cfg.devices.is_empty() {
        let survey = DeviceSpec::survey();
        (survey.found, survey.missing)
    } else {
        (cfg.devices.clone(), Vec::new())
    };
    let seq_len = cfg.measure.seq_len.or(graph.default_seq_len).unwrap_or(1);
    // One learning-rate rule for the noise run, the prediction and the advice:
    // lr(B) = rule(ref_lr, B / ref_batch), from the user's tuned pair or --lr at B_small.
    let rule = LrRule::for_optimizer(cfg.measure.optimizer.is_adaptive());
    let reference = cfg
        .reference
        .unwrap_or((cfg.b_small as u64, cfg.measure.lr));
    let b_big = (cfg.b_small * cfg.k.max(2)) as u64;
    let data: Option<Dataset> = if cfg.data.data.is_some() || default_model {
        Some(load_data(&cfg.data, &graph, seq_len, default_model)?)
    } else {
        None
    };

    // Steps measured by a sweep, when given, stand in for the noise run's prediction.
    let measured = match &cfg.from_sweep {
        Some(dir) => Some(measured_basis(dir, &graph, cfg, progress)?),
        None => None,
    };
    // Noise scale first: it is quick and decides what "a good batch" means statistically.
    let noise_steps = if measured.is_some() {
        0
    } else {
        cfg.noise_steps
    };
    let noise: Option<NoiseDocument> = match (&data, noise_steps) {
        (Some(d), steps) if steps > 0 => {
            let settings = NoiseSettings {
                lr: scale(rule, reference.0, reference.1, b_big),
                optimizer: cfg.measure.optimizer,
                steps,
                b_small: cfg.b_small,
                k: cfg.k.max(2),
                beta: None,
                batches: Vec::new(),
                reference: cfg.reference,
                init: Init::Checkpoint,
                seed: cfg.measure.seed,
                threads: None,
            };
            progress.set_length(steps as u64);
            progress.message("noise scale on the data".into());
            let outcome = run_noise(&settings, &graph, d, seq_len, |_| progress.advance(1))?;
            progress.set_position(0);
            progress.set_length(0);
            Some(document(&settings, &graph, d, outcome))
        }
        _ => None,
    };

    let target = Target {
        source: source.to_string(),
        graph: &graph,
        seq_len,
    };
    let mut probes = Vec::new();
    for (i, &d) in devices.iter().enumerate() {
        // The budget left after the noise run, shared by the devices still to measure.
        let measure = MeasureConfig {
            budget_s: cfg.measure.budget_s.map(|b| {
                (b - started.elapsed().as_secs_f64()).max(0.0) / (devices.len() - i) as f64
            }),
            ..cfg.measure.clone()
        };
        let b_noise = measured.as_ref().map(|m| m.curve.b_noise).or_else(|| {
            noise.as_ref().and_then(|n| {
                prediction_basis(n, rule, reference)
                    .map(|b| b.curve.b_noise)
                    .or(n.b_simple)
            })
        });
        probes.push(probe_device_for(&measure, &target, d, b_noise, progress)?);
    }

    let plan_cpu = plan(
        &graph,
        &TrainOptions {
            optimizer: cfg.measure.optimizer,
            seq_len: cfg.measure.seq_len,
            ..TrainOptions::default()
        },
    );
    let verdict = decide(&Evidence {
        probes: &probes,
        plan_cpu: &plan_cpu,
        host_memory: batchfit_plan::devices::host_memory(),
        noise: noise.as_ref(),
        measured: measured.as_ref(),
        rule,
        reference,
        input_seconds: &|b| data.as_ref().map(|d| batch_load_seconds(d, &graph, b)),
    });
    let scale = match (noise.as_ref().and_then(|n| n.b_simple), probes.first()) {
        (Some(bn), Some(p)) if !cfg.gpus.is_empty() => {
            Some(across_world_sizes(&graph, cfg, p, bn, verdict.s_min))
        }
        _ => None,
    };
    let budgets = cfg
        .measure
        .memory_limit
        .map(|m| devices.iter().map(|d| (d.to_string(), m)).collect())
        .unwrap_or_default();
    Ok(AdviseDocument {
        schema_version: batchfit_report::SCHEMA_VERSION,
        kind: "advise",
        model: graph.name.clone(),
        parameters: graph.param_count(),
        command: cfg.command.clone(),
        inputs: AdviceInputs {
            model: cfg.model.as_deref().map(absolute_if_file),
            data: cfg.data.data.as_deref().map(absolute_if_file),
            labels: cfg.data.labels.as_deref().map(absolute_if_file),
            label_col: cfg.data.label_col,
            loss: cfg.data.loss.map(|l| l.name().to_string()),
            optimizer: cfg.measure.optimizer.name().to_string(),
        },
        machine: machine(),
        data: data.as_ref().map(|d| d.source.clone()),
        plan: plan_cpu,
        devices: probes,
        noise,
        recommendations: verdict.recommendations,
        time_to_target: verdict.time_to_target,
        target_loss: verdict.target_loss,
        prediction: verdict.basis,
        schedules: verdict.schedules,
        findings: verdict.findings,
        budgets,
        world_sizes: scale,
        devices_not_used,
    })
}

/// Time to target across data-parallel world sizes of devices like the first
/// measured one: for each world size the measured micro-batch per device with
/// the lowest predicted time, S(N x micro) x (measured step + exposed
/// communication of the ring); where extra devices stop paying; and the
/// largest world size whose global batch stays within B_noise.
fn across_world_sizes(
    graph: &Graph,
    cfg: &AdviseConfig,
    device: &DeviceProbe,
    b_noise: f64,
    s_min: Option<f64>,
) -> WorldSizes {
    use batchfit_plan::distributed::{CommModel, comm_time, plan_options};
    use batchfit_tune::target::{ScaleOption, scaling_limit, time_across_world_sizes};
    let gpu_plan = plan(
        graph,
        &plan_options(&TrainOptions {
            optimizer: cfg.measure.optimizer,
            seq_len: cfg.measure.seq_len,
            ..TrainOptions::default()
        }),
    );
    let layer_params: Vec<u64> = gpu_plan.layers.iter().map(|l| l.parameters).collect();
    let model = CommModel::of(&gpu_plan, &layer_params);
    let points = step_points(device);
    let mut rows = Vec::new();
    for &world in &cfg.gpus {
        let options: Vec<ScaleOption> = points
            .iter()
            .map(|q| {
                let comm = comm_time(&model, cfg.strategy, world, 1, Some(q.step_s), &cfg.link);
                ScaleOption {
                    world_size: world,
                    strategy: cfg.strategy.name().to_string(),
                    micro_batch: q.batch,
                    accumulation: 1,
                    update_s: q.step_s + comm.exposed_s.unwrap_or(comm.seconds),
                }
            })
            .collect();
        let best = time_across_world_sizes(&options, b_noise, s_min)
            .into_iter()
            .min_by(|a, b| a.vs_best.total_cmp(&b.vs_best));
        rows.extend(best.map(|t| t.option));
    }
    let table = time_across_world_sizes(&rows, b_noise, s_min);
    WorldSizes {
        device: device.device.clone(),
        strategy: cfg.strategy.name().to_string(),
        link_gbps: cfg.link.bytes_per_s * 8.0 / 1e9,
        limit: scaling_limit(&table),
        within_b_noise: table
            .iter()
            .filter(|t| t.global_batch as f64 <= b_noise)
            .map(|t| t.option.world_size)
            .max(),
        b_noise,
        table,
    }
}

/// What the decision is made from: measurements only.
pub struct Evidence<'a> {
    pub probes: &'a [DeviceProbe],
    /// The CPU plan, for the largest batch this machine's RAM holds.
    pub plan_cpu: &'a Plan,
    pub host_memory: Option<batchfit_plan::Bytes>,
    pub noise: Option<&'a NoiseDocument>,
    /// S(B) measured by a sweep: used instead of the noise run's prediction.
    pub measured: Option<&'a PredictionBasis>,
    /// The learning-rate rule every batch trains with, and the (batch, rate) it scales from.
    pub rule: LrRule,
    pub reference: (u64, f64),
    /// Seconds to gather one batch of `b` rows from the data, when there is data.
    pub input_seconds: &'a dyn Fn(u64) -> Option<f64>,
}

/// The recommendations, time-to-target table and findings.
pub struct Decision {
    pub recommendations: Vec<batchfit_tune::advice::Recommendation>,
    pub time_to_target: Vec<batchfit_tune::target::TimeToTarget>,
    /// The loss the noise run reached: the target the times are predicted for.
    pub target_loss: Option<f64>,
    /// S_min through the noise run (predicted).
    pub s_min: Option<f64>,
    /// What the time to target rests on.
    pub basis: Option<PredictionBasis>,
    /// The batch-size ramp on each device (predicted), when the basis has stretches.
    pub schedules: Vec<batchfit_tune::schedule::DeviceSchedule>,
    pub findings: Vec<Finding>,
}

/// What a device's measured curve says, whoever measured it (`advise`, `run`):
/// throughput flat above some batch, a large fixed cost per step, and the knee
/// or the largest batch far above the critical batch.
pub fn curve_findings(p: &DeviceProbe, points: &[StepPoint], b_noise: Option<f64>) -> Vec<Finding> {
    let mut findings = Vec::new();
    findings.extend(diagnose::flat_throughput(points, &p.device));
    findings.extend(diagnose::fixed_overhead(points, &p.device));
    if let Some(bn) = b_noise {
        let largest = points.iter().map(|q| q.batch).max().unwrap_or(0);
        if let Some(f) = [p.knee_batch.unwrap_or(0), largest]
            .into_iter()
            .find_map(|b| diagnose::above_critical(b, bn))
        {
            findings.push(Finding {
                rule: f.rule,
                message: format!("{}: {}", p.device, f.message),
            });
        }
    }
    findings
}

/// The measured (batch, step time) of a device's batches that ran.
pub fn step_points(p: &DeviceProbe) -> Vec<StepPoint> {
    points_to_steps(&p.points)
}

/// The measured (batch, step time, its error) of the points that ran.
pub fn points_to_steps(points: &[batchfit_report::probe::ProbePoint]) -> Vec<StepPoint> {
    points
        .iter()
        .filter(|q| q.ok())
        .map(|q| StepPoint {
            batch: q.batch,
            step_s: q.step_time_s,
            rel_err: q.step_time_rel_err,
        })
        .collect()
}

/// The measured time of one update at each batch that ran, as a training
/// loop spends it: the mean of the timed steps (slow steps count in a total)
/// plus gathering the batch from the data, which the probe's synthetic batch
/// leaves out.
pub fn update_points(
    p: &DeviceProbe,
    input_seconds: &dyn Fn(u64) -> Option<f64>,
) -> Vec<StepPoint> {
    p.points
        .iter()
        .filter(|q| q.ok())
        .map(|q| StepPoint {
            batch: q.batch,
            step_s: q.step_time_mean_s.unwrap_or(q.step_time_s)
                + input_seconds(q.batch).unwrap_or(0.0),
            rel_err: q.step_time_rel_err,
        })
        .collect()
}

/// The noise run as a prediction: its target (the training loss it ended at:
/// the mean of its evaluations on the fixed training rows over its last 10 %
/// of updates) and S(B) summed over its stretches, each with its own noise
/// scale ([`trajectory`]); the end value alone when the stretches cannot be
/// measured. `None` at learning rate 0 (no run to a target) or without a
/// noise scale.
pub fn prediction_basis(
    n: &NoiseDocument,
    rule: LrRule,
    reference: (u64, f64),
) -> Option<PredictionBasis> {
    prediction_basis_to(n, rule, reference, None)
}

/// [`prediction_basis`] to `target` instead of the run's final loss.
pub fn prediction_basis_to(
    n: &NoiseDocument,
    rule: LrRule,
    reference: (u64, f64),
    target: Option<f64>,
) -> Option<PredictionBasis> {
    let b_end = n.b_simple;
    if n.lr <= 0.0 || n.history.is_empty() {
        return None;
    }
    let losses: Vec<(f64, f64)> = n
        .history
        .iter()
        .filter_map(|r| r.train_loss.map(|l| (r.step as f64, l)))
        .collect();
    let last_tenth = (n.history.len() * 9 / 10) as f64;
    let tail: Vec<f64> = losses
        .iter()
        .filter(|p| p.0 >= last_tenth)
        .map(|p| p.1)
        .collect();
    let target = match target {
        Some(t) => t,
        None if tail.is_empty() => losses.last()?.1,
        None => tail.iter().sum::<f64>() / tail.len() as f64,
    };
    let points: Vec<RunPoint> = n
        .history
        .iter()
        .map(|r| RunPoint {
            updates: r.step as f64,
            g2_raw: r.g2_raw_preconditioned.unwrap_or(r.g2_raw),
            trace_raw: r.trace_raw_preconditioned.unwrap_or(r.trace_raw),
        })
        .collect();
    let run_batch = n.b_big as f64;
    let preconditioned = n.history.iter().any(|r| r.g2_raw_preconditioned.is_some());
    let (curve, updates, segments, method) = match trajectory(&points, &losses, run_batch, target) {
        Some(t) => (
            t.curve(),
            t.updates_to_target,
            t.segments,
            format!(
                "S(B) = Σ ΔS_min,i (1 + B_i/B) over stretches of {SEGMENT_MEASUREMENTS} updates of the noise run, each with its own noise scale B_i{} (McCandlish et al. 2018, section 2.3); the run reached the target after {:.0} updates",
                if preconditioned {
                    " of the step Adam takes, g / (sqrt(v) + ε)"
                } else {
                    ""
                },
                t.updates_to_target
            ),
        ),
        None => {
            let b = b_end?;
            (
                StepsCurve::through(n.steps as f64, run_batch, b),
                n.steps as f64,
                Vec::new(),
                "S(B) through the noise run's updates with its final noise scale (its stretches could not be measured)".to_string(),
            )
        }
    };
    // The rate grows up to B_noise and is held there; never below the run's own
    // batch, whose rate the run trained with (so the rule contains the run).
    let cap = (curve.b_noise.round() as u64).max(n.b_big as u64);
    Some(PredictionBasis {
        lr: LrScaling {
            rule,
            ref_batch: reference.0,
            ref_lr: reference.1,
            cap_batch: Some(cap),
        },
        warmup_epochs: 0.0,
        measured: false,
        run_batch: Some(n.b_big as u64),
        run_lr: Some(n.lr),
        target_loss: target,
        updates_to_target: Some(updates),
        curve,
        b_simple_end: b_end,
        segments,
        method,
        step_time: "the mean of the timed steps plus gathering the batch from the data".into(),
    })
}

/// S(B) fitted to a finished sweep's steps to target, with the sweep's
/// learning-rate rule: the advice then rests on trainings, not on a prediction.
fn measured_basis(
    dir: &std::path::Path,
    graph: &Graph,
    cfg: &AdviseConfig,
    progress: &dyn Progress,
) -> Result<PredictionBasis> {
    let m = crate::sweep::read_measured_steps(dir, progress)?;
    if m.settings.model != graph.name {
        return Err(crate::Error::input(format!(
            "--from-sweep {}: the sweep trained {}, not {}",
            dir.display(),
            m.settings.model,
            graph.name
        )));
    }
    if m.settings.optimizer != cfg.measure.optimizer.name() {
        return Err(crate::Error::input(format!(
            "--from-sweep {}: the sweep trained with {}; add --optimizer {}",
            dir.display(),
            m.settings.optimizer,
            m.settings.optimizer
        )));
    }
    let rule = LrRule::parse(&m.settings.lr_rule)
        .unwrap_or(LrRule::for_optimizer(cfg.measure.optimizer.is_adaptive()));
    Ok(PredictionBasis {
        lr: LrScaling {
            rule,
            ref_batch: m.settings.ref_batch,
            ref_lr: m.settings.ref_lr,
            cap_batch: m.settings.lr_cap,
        },
        warmup_epochs: m.settings.warmup_epochs,
        measured: true,
        run_batch: None,
        run_lr: None,
        target_loss: m.target_loss,
        updates_to_target: None,
        curve: m.curve,
        b_simple_end: None,
        segments: Vec::new(),
        method: format!(
            "S_min and B_noise fitted to the steps to target of {} runs of the sweep in {} (batches {}, {} data)",
            m.runs,
            dir.display(),
            m.batches
                .iter()
                .map(|b| b.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            m.settings.data
        ),
        step_time: "the mean of the timed steps plus gathering the batch from the data".into(),
    })
}

/// From the evidence to the advice: per device a recommendation, every option
/// ranked by predicted time to target, the diagnosis. Spawns nothing.
pub fn decide(e: &Evidence) -> Decision {
    let basis = e.measured.cloned().or_else(|| {
        e.noise
            .and_then(|n| prediction_basis(n, e.rule, e.reference))
    });
    // The noise scale the advice weighs batches with: the run's effective one
    // when the run reached its target, else the measured B_simple.
    let b_simple = e.noise.and_then(|n| n.b_simple);
    let b_noise = basis.as_ref().map(|b| b.curve.b_noise).or(b_simple);
    let measured_band = e.measured.map(|m| NoiseBand::exact(m.curve.b_noise));
    let band = measured_band.or_else(|| {
        e.noise.zip(b_noise).and_then(|(n, bn)| {
            // B_simple's relative band carried over to the effective value.
            let ratio = b_simple.map_or(1.0, |b| bn / b);
            n.b_simple.map(|b| NoiseBand {
                b_noise: bn,
                low: n.b_simple_low.unwrap_or(b) * ratio,
                high: n.b_simple_high.map(|h| h * ratio),
            })
        })
    });
    let mut recommendations = Vec::new();
    let mut options = Vec::new();
    let mut findings: Vec<Finding> = Vec::new();
    for p in e.probes {
        let points = step_points(p);
        let updates = update_points(p, e.input_seconds);
        let (max_batch, max_batch_source) = match p.max_batch {
            Some(m) => (Some(m), MaxBatchSource::Measured),
            None if p.device == "cpu" => (
                e.host_memory.and_then(|m| e.plan_cpu.max_batch(m)),
                MaxBatchSource::PredictedForRam,
            ),
            None => (None, MaxBatchSource::NotSearched),
        };
        let (rec, opts) = recommend(
            &DeviceEvidence {
                device: &p.device,
                points: &updates,
                knee_batch: p.knee_batch,
                efficiency: p.efficiency,
                max_batch,
                max_batch_source,
                noise_hint: "add --data to measure it on your data",
            },
            band,
            LrAdviceInput {
                rule: e.rule,
                reference: Some(e.reference),
            },
        );
        findings.extend(curve_findings(p, &points, b_noise));
        if let (Some(b), Some(m), MaxBatchSource::Measured) =
            (rec.recommended_batch, rec.max_batch, rec.max_batch_source)
        {
            findings.extend(diagnose::near_memory_limit(b, m, &p.device));
        }
        if let Some(b) = rec.recommended_batch
            && let Some(step) = points.iter().find(|q| q.batch == b)
            && let Some(load_s) = (e.input_seconds)(b)
        {
            findings.extend(diagnose::input_bound(load_s, step.step_s, b, &p.device));
        }
        let mut rec = rec;
        if let (Some(b), Some(basis)) = (rec.recommended_batch, &basis) {
            rec.learning_rate = Some(basis.lr.at(b));
        }
        recommendations.push(rec);
        options.extend(opts);
    }
    let s_min = basis.as_ref().map(|b| b.curve.s_min);
    let mut time_to_target = b_noise
        .map(|bn| rank(&options, bn, s_min))
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
    }
}

/// The ramp over the basis's stretches on each measured device, beside the
/// device's fastest fixed option in the time-to-target table.
fn device_schedules(
    basis: &PredictionBasis,
    e: &Evidence,
    table: &[batchfit_tune::target::TimeToTarget],
) -> Vec<batchfit_tune::schedule::DeviceSchedule> {
    use batchfit_tune::schedule::{doubling, noise_so_far, on_device, ramp};
    if basis.segments.is_empty() {
        return Vec::new();
    }
    let widest = noise_so_far(&basis.segments)
        .into_iter()
        .fold(1.0, f64::max);
    e.probes
        .iter()
        .filter_map(|p| {
            let times: Vec<(u64, f64)> = update_points(p, e.input_seconds)
                .iter()
                .map(|q| (q.batch, q.step_s))
                .collect();
            let smallest = times.first()?.0;
            let r = ramp(&basis.segments, &doubling(smallest, widest), &basis.lr)?;
            let best = table
                .iter()
                .filter(|t| t.option.device == p.device)
                .min_by(|a, b| a.vs_best.total_cmp(&b.vs_best))
                .and_then(|t| Some((t.option.effective_batch(), t.steps?, t.seconds?)));
            Some(on_device(&p.device, &r, &times, p.max_batch, best))
        })
        .collect()
}

/// Median seconds to gather `b` rows and build the batch tensors.
fn batch_load_seconds(d: &Dataset, graph: &Graph, b: u64) -> f64 {
    let device = DeviceSpec::Cpu.device().expect("the CPU is always built");
    let mut batcher = batchfit_data::Batcher::new(d.rows, 0);
    let mut times = Vec::new();
    for _ in 0..5 {
        let idx = batcher.next(b as usize);
        let t0 = Instant::now();
        let batch = batchfit_engine::data::from_rows(d, graph, &idx, &device);
        drop(batch);
        times.push(t0.elapsed().as_secs_f64());
    }
    batchfit_tune::stats::summarize(&times).median
}

/// A path that names an existing file, made absolute (so an advice file can
/// be checked from another folder); anything else (`zoo:NAME`,
/// `builtin:digits`) as given.
fn absolute_if_file(s: &str) -> String {
    std::path::Path::new(s)
        .canonicalize()
        .ok()
        .filter(|p| p.is_file())
        .map_or_else(|| s.to_string(), |p| p.display().to_string())
}

/// "AMD EPYC ... (2 cores), 23.4 GiB RAM".
fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let ram = batchfit_plan::devices::host_memory()
        .map(|b| b.to_string())
        .unwrap_or_else(|| "? RAM".into());
    format!("{cpu} ({cores} cores), {ram} RAM")
}

#[cfg(test)]
mod tests {
    use super::*;
    use batchfit_report::probe::ProbePoint;
    use batchfit_tune::noise::NoiseRecord;
    use batchfit_tune::stats::summarize;

    fn probe(device: &str, steps: &[(u64, f64)], max_batch: Option<u64>) -> DeviceProbe {
        DeviceProbe {
            device: device.into(),
            threads: None,
            points: steps
                .iter()
                .map(|&(b, s)| ProbePoint::measured(b, &summarize(&[s, s, s]), None, None, None))
                .collect(),
            max_batch,
            knee_batch: Some(steps[0].0),
            knee_range: None,
            efficiency: 0.9,
            search_trials: 0,
            search: None,
            seconds: 0.0,
            budget: None,
        }
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
        let d = decide(&Evidence {
            probes: &probes,
            plan_cpu: &plan_cpu,
            host_memory: None,
            noise: Some(&noise_doc),
            measured: None,
            rule: LrRule::Sqrt,
            reference: (16, 1e-3),
            input_seconds: &|_| None,
        });
        let order: Vec<(&str, u64, u64)> = d
            .time_to_target
            .iter()
            .map(|t| {
                (
                    t.option.device.as_str(),
                    t.option.micro_batch,
                    t.option.accumulation,
                )
            })
            .collect();
        assert_eq!(
            order,
            [("cuda:0", 25, 1), ("cuda:0", 25, 10), ("cpu", 250, 1)]
        );
        // (1 + 250/25) x 10 ms = 110 ms; x10 accumulation: 2 x 100 ms = 200 ms; CPU 2 x 400 ms.
        assert!((d.time_to_target[1].vs_best - 200.0 / 110.0).abs() < 1e-9);
        assert!((d.time_to_target[2].vs_best - 800.0 / 110.0).abs() < 1e-9);
        let gpu = &d.recommendations[0];
        assert_eq!(gpu.recommended_batch, Some(25));
        assert_eq!(gpu.accumulation.as_ref().map(|a| a.steps), Some(10));
        assert!(d.findings.iter().all(|f| f.rule != "above_critical_batch"));
    }

    /// A noise run whose stretches all measure B = 200 and whose loss falls
    /// linearly: the prediction is S(B) through the updates it took to its
    /// final loss, the rate is held from B_noise, and every row and the
    /// recommendation state that rate.
    #[test]
    fn the_noise_run_sets_the_target_the_curve_and_the_held_rate() {
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
        let basis = prediction_basis(&doc, LrRule::Sqrt, (16, 1e-3)).unwrap();
        // The target is the mean of the evaluations in the last 10 % (at 90 and 99), reached at 94.5.
        let target = (2.0 - 0.015 * 90.0 + 2.0 - 0.015 * 99.0) / 2.0;
        assert!((basis.target_loss - target).abs() < 1e-12);
        assert!(
            (basis.updates_to_target.unwrap() - 94.5).abs() < 1e-9,
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
        let d = decide(&Evidence {
            probes: &probes,
            plan_cpu: &plan_cpu,
            host_memory: None,
            noise: Some(&doc),
            measured: None,
            rule: LrRule::Sqrt,
            reference: (16, 1e-3),
            input_seconds: &|_| None,
        });
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

    /// A noise document as the decision reads it: B_simple, no run (lr 0, so no S_min).
    fn noise_with_b_simple(b_simple: f64) -> NoiseDocument {
        NoiseDocument {
            schema_version: batchfit_report::SCHEMA_VERSION,
            kind: "noise",
            model: "test".into(),
            data: "test".into(),
            rows: 1000,
            b_small: 16,
            b_big: 128,
            lr: 0.0,
            optimizer: "adam".into(),
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
