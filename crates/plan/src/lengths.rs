//! The plan over sequence lengths: memory and FLOPs of a model with a sequence
//! axis as functions of both the batch B and the length T.
//!
//! Every tensor's elements are a product of fixed dimensions and the sequence
//! length, which appears at most twice (attention's T x T scores), so each moment
//! of the step holds `fixed + B x (a + b T + c T^2)` bytes. The decisions below do
//! not fit that form: they plan the graph at each length asked ([`LengthPlanner::at`]),
//! which is exact for every moment. [`SeqMemory`] states the form of the moment that
//! peaks at the longest length, solved from the plans at three lengths.

use crate::plan::{CpuHost, plan_on};
use crate::{Bytes, Plan, TrainOptions, plan};
use batchfit_graph::Graph;
use serde::Serialize;
use std::cell::RefCell;
use std::collections::BTreeMap;

/// Plans of one graph at many lengths, each made once.
pub struct LengthPlanner<'g> {
    graph: &'g Graph,
    opts: TrainOptions,
    /// The CPU burn's rules plan for; `None`: this machine's (see [`plan`]).
    host: Option<CpuHost>,
    plans: RefCell<BTreeMap<usize, Plan>>,
}

impl<'g> LengthPlanner<'g> {
    /// `None` when the graph has no sequence axis (its memory does not depend on T).
    pub fn new(graph: &'g Graph, opts: &TrainOptions) -> Option<LengthPlanner<'g>> {
        Self::on(graph, opts, None)
    }

    /// [`LengthPlanner::new`] for a given CPU (the threads a measurement will use).
    pub fn on(
        graph: &'g Graph,
        opts: &TrainOptions,
        host: Option<CpuHost>,
    ) -> Option<LengthPlanner<'g>> {
        graph.has_seq().then(|| LengthPlanner {
            graph,
            opts: opts.clone(),
            host,
            plans: RefCell::default(),
        })
    }

    /// Runs `f` on the plan at length `t` (planned on first use).
    pub fn at<R>(&self, t: u64, f: impl FnOnce(&Plan) -> R) -> R {
        let t = t.max(1) as usize;
        let mut plans = self.plans.borrow_mut();
        let p = plans.entry(t).or_insert_with(|| {
            let opts = TrainOptions {
                seq_len: Some(t),
                ..self.opts.clone()
            };
            match self.host {
                Some(host) => plan_on(self.graph, &opts, host),
                None => plan(self.graph, &opts),
            }
        });
        f(p)
    }

    /// The largest batch of samples padded to `t` that fits `budget`.
    pub fn max_batch(&self, t: u64, budget: Bytes) -> Option<u64> {
        self.at(t, |p| p.max_batch(budget))
    }

    /// Planned peak of a batch of `batch` samples padded to `t`.
    pub fn bytes_at(&self, batch: u64, t: u64) -> Bytes {
        self.at(t, |p| p.bytes_at(batch))
    }

    /// Training FLOPs (forward and backward) of one sample padded to `t`.
    pub fn train_flops(&self, t: u64) -> f64 {
        self.at(t, |p| p.train_flops_per_sample.0)
    }

    /// The largest padded frames per batch (batch x padded length) such that every
    /// batch within it fits `budget` at any length in `lengths` (ascending, distinct):
    /// the least over those lengths of (largest batch + 1) x T - 1. `None` when a
    /// single sample of some length does not fit.
    pub fn frame_budget(&self, lengths: &[u64], budget: Bytes) -> Option<u64> {
        lengths
            .iter()
            .map(|&t| self.max_batch(t, budget).map(|b| (b + 1) * t - 1))
            .try_fold(u64::MAX, |acc, f| f.map(|f| acc.min(f)))
    }

    /// The memory form of the moment that peaks at `t_max` (see the module doc).
    pub fn seq_memory(&self, t_max: u64) -> SeqMemory {
        let t_max = t_max.max(3);
        let peak_at = self.at(t_max, |p| p.peak_at.clone());
        // The moment's line at T; the plan's large-batch line where that moment is absent.
        let line = |t: u64| {
            self.at(t, |p| {
                let m = p.memory.moments.iter().find(|m| m.moment == peak_at);
                m.map_or((p.memory.fixed_bytes.0, p.memory.per_sample_bytes.0), |m| {
                    (m.fixed_bytes.0, m.per_sample_bytes.0)
                })
            })
        };
        let ts = [t_max / 3, 2 * t_max / 3, t_max].map(|t| t.max(1));
        let ys = ts.map(|t| line(t).1 as f64);
        let xs = ts.map(|t| t as f64);
        // Newton's divided differences through three points.
        let d01 = (ys[1] - ys[0]) / (xs[1] - xs[0]);
        let d12 = (ys[2] - ys[1]) / (xs[2] - xs[1]);
        let c = (d12 - d01) / (xs[2] - xs[0]);
        let b = d01 - c * (xs[0] + xs[1]);
        let a = ys[0] - b * xs[0] - c * xs[0] * xs[0];
        let fixed_bytes = Bytes(line(t_max).0);
        SeqMemory {
            moment: peak_at,
            fixed_bytes,
            per_sample_bytes: a,
            per_frame_bytes: b,
            per_frame_squared_bytes: c,
        }
    }
}

/// `fixed + B x (a + b T + c T^2)` bytes: one moment's memory at batch B and length T.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SeqMemory {
    /// The moment (node and phase) this form is of.
    pub moment: String,
    /// Bytes that grow with neither B nor T (weights, gradients, optimizer state).
    pub fixed_bytes: Bytes,
    /// a: bytes per sample that do not grow with T (per-sequence states, the loss's targets).
    pub per_sample_bytes: f64,
    /// b: bytes per sample per frame.
    pub per_frame_bytes: f64,
    /// c: bytes per sample per frame squared (attention's scores; 0 without attention).
    pub per_frame_squared_bytes: f64,
}

impl SeqMemory {
    /// Bytes at batch `b` and length `t` under this form.
    pub fn bytes(&self, b: u64, t: u64) -> f64 {
        let t = t as f64;
        self.fixed_bytes.as_f64()
            + b as f64
                * (self.per_sample_bytes
                    + self.per_frame_bytes * t
                    + self.per_frame_squared_bytes * t * t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use batchfit_graph::{Dim, GraphBuilder, LossKind, Op, ReduceKind, Shape, zoo};

    #[test]
    fn recurrent_memory_is_linear_in_length() {
        let g = zoo::build("rnn-tutorial").unwrap();
        let lp = LengthPlanner::new(&g, &TrainOptions::default()).unwrap();
        let m = lp.seq_memory(750);
        assert!(m.per_frame_bytes > 0.0);
        // No attention: the squared term is rounding at most.
        assert!(m.per_frame_squared_bytes.abs() * 750.0 < 1e-6 * m.per_frame_bytes);
        // The form reproduces the plan's own line at a fourth length.
        let planned = lp.at(100, |p| {
            let l = p
                .memory
                .moments
                .iter()
                .find(|l| l.moment == m.moment)
                .unwrap();
            (l.fixed_bytes + l.per_sample_bytes * 8).as_f64()
        });
        assert!((m.bytes(8, 100) - planned).abs() / planned < 1e-9);
        // Longer clips fit fewer samples.
        let budget = Bytes(4 << 30);
        assert!(lp.max_batch(750, budget).unwrap() < lp.max_batch(100, budget).unwrap());
    }

    #[test]
    fn frame_budget_fits_every_length() {
        let g = zoo::build("rnn-tutorial").unwrap();
        let lp = LengthPlanner::new(&g, &TrainOptions::default()).unwrap();
        let budget = Bytes(3 << 30);
        let lengths = [50, 200, 400, 750];
        let f = lp.frame_budget(&lengths, budget).unwrap();
        for t in lengths {
            assert!(lp.bytes_at(f / t, t) <= budget, "T = {t}");
        }
        assert!(lengths.iter().any(|&t| lp.bytes_at(f / t + 1, t) > budget));
    }

    #[test]
    fn attention_has_a_squared_term() {
        // x[T, 16] -> q, k -> scores q k^T [T, T] -> softmax -> mean-pool -> fc.
        let mut g = GraphBuilder::new("attn");
        g.input("x", Shape(vec![Dim::Seq, Dim::Fixed(16)])).unwrap();
        g.linear("q", "x", 16).unwrap();
        g.linear("k", "x", 16).unwrap();
        g.push("kt", Op::Transpose { perm: vec![1, 0] }, &["k"])
            .unwrap();
        g.push("scores", Op::MatMul, &["q", "kt"]).unwrap();
        g.push("attn", Op::Softmax { axis: -1 }, &["scores"])
            .unwrap();
        g.push("v", Op::MatMul, &["attn", "x"]).unwrap();
        let mean = Op::Reduce {
            reduce: ReduceKind::Mean,
            axes: vec![1],
            keep_dims: false,
        };
        g.push("pool", mean, &["v"]).unwrap();
        g.linear("out", "pool", 4).unwrap();
        let g = g.finish(LossKind::CrossEntropy, "out").unwrap();
        let lp = LengthPlanner::new(&g, &TrainOptions::default()).unwrap();
        let m = lp.seq_memory(300);
        assert!(m.per_frame_squared_bytes >= 4.0, "{m:?}");
    }

    #[test]
    fn no_sequence_axis_no_planner() {
        let g = zoo::build("digits-mlp").unwrap();
        assert!(LengthPlanner::new(&g, &TrainOptions::default()).is_none());
    }
}
