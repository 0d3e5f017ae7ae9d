//! Model inputs: which graph inputs the IR keeps, their shapes and kinds.

use super::import::{Importer, is_default};
use super::proto::tensor_shape_proto::dimension;
use super::proto::{NodeProto, ValueInfoProto, type_proto};
use super::view::Val;
use crate::error::GraphError;
use crate::graph::InputKind;
use crate::shape::{Dim, Shape};
use std::collections::HashMap;

impl Importer {
    /// Declares the graph inputs that live nodes read as the IR's inputs.
    pub(super) fn add_inputs(&mut self) -> Result<(), GraphError> {
        let has_rnn = self
            .nodes
            .iter()
            .zip(&self.live)
            .any(|(n, &l)| l && is_default(n) && matches!(n.op_type.as_str(), "LSTM" | "GRU"));
        let tokens = self.token_inputs();
        let inputs = std::mem::take(&mut self.inputs);
        for vi in &inputs {
            if self.vals.contains_key(&vi.name) || !self.consumers.contains_key(&vi.name) {
                // An initializer listed as input (IR < 4), or an input nothing live reads.
                continue;
            }
            let vocab = tokens.get(&vi.name).copied();
            let shape = self.input_shape(vi, has_rnn || vocab.is_some())?;
            let kind = match vocab {
                Some(vocab) => InputKind::Tokens { vocab },
                None => InputKind::Float,
            };
            self.b.input_of(&vi.name, shape, kind)?;
            self.used.insert(vi.name.clone());
            self.graph_inputs.insert(vi.name.clone());
            self.vals.insert(vi.name.clone(), Val::Ir(vi.name.clone()));
        }
        Ok(())
    }

    /// Graph inputs whose ids feed an embedding (`Gather` of a constant table, through
    /// `Identity`, `Cast` and `Reshape`),
    /// with the smallest table's row count.
    fn token_inputs(&self) -> HashMap<String, usize> {
        let producer: HashMap<&str, &NodeProto> = self
            .nodes
            .iter()
            .flat_map(|n| n.output.iter().map(move |o| (o.as_str(), n)))
            .collect();
        let mut tokens: HashMap<String, usize> = HashMap::new();
        for (n, _) in self.nodes.iter().zip(&self.live).filter(|(_, l)| **l) {
            if !(is_default(n) && n.op_type == "Gather" && n.input.len() == 2) {
                continue;
            }
            let Some(Val::Const(table)) = self.vals.get(&n.input[0]) else {
                continue;
            };
            if table.dims.len() != 2 || table.dims[0] <= 0 {
                continue;
            }
            let mut ids = n.input[1].as_str();
            // Through aliases and reshapes (GPT-2's `input_ids.view(-1, T)`).
            while let Some(p) = producer.get(ids) {
                if is_default(p) && matches!(p.op_type.as_str(), "Identity" | "Cast" | "Reshape") {
                    ids = &p.input[0];
                } else {
                    break;
                }
            }
            let rows = table.dims[0] as usize;
            tokens
                .entry(ids.to_string())
                .and_modify(|v| *v = (*v).min(rows))
                .or_insert(rows);
        }
        tokens
    }

    /// The sample shape of graph input `vi`; its first dimension is the batch.
    fn input_shape(
        &mut self,
        vi: &ValueInfoProto,
        second_is_seq: bool,
    ) -> Result<Shape, GraphError> {
        let bad = |why: String| GraphError::Invalid(format!("graph input `{}`: {why}", vi.name));
        let tensor = match vi.r#type.as_ref().and_then(|t| t.value.as_ref()) {
            Some(type_proto::Value::TensorType(t)) => t,
            None => return Err(bad("is not a tensor".into())),
        };
        let dims = &tensor
            .shape
            .as_ref()
            .ok_or_else(|| bad("has no shape; export the model with input shapes".into()))?
            .dim;
        if dims.is_empty() {
            return Err(bad(
                "is a scalar; a model input needs a batch dimension".into()
            ));
        }
        if let Some(dimension::Value::DimValue(v)) = dims[0].value
            && v > 0
            && self.batch.is_none()
        {
            self.batch = Some(v);
        }
        let mut shape = Vec::with_capacity(dims.len() - 1);
        for (k, d) in dims.iter().enumerate().skip(1) {
            if let Some(dimension::Value::DimValue(v)) = &d.value
                && *v as u64 > super::MAX_ELEMENTS
            {
                return Err(bad(format!(
                    "dimension {k} is {v}, more than {} elements",
                    super::MAX_ELEMENTS
                )));
            }
            shape.push(match &d.value {
                Some(dimension::Value::DimValue(v)) if *v > 0 => Dim::Fixed(*v as usize),
                Some(dimension::Value::DimParam(p)) if seq_like(p) => Dim::Seq,
                _ if k == 1 && second_is_seq => Dim::Seq,
                other => {
                    let what = match other {
                        Some(dimension::Value::DimParam(p)) => format!("symbolic (`{p}`)"),
                        _ => "unknown".to_string(),
                    };
                    return Err(bad(format!(
                        "dimension {k} is {what}; only the batch (dimension 0) and a sequence \
                         length (a name like `seq` or `time`) may be symbolic"
                    )));
                }
            });
        }
        Ok(Shape(shape))
    }
}

/// Whether a symbolic dimension's name reads like a sequence length.
fn seq_like(name: &str) -> bool {
    let l = name.to_ascii_lowercase();
    l == "t"
        || ["seq", "time", "len", "frame", "step", "token"]
            .iter()
            .any(|w| l.contains(w))
}
