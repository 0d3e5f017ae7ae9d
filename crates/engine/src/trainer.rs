//! A training step: forward, loss, backward, optimizer.

use crate::cpu::adam::{AdamRule, CpuAdam};
use crate::device::{BurnDevice, DeviceSpec};
use crate::model::{Batch, Init, Params, Program, Unsupported};
use batchfit_graph::Graph;
use batchfit_plan::Optimizer;
use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::momentum::MomentumConfig;
use burn::optim::{AdamConfig, AdamWConfig, GradientsParams, ModuleOptimizer, SgdConfig};
use burn::tensor::{Device, Gradients, Tensor};

/// Why the engine cannot train a model.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The graph has an op or weights the engine cannot train.
    #[error(transparent)]
    Unsupported(#[from] Unsupported),
    /// The device cannot be used: why, as [`DeviceSpec::autodiff_device`] says.
    #[error(transparent)]
    Device(#[from] crate::DeviceError),
}

/// How to train.
#[derive(Clone, Debug)]
pub struct TrainConfig {
    /// The update rule, with PyTorch's default settings.
    pub optimizer: Optimizer,
    /// Learning rate.
    pub lr: f64,
    /// Sequence length of recurrent models (1 for models without one).
    pub seq_len: usize,
    /// Seeds the device's generator: initial weights and dropout masks.
    pub seed: u64,
    /// Where the steps run.
    pub device: DeviceSpec,
    /// Start from random parameters even when the graph carries trained
    /// values (an ONNX file's weights); `false` starts from those values.
    pub init_random: bool,
}

/// A model with its parameters and optimizer on a device.
pub struct Trainer {
    /// The compiled graph.
    pub program: Program,
    params: Option<Params>,
    optim: ModuleOptimizer,
    /// The autodiff device the parameters live on.
    pub device: Device,
    /// How it trains; the learning rate may change between steps.
    pub config: TrainConfig,
}

impl Trainer {
    /// Compiles `graph` and creates its parameters and optimizer on the configured device.
    pub fn new(graph: &Graph, config: TrainConfig) -> Result<Trainer, EngineError> {
        if config.device != DeviceSpec::Cpu {
            crate::model::check_trainable_on_gpu(graph)?;
        }
        let device = config.device.autodiff_device()?;
        device.seed(config.seed);
        let init = if config.init_random {
            Init::Random
        } else {
            Init::FromGraph
        };
        let (program, params) = Program::new(graph, config.seq_len, init, &device)?;
        // PyTorch's defaults, not burn's (burn: momentum dampening 0.1, Adam epsilon 1e-5).
        let optim = match config.optimizer {
            Optimizer::Sgd => SgdConfig::new().init(),
            Optimizer::Momentum => SgdConfig::new()
                .with_momentum(Some(
                    MomentumConfig::new().with_momentum(0.9).with_dampening(0.0),
                ))
                .init(),
            // Adam and AdamW update flex tensors in one pass (engine `cpu/adam.rs`).
            Optimizer::Adam => {
                let rule = AdamRule::pytorch(0.0, false);
                let burn = AdamConfig::new().with_epsilon(rule.epsilon).build();
                CpuAdam::new(burn, rule).into()
            }
            Optimizer::Adamw => {
                let rule = AdamRule::pytorch(0.01, true);
                let burn = AdamWConfig::new()
                    .with_epsilon(rule.epsilon)
                    .with_weight_decay(rule.weight_decay)
                    .build();
                CpuAdam::new(burn, rule).into()
            }
        };
        Ok(Trainer {
            program,
            params: Some(params),
            optim,
            device,
            config,
        })
    }

    /// The parameters.
    pub fn params(&self) -> &Params {
        self.params
            .as_ref()
            .expect("params are present between steps")
    }

    /// Replaces the parameters (tests set known weights).
    pub fn set_params(&mut self, params: Params) {
        self.params = Some(params);
    }

    /// Forward and loss, with the autodiff graph kept.
    pub fn loss(&self, batch: &Batch, train: bool) -> Tensor<1> {
        let out = self.program.forward(self.params(), batch, train);
        self.program.loss(out, &batch.target)
    }

    /// Forward, backward: the loss value and the gradients.
    pub fn gradients(&self, batch: &Batch) -> (f32, Gradients) {
        self.gradients_with(batch, true)
    }

    /// Forward, backward, with dropout on (`train`) or off.
    pub fn gradients_with(&self, batch: &Batch, train: bool) -> (f32, Gradients) {
        let loss = self.loss(batch, train);
        let grads = loss.backward();
        (loss.into_scalar::<f32>(), grads)
    }

    /// One full training step at the configured learning rate; returns the loss.
    pub fn step(&mut self, batch: &Batch) -> f32 {
        let (loss, grads) = self.gradients(batch);
        self.apply(grads);
        loss
    }

    /// The optimizer update with these gradients.
    pub fn apply(&mut self, grads: Gradients) {
        let params = self
            .params
            .take()
            .expect("params are present between steps");
        let gp = GradientsParams::from_grads(grads, &params);
        self.params = Some(self.optim.step(self.config.lr, params, gp));
    }

    /// Waits for the device to finish queued work (before reading a clock).
    pub fn sync(&self) {
        // Flex runs eagerly; GPU backends queue work. An error here means the
        // device failed, which the next tensor read reports with detail.
        let _ = self.device.sync();
    }

    /// The whole gradient flattened in parameter order (for averaging micro-batches).
    pub fn grad_vector(&self, grads: &Gradients) -> Vec<f64> {
        struct Collect<'a> {
            grads: &'a Gradients,
            out: Vec<f64>,
        }
        impl ModuleVisitor for Collect<'_> {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
                if let Some(g) = param.val().grad(self.grads) {
                    let v = g
                        .into_data()
                        .try_to_vec::<f32>()
                        .expect("gradients are f32");
                    self.out.extend(v.into_iter().map(f64::from));
                }
            }
        }
        let mut c = Collect {
            grads,
            out: Vec::new(),
        };
        self.params().visit(&mut c);
        c.out
    }

    /// Number of trainable scalars.
    pub fn num_params(&self) -> usize {
        self.params().num_params()
    }
}
