//! `noise`: the gradient noise scale of a real run on the user's data, the
//! critical batch, steps and epochs per batch, learning-rate scaling; and the
//! data loading every data-driven pipeline shares.

use crate::{Error, Result};
use batchfit_data::{Dataset, ReadOptions};
use batchfit_engine::noise::{NoiseConfig, measure_noise};
use batchfit_engine::{DeviceSpec, TrainConfig, Trainer};
use batchfit_graph::Graph;
use batchfit_plan::Optimizer;
use batchfit_tune::dataset::DataProfile;
use batchfit_tune::noise::{NoiseRecord, NoiseRun, NoiseRunSetup};

pub use batchfit_graph::{LossChoice, LossRequest};

/// Where the training data comes from.
#[derive(Clone, Debug, Default)]
pub struct DataSource {
    /// A data file, or `builtin:digits`; `None`: the shipped digits for the default model.
    pub data: Option<String>,
    /// Labels for single-array formats (.npy, IDX).
    pub labels: Option<String>,
    /// CSV column of the label (negative counts from the end).
    pub label_col: Option<batchfit_tune::dataset::LabelCol>,
    /// Replaces the model's loss (`--loss`).
    pub loss: Option<LossRequest>,
    /// Train batchfit's own runs on standardised inputs (and regression targets).
    pub standardize: bool,
}

/// Where a run's initial weights come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Init {
    /// The model file's own weights (random for models without any).
    #[default]
    Checkpoint,
    /// Random weights, even when the file has trained ones.
    Random,
}

/// How to measure the noise scale.
#[derive(Clone, Debug)]
pub struct NoiseSettings {
    /// Learning rate of the run; 0 measures at fixed weights.
    pub lr: f64,
    pub optimizer: Optimizer,
    /// Measurements (and optimizer steps) in the run.
    pub steps: usize,
    pub b_small: usize,
    /// B_big = k x B_small.
    pub k: usize,
    /// Smoothing of the moving averages (`None`: 0.95, or a plain mean at lr 0).
    pub beta: Option<f64>,
    /// Batches to predict steps and epochs for (empty: powers of two up to the data size).
    pub batches: Vec<u64>,
    /// The user's tuned (batch, learning rate), for the learning-rate table.
    pub reference: Option<(u64, f64)>,
    pub init: Init,
    pub seed: u64,
    pub threads: Option<usize>,
}

impl NoiseSettings {
    /// How the run trains: its optimizer, rate, seed and initial weights, on the CPU.
    pub fn train_config(&self, seq_len: usize) -> TrainConfig {
        TrainConfig {
            optimizer: self.optimizer,
            lr: self.lr,
            seq_len,
            seed: self.seed,
            device: DeviceSpec::Cpu,
            init_random: self.init == Init::Random,
        }
    }

    /// `noise`'s defaults (measurements, B_small, B_big; random initial
    /// weights, seed 0) for `optimizer` at learning rate `lr`.
    pub fn defaults(optimizer: Optimizer, lr: f64, threads: Option<usize>) -> NoiseSettings {
        NoiseSettings {
            lr,
            optimizer,
            steps: batchfit_tune::noise::DEFAULT_STEPS,
            b_small: batchfit_tune::noise::DEFAULT_B_SMALL,
            k: batchfit_tune::noise::DEFAULT_K,
            beta: None,
            batches: Vec::new(),
            reference: None,
            init: Init::Random,
            seed: 0,
            threads,
        }
    }
}

/// B_simple with its band (high infinite when unbounded) of a run with
/// `settings` on `data`; `None` when the data has fewer rows than B_big or the
/// run measured none.
pub fn b_simple_on(
    settings: &NoiseSettings,
    graph: &Graph,
    data: &Dataset,
    seq_len: usize,
) -> Result<Option<(f64, f64, f64)>> {
    if settings.b_small * settings.k > data.rows {
        return Ok(None);
    }
    let run = run_noise(settings, graph, data, seq_len, |_| {})?;
    Ok(run.b_simple.map(|b| {
        (
            b,
            run.b_simple_low.unwrap_or(0.0),
            run.b_simple_high.unwrap_or(f64::INFINITY),
        )
    }))
}

/// Loads the data (the shipped digits for the default model when none is given),
/// profiled as it is read, then standardised when asked.
pub fn load_data(
    source: &DataSource,
    graph: &Graph,
    seq_len: usize,
    default_model: bool,
) -> Result<(Dataset, DataProfile)> {
    let path = match (&source.data, default_model) {
        (Some(p), _) => p.clone(),
        (None, true) => batchfit_data::digits::NAME.to_string(),
        (None, false) => {
            return Err(Error::input(
                "this needs --data PATH: the noise scale is a property of your data (use --data builtin:digits for the shipped digits with a 64-input, 10-class model)",
            ));
        }
    };
    let mut data = if path == batchfit_data::digits::NAME {
        if let Some(l) = &source.labels {
            return Err(Error::input(format!(
                "--labels {l}: {path} carries its own labels"
            )));
        }
        batchfit_data::digits::load(graph)?
    } else {
        Dataset::load(
            &path,
            &ReadOptions {
                labels: source.labels.clone(),
                label_col: source.label_col.clone(),
            },
            graph,
            seq_len,
        )?
    };
    let mut profile = data.profile(graph);
    if source.standardize {
        data.standardize(graph);
        profile.standardized = true;
    }
    Ok((data, profile))
}

/// Runs the measurement on `data` and concludes it; `progress` sees every record.
pub fn run_noise(
    settings: &NoiseSettings,
    graph: &Graph,
    data: &Dataset,
    seq_len: usize,
    mut progress: impl FnMut(&NoiseRecord),
) -> Result<NoiseRun> {
    if settings.k < 2 {
        return Err(Error::input(format!(
            "k = {}: the estimator needs B_big = k x B_small above B_small (k of at least 2)",
            settings.k
        )));
    }
    if let Some(n) = settings.threads {
        // Fails only if already set in this process, which is harmless.
        let _ = batchfit_engine::set_threads(n);
    }
    let mut trainer = Trainer::new(graph, settings.train_config(seq_len))?;
    let beta = match settings.beta {
        Some(b) if b > 0.0 && b < 1.0 => Some(b),
        Some(_) => None,
        None if settings.lr == 0.0 => None,
        None => Some(0.95),
    };
    let cfg = NoiseConfig {
        b_small: settings.b_small,
        k: settings.k,
        steps: settings.steps,
        beta,
        seed: settings.seed,
    };
    let (history, est) = measure_noise(&mut trainer, graph, data, &cfg, &mut progress)?;
    Ok(NoiseRun::conclude(
        NoiseRunSetup {
            model: graph.name.clone(),
            data: data.source.clone(),
            rows: data.rows,
            b_small: settings.b_small,
            k: settings.k,
            lr: settings.lr,
            optimizer: settings.optimizer,
            steps: settings.steps,
            batches: settings.batches.clone(),
            reference: settings.reference,
        },
        history,
        est.estimate(),
    ))
}

/// `noise` end to end: load the model (the default when `model` is `None`)
/// and its data, measure, report.
pub fn noise(
    model: Option<&str>,
    data: &DataSource,
    settings: &NoiseSettings,
    progress: impl FnMut(&NoiseRecord),
) -> Result<(NoiseRun, DataProfile)> {
    let default_model = model.is_none();
    let graph =
        batchfit_graph::load_trainable(model.unwrap_or(crate::DEFAULT_MODEL), data.loss.as_ref())?;
    let seq_len = graph.default_seq_len.unwrap_or(1);
    let (dataset, profile) = load_data(data, &graph, seq_len, default_model)?;
    Ok((
        run_noise(settings, &graph, &dataset, seq_len, progress)?,
        profile,
    ))
}
