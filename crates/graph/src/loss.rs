//! The loss a user names (`--loss`), fitted to the model's output by its layout.
//!
//! A model file says nothing of its loss. [`Graph`]s come with one chosen from
//! the output's shape (`[B, C]` cross-entropy, `[B, T, C]` per frame, else mean
//! squared error; an ONNX model's final softmax also names its class axis).
//! [`Graph::with_loss`] replaces it with the one the user trains with and, for
//! a classification loss, moves the output's class axis last, the layout the
//! IR's losses read.

use crate::error::GraphError;
use crate::graph::{Graph, GraphBuilder, LossKind};
use crate::op::Op;
use crate::shape::{Dim, Shape};
use serde::{Deserialize, Serialize};

/// The losses a user can name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LossChoice {
    /// Mean squared error against a target of the output's shape.
    Mse,
    /// Cross-entropy over the class axis, per position where the output has more
    /// axes (PyTorch's `CrossEntropyLoss` of `[B, C, d1, ...]`).
    CrossEntropy,
    /// Connectionist temporal classification of a sequence output `[B, T, C]`
    /// (or `[B, C, T]` with the class axis named).
    Ctc,
}

/// The loss a model's output is trained with when none is named (docs/model-spec.md,
/// "The loss"): cross-entropy for logits `[B, C]`, per-frame cross-entropy for
/// `[B, T, C]` (C > 1), else MSE. An ONNX export and a spec without `[loss]` alike.
pub fn by_layout(shape: &Shape) -> LossKind {
    let classes = shape.last().and_then(Dim::fixed).unwrap_or(0);
    match shape.rank() {
        1 if classes > 1 => LossKind::CrossEntropy,
        2 if classes > 1 => LossKind::CrossEntropyPerFrame,
        _ => LossKind::Mse,
    }
}

impl LossChoice {
    /// The name `--loss` takes.
    pub fn name(self) -> &'static str {
        match self {
            LossChoice::Mse => "mse",
            LossChoice::CrossEntropy => "ce",
            LossChoice::Ctc => "ctc",
        }
    }

    /// The choice called `s` (`mse`, `ce`, `ctc`).
    pub fn parse(s: &str) -> Option<LossChoice> {
        [LossChoice::Mse, LossChoice::CrossEntropy, LossChoice::Ctc]
            .into_iter()
            .find(|c| c.name() == s)
    }
}

/// A loss and how the output's layout reads for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LossRequest {
    pub choice: LossChoice,
    /// The output's class axis, numbered as PyTorch numbers the output's dims
    /// (the batch is 0, so 1 is the first axis of a sample; negative counts
    /// from the end). `None`: by rank, see [`LossRequest::class_axis_of`].
    pub class_axis: Option<i64>,
    /// CTC's blank class; `None`: 0, PyTorch's `CTCLoss` default.
    pub blank: Option<usize>,
}

impl LossRequest {
    /// `choice` with the class axis by rank and CTC's blank at 0.
    pub fn new(choice: LossChoice) -> LossRequest {
        LossRequest {
            choice,
            class_axis: None,
            blank: None,
        }
    }

    /// The class axis among a sample's `rank` axes: the one named, else the
    /// last for `[C]` and `[T, C]` (a classifier, a sequence tagger, a CTC
    /// model) and the first for three or more axes (`[C, H, W]`, `[C, D, H, W]`:
    /// the channels-first layout that PyTorch's losses read). A name outside
    /// the sample's axes (the batch included) is refused.
    pub fn class_axis_of(&self, rank: usize) -> Result<usize, String> {
        let Some(named) = self.class_axis else {
            return Ok(if rank >= 3 { 0 } else { rank.saturating_sub(1) });
        };
        // Output dims as PyTorch sees them: [B, s0, s1, ...], rank + 1 of them.
        let dims = rank as i64 + 1;
        let at = if named < 0 { dims + named } else { named };
        if at < 1 || at >= dims {
            return Err(format!(
                "--class-axis {named} is not an axis of a sample of the output \
                 (1 to {rank}, or -1 to -{rank}; the batch is axis 0)"
            ));
        }
        Ok(at as usize - 1)
    }

    /// The ONNX importer's loss: whether a final softmax is dropped (it is for
    /// every classification loss, which takes logits) or kept (MSE).
    pub fn import_hint(&self) -> LossKind {
        match self.choice {
            LossChoice::Mse => LossKind::Mse,
            LossChoice::CrossEntropy | LossChoice::Ctc => LossKind::CrossEntropy,
        }
    }
}

impl Graph {
    /// The graph trained with `req`'s loss instead of its own. For a
    /// classification loss the class axis moves last and, past two axes, the
    /// positions become rows `[positions, C]` (two IR nodes after the output);
    /// an output that already ends in a classification layout keeps it unless
    /// the class axis is named. An output the loss cannot read is refused with
    /// the output's name.
    pub fn with_loss(self, req: &LossRequest) -> Result<Graph, GraphError> {
        let output = self.loss.input.clone();
        let shape = self.output().shape.clone();
        let err = |why: String| GraphError::node(&output, why);
        let kind = match req.choice {
            LossChoice::Mse => LossKind::Mse,
            LossChoice::CrossEntropy => LossKind::CrossEntropy,
            LossChoice::Ctc => LossKind::Ctc {
                blank: req.blank.unwrap_or(0),
            },
        };
        let arranged = matches!(
            self.loss.kind,
            LossKind::CrossEntropy | LossKind::CrossEntropyPerFrame | LossKind::Ctc { .. }
        ) && req.class_axis.is_none();
        if kind == LossKind::Mse || (arranged && kind != LossKind::CrossEntropy) {
            let b = GraphBuilder::reopen(self);
            return b.finish(kind, &output);
        }
        let rank = shape.rank();
        if rank == 0 {
            return Err(err(format!(
                "{} needs an axis of classes; the output is {shape}",
                req.choice.name()
            )));
        }
        let axis = if arranged {
            rank - 1
        } else {
            req.class_axis_of(rank).map_err(err)?
        };
        if matches!(kind, LossKind::Ctc { .. }) && rank != 2 {
            return Err(err(format!(
                "ctc needs a sequence of class scores [B, T, C] or [B, C, T]; the output is {shape}"
            )));
        }
        let classes = match shape.0[axis] {
            Dim::Fixed(c) if c > 1 => c,
            ref d => {
                return Err(err(format!(
                    "the class axis {} of {shape} has {d} classes; a classification loss \
                     needs a fixed number above 1",
                    axis + 1
                )));
            }
        };
        let mut b = GraphBuilder::reopen(self);
        let mut at = output.clone();
        if axis != rank - 1 {
            let perm = (0..rank).filter(|&a| a != axis).chain([axis]).collect();
            at = b.push(
                &format!("{output}/classes_last"),
                Op::Transpose { perm },
                &[&at],
            )?;
        }
        let kind = match kind {
            LossKind::CrossEntropy if rank == 1 => kind,
            LossKind::CrossEntropy => {
                if rank > 2 {
                    at = b.push(
                        &format!("{output}/positions"),
                        Op::Reshape {
                            shape: vec![-1, classes as i64],
                        },
                        &[&at],
                    )?;
                }
                LossKind::CrossEntropyPerFrame
            }
            ctc => ctc,
        };
        b.finish(kind, &at)
    }
}
