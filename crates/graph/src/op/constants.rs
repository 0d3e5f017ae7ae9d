//! The constants an op carries: what a trainer holds of them, and dropping the graph's copy.

use super::Op;

impl Op {
    /// Bytes of the constants the op carries, which a trainer holds as they are: values
    /// as f32, indices as 64-bit integers (the engine's `usize`, PyTorch's int64 index).
    pub fn constant_bytes(&self) -> u64 {
        match self {
            Op::Constant { values, .. }
            | Op::AddConst { values, .. }
            | Op::MulConst { values, .. } => values.len() as u64 * 4,
            Op::AddTable { index, .. } => index.len() as u64 * 8,
            Op::Take { indices, .. } => indices.len() as u64 * 8,
            _ => 0,
        }
    }

    /// Empties the constants the op carries (see [`Graph::drop_weights`](crate::Graph::drop_weights)).
    pub fn drop_constants(&mut self) {
        match self {
            Op::Constant { values, .. }
            | Op::AddConst { values, .. }
            | Op::MulConst { values, .. } => *values = Vec::new(),
            Op::AddTable { index, .. } => *index = Vec::new(),
            Op::Take { indices, .. } => *indices = Vec::new(),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{GraphBuilder, LossKind, Shape};

    /// A trainer holds its own copy of the constants, so the graph's is dropped with the
    /// weights; the op still says what it was (shape) but carries nothing.
    #[test]
    fn dropping_the_weights_drops_the_constants() {
        let mut g = GraphBuilder::new("consts");
        g.input("x", Shape::fixed(&[4, 8])).unwrap();
        let mask = Op::AddConst {
            shape: vec![4, 8],
            values: vec![0.0; 32],
        };
        g.push("mask", mask, &["x"]).unwrap();
        let take = Op::Take {
            axis: 1,
            indices: vec![3, 2, 1, 0],
        };
        g.push("rows", take, &["mask"]).unwrap();
        g.linear("out", "rows", 2).unwrap();
        let mut graph = g.finish(LossKind::Mse, "out").unwrap();
        let bytes = |graph: &crate::Graph| -> Vec<u64> {
            graph.nodes.iter().map(|n| n.op.constant_bytes()).collect()
        };
        assert_eq!(bytes(&graph), vec![32 * 4, 4 * 8, 0]);
        graph.drop_weights();
        assert_eq!(bytes(&graph), vec![0, 0, 0]);
        match &graph.nodes[0].op {
            Op::AddConst { shape, values } => assert!(shape == &[4, 8] && values.is_empty()),
            other => panic!("the mask became {other:?}"),
        }
        assert!(graph.nodes.iter().all(|n| n.weights.is_none()));
    }
}
