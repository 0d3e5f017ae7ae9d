//! `advise`: load the model and data, run the noise run, probe every device,
//! and hand the evidence to `batchfit_tune::decide`, where the recommendation,
//! the time-to-target table and the diagnosis are decided.

use crate::noise::{DataSource, Init, NoiseSettings, load_data, run_noise};
use crate::probe::{MeasureConfig, Target, probe_device_for};
use crate::rate_check::{RateFindings, checked_decision};
use crate::{Progress, Result};
use batchfit_data::Dataset;
use batchfit_engine::DeviceSpec;
use batchfit_engine::device::BurnDevice;
use batchfit_graph::Graph;
use batchfit_plan::{TrainOptions, plan};
use batchfit_tune::basis::{PredictionBasis, SweepFit, measured_basis};
use batchfit_tune::decide::{
    Advice, AdviceInputs, Evidence, SeedNoise, b_noise_for_probing, decide,
};
use batchfit_tune::lr::{LrRule, LrScaling, scale};
use batchfit_tune::noise::NoiseRun;
use batchfit_tune::target::rows_drawn_from;
use batchfit_tune::world::across_world_sizes;
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
    /// Noise runs (seeds `seed`, `seed + 1`, ...): pooled for the advice, each
    /// decided on alone for the agreement.
    pub noise_seeds: usize,
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
pub fn advise(cfg: &AdviseConfig, progress: &dyn Progress) -> Result<Advice> {
    let started = Instant::now();
    let default_model = cfg.model.is_none();
    let source = cfg.model.as_deref().unwrap_or(crate::DEFAULT_MODEL);
    let graph = batchfit_graph::load_trainable(source, cfg.data.loss.as_ref())?;
    batchfit_engine::model::check_trainable(&graph)?;
    let (devices, devices_not_used) = if cfg.devices.is_empty() {
        let survey = batchfit_engine::device::survey();
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
    let (data, data_profile) = if cfg.data.data.is_some() || default_model {
        let (d, p) = load_data(&cfg.data, &graph, seq_len, default_model)?;
        (Some(training_split(d)), Some(p))
    } else {
        (None, None)
    };
    let rows = data.as_ref().map(|d| d.rows);
    let training_rows = rows.map(|r| r as u64);
    // A data set smaller than one big batch: the noise run's micro-batches
    // shrink so that B_big (k of them) fits it; the report says so. The
    // reference stays at the asked B_small, where --lr was given.
    let b_small = match rows {
        Some(r) if cfg.b_small * cfg.k > r => (r / cfg.k).max(1),
        _ => cfg.b_small,
    };
    let b_big = (b_small * cfg.k) as u64;

    // Steps measured by a sweep, when given, stand in for the noise run's prediction.
    let measured = match &cfg.from_sweep {
        Some(dir) => Some(sweep_basis(dir, &graph, cfg, progress)?),
        None => None,
    };
    // Noise scale first: it is quick and decides what "a good batch" means statistically.
    let settings = NoiseSettings {
        lr: scale(rule, reference.0, reference.1, b_big),
        optimizer: cfg.measure.optimizer,
        steps: cfg.noise_steps,
        b_small,
        k: cfg.k,
        beta: None,
        batches: Vec::new(),
        reference: cfg.reference,
        init: Init::Checkpoint,
        seed: cfg.measure.seed,
        threads: None,
    };
    let runs: Vec<NoiseRun> = match &data {
        Some(d) if cfg.noise_steps > 0 && measured.is_none() => {
            let seeds = cfg.noise_seeds.max(1);
            progress.set_length((cfg.noise_steps * seeds) as u64);
            progress.message("noise scale on the data".into());
            let runs = (0..seeds as u64)
                .map(|i| {
                    let s = NoiseSettings {
                        seed: settings.seed + i,
                        ..settings.clone()
                    };
                    run_noise(&s, &graph, d, seq_len, |_| progress.advance(1))
                })
                .collect::<Result<Vec<_>>>()?;
            progress.set_position(0);
            progress.set_length(0);
            runs
        }
        _ => Vec::new(),
    };
    let noise = NoiseRun::pool(&runs);

    let target = Target {
        source: source.to_string(),
        loss: cfg.data.loss,
        graph: &graph,
        seq_len,
    };
    let b_noise = b_noise_for_probing(measured.as_ref(), noise.as_ref(), rule, reference);
    let mut probes = Vec::new();
    for (i, &d) in devices.iter().enumerate() {
        // The budget left after the noise run, shared by the devices still to measure.
        let measure = MeasureConfig {
            budget_s: cfg.measure.budget_s.map(|b| {
                (b - started.elapsed().as_secs_f64()).max(0.0) / (devices.len() - i) as f64
            }),
            // A batch above the rows a training holds is no batch to train
            // with: the curve stops there (a memory search still goes past it).
            up_to: training_rows.map_or(cfg.measure.up_to, |r| cfg.measure.up_to.min(r)),
            ..cfg.measure.clone()
        };
        probes.push(probe_device_for(&measure, &target, d, b_noise, progress)?);
    }

    let train = TrainOptions {
        optimizer: cfg.measure.optimizer,
        seq_len: cfg.measure.seq_len,
        ..TrainOptions::default()
    };
    let plan_cpu = plan(&graph, &train);
    let input_seconds = |b| data.as_ref().map(|d| batch_load_seconds(d, &graph, b));
    let prior_loss = data
        .as_ref()
        .and_then(|d| prior_loss_on_fixed_rows(d, &graph));
    let decide_on = |noise: Option<&NoiseRun>, rates: &RateFindings| {
        decide(&Evidence {
            probes: &probes,
            plan_cpu: &plan_cpu,
            host_memory: batchfit_plan::devices::host_memory(),
            noise,
            measured: measured.as_ref(),
            rule,
            reference,
            input_seconds: &input_seconds,
            data_rows: training_rows,
            rate_cap: rates.cap,
            rate_failed_from: rates.failed_from,
            rate_unreached_to: rates.unreached_to,
            checked_b_noise: rates.b_noise,
            checked_reference: rates.reference_updates,
            prior_loss,
        })
    };
    // A rate that trains: the rule's rate at the batches the advice names,
    // on the data, from the noise run's initial weights.
    let (decision, rates) = match (&data, &noise) {
        (Some(d), Some(n)) => {
            progress.message("the rate at the advised batches".into());
            let base = settings.train_config(seq_len);
            checked_decision(&graph, &base, d, |r| decide_on(Some(n), r))?
        }
        _ => (
            decide_on(noise.as_ref(), &RateFindings::default()),
            RateFindings::default(),
        ),
    };
    let noise_seeds: Vec<SeedNoise> = if runs.len() > 1 {
        runs.iter()
            .zip(settings.seed..)
            .map(|(r, seed)| {
                // The seed's own noise scale: the checks' refit left out.
                let alone = decide_on(
                    Some(r),
                    &RateFindings {
                        b_noise: None,
                        ..rates.clone()
                    },
                );
                SeedNoise {
                    seed,
                    b_noise: alone.basis.map(|b| b.curve.b_noise),
                    recommended: alone
                        .recommendations
                        .iter()
                        .map(|r| r.recommended_batch)
                        .collect(),
                }
            })
            .collect()
    } else {
        Vec::new()
    };
    // A run that learned nothing from the inputs has no noise scale to scale out with.
    let learned = decision.learning.is_none_or(|l| l.learned);
    // S(B) across world sizes is the time-to-target table's: the prediction's
    // curve (its S_min belongs to its B_noise), else B_simple relative to S_min.
    let steps = match &decision.basis {
        Some(b) => Some((b.curve.b_noise, Some(b.curve.s_min), b.curve.rows)),
        None => noise.as_ref().and_then(|n| {
            n.b_simple
                .map(|bn| (bn, None, rows_drawn_from(n.rows, n.optimizer)))
        }),
    };
    let world_sizes = match (steps.filter(|_| learned), probes.first()) {
        (Some((bn, s_min, data_rows)), Some(p)) if !cfg.gpus.is_empty() => {
            let gpu_plan = plan(&graph, &batchfit_plan::distributed::plan_options(&train));
            Some(across_world_sizes(
                &gpu_plan,
                p,
                &cfg.gpus,
                cfg.strategy,
                &cfg.link,
                bn,
                s_min,
                data_rows,
            ))
        }
        _ => None,
    };
    let budgets = cfg
        .measure
        .memory_limit
        .map(|m| devices.iter().map(|&d| (d, m)).collect())
        .unwrap_or_default();
    Ok(Advice {
        model: graph.name.clone(),
        parameters: graph.param_count(),
        command: cfg.command.clone(),
        inputs: AdviceInputs {
            model: cfg.model.as_deref().map(absolute_if_file),
            data: cfg.data.data.as_deref().map(absolute_if_file),
            labels: cfg.data.labels.as_deref().map(absolute_if_file),
            label_col: cfg.data.label_col.clone(),
            loss: cfg.data.loss.map(|l| l.choice.name().to_string()),
            class_axis: cfg.data.loss.and_then(|l| l.class_axis),
            blank: cfg.data.loss.and_then(|l| l.blank),
            optimizer: cfg.measure.optimizer,
            standardize: cfg.data.standardize,
            seed: settings.seed,
        },
        machine: machine(),
        data: data.as_ref().map(|d| d.source.clone()),
        plan: plan_cpu,
        devices: probes,
        noise,
        decision,
        budgets,
        world_sizes,
        devices_not_used,
        data_profile,
        noise_seeds,
        rate_checks: rates.checks,
        rate_cap: rates.cap,
        rate_failed_from: rates.failed_from,
        rate_unreached_to: rates.unreached_to,
        b_small_asked: (b_small != cfg.b_small).then_some(cfg.b_small),
    })
}

/// S(B) fitted to a finished sweep's steps to target, with the sweep's
/// learning-rate rule: the advice then rests on trainings, not on a prediction.
fn sweep_basis(
    dir: &std::path::Path,
    graph: &Graph,
    cfg: &AdviseConfig,
    progress: &dyn Progress,
) -> Result<PredictionBasis> {
    let (settings, m) = crate::sweep::read_measured_steps(dir, progress)?;
    if settings.model != graph.name {
        return Err(crate::Error::input(format!(
            "--from-sweep {}: the sweep trained {}, not {}",
            dir.display(),
            settings.model,
            graph.name
        )));
    }
    // The same data: S(B) is a property of it. Paths that both resolve and
    // name different files are refused; one that no longer resolves cannot
    // be told apart and is taken at its word.
    let given = cfg
        .data
        .data
        .clone()
        .unwrap_or_else(|| batchfit_data::digits::NAME.to_string());
    let builtin = |d: &str| d.starts_with("builtin:");
    let same = match (
        std::fs::canonicalize(&settings.data),
        std::fs::canonicalize(&given),
    ) {
        (Ok(a), Ok(b)) => a == b,
        _ if builtin(&settings.data) || builtin(&given) => settings.data == given,
        _ => true,
    };
    if !same {
        return Err(crate::Error::input(format!(
            "--from-sweep {}: the sweep trained on {}, not {given}; give --data {}",
            dir.display(),
            settings.data,
            settings.data
        )));
    }
    if settings.optimizer != cfg.measure.optimizer {
        return Err(crate::Error::input(format!(
            "--from-sweep {}: the sweep trained with {}; add --optimizer {}",
            dir.display(),
            settings.optimizer.name(),
            settings.optimizer.name()
        )));
    }
    Ok(measured_basis(
        LrScaling {
            rule: settings.lr_rule,
            ref_batch: settings.ref_batch,
            ref_lr: settings.ref_lr,
            cap_batch: settings.lr_cap,
        },
        settings.warmup_epochs,
        m.target_loss,
        m.curve,
        SweepFit {
            runs: m.runs,
            dir: dir.display().to_string(),
            batches: m.batches,
            data: settings.data,
        },
    ))
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

/// The rows a training keeps after holding out validation rows, as `sweep`
/// (and its check of this advice) splits by default: everything `advise`
/// measures, it measures on them. A tenth fewer rows is another training on a
/// few hundred rows: iris at batch 128 reached the target in 144 ± 6 updates
/// on the split and 185 ± 15 on every row, where advise had measured 189 on
/// every row. A set too small to split (under 4 rows) is kept whole.
fn training_split(data: Dataset) -> Dataset {
    if data.rows < 4 {
        return data;
    }
    let (train, _) = data.split_rows(
        batchfit_data::DEFAULT_VAL_SPLIT,
        batchfit_data::DEFAULT_SPLIT_SEED,
    );
    data.subset(&train)
}

/// The loss of ignoring the inputs on the rows the noise run's loss is
/// evaluated on (its fixed rows, as batchfit's runs see them), so the two
/// compare exactly: no training that ignores the inputs ends below it.
fn prior_loss_on_fixed_rows(data: &Dataset, graph: &Graph) -> Option<f64> {
    let rows = batchfit_engine::sweep::target_rows(data.rows);
    data.subset(&rows).profile(graph).prior_loss()
}
