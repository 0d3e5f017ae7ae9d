//! Looking at the data before training on it ([`Dataset::profile`]), and
//! `--standardize` ([`Dataset::standardize`]): each numeric input feature to
//! zero mean and unit spread, regression targets too, for batchfit's own runs.
//!
//! A feature is what a network's input weights see as one quantity: a column
//! of a flat input, the last axis of a sequence (pooled over its steps), a
//! channel of an image (pooled over its pixels). Token inputs are ids, left as
//! they are.

use crate::{Dataset, Targets};
use batchfit_graph::{Dim, Graph, InputKind};
use batchfit_tune::dataset::{ColumnStats, DataProfile, TargetProfile};

/// The least spread a feature is divided by, as a share of the median spread of
/// its input's features.
pub const SPREAD_FLOOR: f64 = 1.0 / 3.0;

/// The features of one numeric input: for each element of a row, the feature it belongs to.
fn feature_of(shape: &[Dim], dims: &[usize]) -> (usize, FeatureOf) {
    let elems: usize = dims.iter().product();
    match (shape.len(), shape.first()) {
        // A sequence [T, F, ...]: the trailing axes are the features, pooled over T.
        (_, Some(Dim::Seq)) if dims.len() > 1 => {
            let per_step = elems / dims[0].max(1);
            (per_step, Box::new(move |e| e % per_step))
        }
        // An image [C, H, W]: one feature per channel.
        (3.., _) => {
            let per_channel = elems / dims[0].max(1);
            (dims[0], Box::new(move |e| e / per_channel))
        }
        // A flat row: one feature per column.
        _ => (elems, Box::new(|e| e)),
    }
}

/// Running moments of one feature.
#[derive(Clone, Copy)]
struct Moments {
    n: f64,
    sum: f64,
    sum_sq: f64,
    min: f64,
    max: f64,
}

impl Moments {
    const EMPTY: Moments = Moments {
        n: 0.0,
        sum: 0.0,
        sum_sq: 0.0,
        min: f64::INFINITY,
        max: f64::NEG_INFINITY,
    };

    fn push(&mut self, x: f64) {
        self.n += 1.0;
        self.sum += x;
        self.sum_sq += x * x;
        self.min = self.min.min(x);
        self.max = self.max.max(x);
    }

    fn stats(&self) -> ColumnStats {
        let mean = self.sum / self.n.max(1.0);
        let var = (self.sum_sq / self.n.max(1.0) - mean * mean).max(0.0);
        ColumnStats {
            min: self.min,
            max: self.max,
            mean,
            std: var.sqrt(),
        }
    }
}

/// Which feature an element of one sample of an input belongs to.
type FeatureOf = Box<dyn Fn(usize) -> usize>;

impl Dataset {
    /// The numeric inputs' features, input by input: `(input, feature count, element -> feature)`.
    fn numeric_features(&self, graph: &Graph) -> Vec<(usize, usize, FeatureOf)> {
        graph
            .inputs
            .iter()
            .enumerate()
            .filter(|(_, input)| input.kind == InputKind::Float)
            .map(|(i, input)| {
                let elems = self.input_elems[i];
                // The resolved dims: the sequence length is what the rows hold.
                let fixed: usize = input
                    .shape
                    .0
                    .iter()
                    .map(|d| match d {
                        Dim::Fixed(n) => *n,
                        Dim::Seq => 1,
                    })
                    .product();
                let seq = elems / fixed.max(1);
                let dims = input.shape.resolve(seq);
                let (count, of) = feature_of(&input.shape.0, &dims);
                (i, count, of)
            })
            .collect()
    }

    /// Each numeric feature's statistics over every row, in input order.
    fn feature_stats(&self, graph: &Graph) -> Vec<(usize, Vec<ColumnStats>)> {
        self.numeric_features(graph)
            .into_iter()
            .map(|(i, count, of)| {
                let mut m = vec![Moments::EMPTY; count];
                let e = self.input_elems[i];
                for (k, &x) in self.inputs[i].iter().enumerate() {
                    m[of(k % e)].push(x as f64);
                }
                (i, m.iter().map(Moments::stats).collect())
            })
            .collect()
    }

    /// The profile of the data: input scale, constant features, the targets.
    pub fn profile(&self, graph: &Graph) -> DataProfile {
        let stats: Vec<ColumnStats> = self
            .feature_stats(graph)
            .into_iter()
            .flat_map(|(_, s)| s)
            .collect();
        let (max_abs_feature, max_abs) = stats
            .iter()
            .map(|s| s.min.abs().max(s.max.abs()))
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .unwrap_or((0, 0.0));
        let constant: Vec<usize> = (0..stats.len())
            .filter(|&j| stats[j].max == stats[j].min)
            .collect();
        let targets = match &self.targets {
            Targets::Classes {
                labels, classes, ..
            } => {
                let mut counts = vec![0; *classes];
                for &l in labels {
                    counts[l] += 1;
                }
                TargetProfile::Classes { counts }
            }
            Targets::Sequences {
                labels,
                width,
                lengths,
                classes,
                blank,
            } => {
                let mut counts = vec![0; *classes];
                for (row, &len) in labels.chunks(*width).zip(lengths) {
                    row[..len].iter().for_each(|&l| counts[l] += 1);
                }
                TargetProfile::Labels {
                    counts,
                    blank: *blank,
                }
            }
            Targets::Dense { values, .. } => {
                let mut m = Moments::EMPTY;
                values.iter().for_each(|&v| m.push(v as f64));
                TargetProfile::Values(m.stats())
            }
        };
        DataProfile {
            rows: self.rows,
            features: stats.len(),
            max_abs,
            max_abs_feature,
            constant_features: constant.len(),
            first_constant: constant.first().copied(),
            targets,
            standardized: false,
            class_names: self.class_names.clone().unwrap_or_default(),
        }
    }

    /// Every numeric input feature to zero mean and unit spread, and regression
    /// targets too. A feature's spread is floored at [`SPREAD_FLOOR`] of the median
    /// spread of the input's varying features, so a feature that is almost always
    /// one value (a border pixel, nonzero in one row of thousands) is scaled like
    /// its neighbours rather than blown up to |z| of a hundred; constant features
    /// become zero.
    pub fn standardize(&mut self, graph: &Graph) {
        let features = self.numeric_features(graph);
        for ((i, stats), (_, _, of)) in self.feature_stats(graph).into_iter().zip(features) {
            let mut spreads: Vec<f64> = stats.iter().map(|s| s.std).filter(|&s| s > 0.0).collect();
            spreads.sort_by(f64::total_cmp);
            let floor = spreads.get(spreads.len() / 2).copied().unwrap_or(1.0) * SPREAD_FLOOR;
            let e = self.input_elems[i];
            for (k, x) in self.inputs[i].iter_mut().enumerate() {
                let s = stats[of(k % e)];
                *x = if s.std > 0.0 {
                    ((*x as f64 - s.mean) / s.std.max(floor)) as f32
                } else {
                    0.0
                };
            }
        }
        if let Targets::Dense { values, .. } = &mut self.targets {
            let mut m = Moments::EMPTY;
            values.iter().for_each(|&v| m.push(v as f64));
            let s = m.stats();
            for v in values.iter_mut() {
                *v = ((*v as f64 - s.mean) / s.std.max(f64::MIN_POSITIVE)) as f32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use batchfit_graph::GraphBuilder;
    use batchfit_graph::Shape;

    fn mlp(inputs: usize) -> Graph {
        let mut g = GraphBuilder::new("t");
        g.input("x", Shape::fixed(&[inputs])).unwrap();
        g.linear("fc", "x", 3).unwrap();
        g.finish(batchfit_graph::LossKind::CrossEntropy, "fc")
            .unwrap()
    }

    #[test]
    fn raw_columns_are_profiled_and_standardised() {
        let graph = mlp(3);
        // Column 0 raw pixels, column 1 constant, column 2 already small.
        let x: Vec<f32> = (0..100)
            .flat_map(|r| [(r * 2) as f32, 7.0, (r % 3) as f32 * 0.1])
            .collect();
        let mut d = Dataset {
            source: "t".into(),
            rows: 100,
            inputs: vec![x],
            input_elems: vec![3],
            targets: Targets::Classes {
                labels: (0..100).map(|r| r % 3).collect(),
                per_row: 1,
                classes: 3,
            },
            class_names: None,
        };
        let p = d.profile(&graph);
        assert_eq!((p.max_abs, p.max_abs_feature), (198.0, 0));
        assert_eq!((p.constant_features, p.first_constant), (1, Some(1)));
        assert_eq!(p.features, 3);
        d.standardize(&graph);
        let p = d.profile(&graph);
        assert!(p.max_abs < 2.0, "{p:?}");
        let col0: Vec<f32> = d.inputs[0].iter().step_by(3).copied().collect();
        let mean = col0.iter().sum::<f32>() / 100.0;
        assert!(mean.abs() < 1e-4, "{mean}");
        assert!(d.inputs[0].iter().skip(1).step_by(3).all(|&v| v == 0.0));
    }
}
