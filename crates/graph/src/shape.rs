//! Tensor shapes with a symbolic batch dimension.
//!
//! Every activation in a training graph is batch-first, so a [`Shape`] holds
//! only the dimensions of one sample; the batch `B` is implied in front. A
//! recurrent model also has a symbolic sequence length `T` ([`Dim::Seq`]),
//! resolved when a plan or an engine fixes it.

use serde::Serialize;
use std::fmt;

/// One dimension of one sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Dim {
    /// The named sequence length `T` of recurrent models.
    Seq,
    /// A concrete size.
    Fixed(usize),
}

impl Dim {
    /// The size once the sequence length is known.
    pub fn resolve(self, seq_len: usize) -> usize {
        match self {
            Dim::Seq => seq_len,
            Dim::Fixed(n) => n,
        }
    }

    /// The concrete size, or `None` for the symbolic sequence length.
    pub fn fixed(self) -> Option<usize> {
        match self {
            Dim::Seq => None,
            Dim::Fixed(n) => Some(n),
        }
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Seq => write!(f, "T"),
            Dim::Fixed(n) => write!(f, "{n}"),
        }
    }
}

/// The shape of one sample of a tensor (the batch dimension is implied in front).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Shape(pub Vec<Dim>);

impl Shape {
    /// A shape of concrete sizes.
    pub fn fixed(dims: &[usize]) -> Shape {
        Shape(dims.iter().map(|&d| Dim::Fixed(d)).collect())
    }

    /// Number of dimensions of one sample (the full tensor has one more).
    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// Elements of one sample once the sequence length is known.
    pub fn elements(&self, seq_len: usize) -> u64 {
        self.0.iter().map(|d| d.resolve(seq_len) as u64).product()
    }

    /// Concrete sizes of one sample once the sequence length is known.
    pub fn resolve(&self, seq_len: usize) -> Vec<usize> {
        self.0.iter().map(|d| d.resolve(seq_len)).collect()
    }

    /// Whether the sequence length appears in this shape.
    pub fn has_seq(&self) -> bool {
        self.0.contains(&Dim::Seq)
    }

    /// The last dimension, if any.
    pub fn last(&self) -> Option<Dim> {
        self.0.last().copied()
    }

    /// Every dimension concrete, or `None` if one is the sequence length.
    pub fn all_fixed(&self) -> Option<Vec<usize>> {
        self.0.iter().map(|d| d.fixed()).collect()
    }
}

impl fmt::Display for Shape {
    /// `[B, 26, 9, 9]`, `[B, T, 494]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[B")?;
        for d in &self.0 {
            write!(f, ", {d}")?;
        }
        write!(f, "]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn displays_batch_and_sequence_symbolically() {
        let s = Shape(vec![Dim::Seq, Dim::Fixed(494)]);
        assert_eq!(s.to_string(), "[B, T, 494]");
        assert_eq!(s.elements(100), 49_400);
        assert!(s.has_seq());
        assert_eq!(Shape::fixed(&[26, 9, 9]).elements(1), 2106);
    }
}
