//! Recurrent layers: `LSTM`, `GRU` and the plain `RNN` on a batch-first tensor.

use crate::error::GraphError;
use crate::onnx::decode::{Attrs, positive};
use crate::onnx::import::{Importer, label};
use crate::onnx::proto::NodeProto;
use crate::onnx::sym::Sym;
use crate::onnx::view::{Val, View};
use crate::op::{Cell, Op, RnnBias};
use crate::shape::Dim;

impl Importer {
    /// `LSTM`, `GRU` and `RNN`; their output is a layout view until it is batch-first
    /// again.
    pub(super) fn rnn(&mut self, _i: usize, n: &NodeProto, a: &Attrs) -> Result<(), GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        let cell = match n.op_type.as_str() {
            "LSTM" => Cell::Lstm,
            "GRU" => Cell::Gru,
            _ => plain_cell(a).map_err(err)?,
        };
        if a.get("clip").is_some() {
            return Err(err(format!("{} with `clip` is not supported", n.op_type)));
        }
        let hidden = a
            .get("hidden_size")
            .map(|v| v.i)
            .filter(|&h| h > 0)
            .ok_or_else(|| err(format!("{} needs a positive hidden_size", n.op_type)))?
            as usize;
        let direction = a.string("direction").unwrap_or_else(|| "forward".into());
        let dirs = match direction.as_str() {
            "forward" | "reverse" => 1,
            "bidirectional" => 2,
            other => return Err(err(format!("unknown direction `{other}`"))),
        };
        let layout = a.int("layout", 0);
        // Where the batch is merged with another axis in the sequences' axis (timm's
        // Sequencer runs its LSTMs over `[B·W, H, C]`), the IR input is aligned to
        // `[B, merged, T, features]` and each sample runs its sequences; `Some(true)`
        // when the batch comes first in the merged axis.
        let mut merged = None;
        let x = match (layout, self.val(n, 0)?.clone()) {
            (1, Val::Ir(x)) => x,
            (0, Val::View(v))
                if v.groups.len() == 3
                    && v.transpose(&[1, 0, 2]).is_ok_and(|t| t.batch_first()) =>
            {
                let t = v.transpose(&[1, 0, 2]).expect("checked");
                self.align(n, &t)?.0
            }
            (0, Val::View(v)) if v.groups.len() == 3 => {
                let t = v.transpose(&[1, 0, 2]).map_err(|e| err(e.to_string()))?;
                let (x, lay) = self.align(n, &t)?;
                if lay.b_axis != 0 || lay.b_alone {
                    return Err(err(format!(
                        "input `{}` is seen as {}: the batch is not in the sequences' axis",
                        n.input[0],
                        t.describe()
                    )));
                }
                merged = Some(lay.b_first);
                x
            }
            (0, Val::Ir(_)) => {
                return Err(err(format!(
                    "{} with layout 0 reads [T, B, features]; its input `{}` must come through \
                     Transpose(perm = [1, 0, 2]) of a batch-first tensor",
                    n.op_type, n.input[0]
                )));
            }
            (0 | 1, _) => {
                self.act(n, 0)?;
                return Err(err(format!(
                    "input `{}` does not fit {} layout {layout}",
                    n.input[0], n.op_type
                )));
            }
            (other, _) => return Err(err(format!("unknown layout {other}"))),
        };
        if cell == Cell::Lstm && Self::has_input(n, 7) {
            return Err(err(
                "LSTM peephole weights (input P) are not supported".into()
            ));
        }
        let g = cell.gates() * hidden;
        let input_size = self.last_dim(n, &x)?;
        let check = |pos: usize, what: &str, want: Vec<usize>| -> Result<(), GraphError> {
            let t = self.konst(n, pos, what)?;
            if positive(&t.dims).as_deref() != Some(&want[..]) {
                return Err(err(format!(
                    "{what} has shape {:?}, expected {want:?} for {} hidden_size {hidden} \
                     direction {direction} and input size {input_size}",
                    t.dims, n.op_type
                )));
            }
            Ok(())
        };
        check(1, "weight W", vec![dirs, g, input_size])?;
        check(2, "recurrence weight R", vec![dirs, g, hidden])?;
        if Self::has_input(n, 3) {
            check(3, "bias B", vec![dirs, 2 * g])?;
        }
        let op = Op::Rnn {
            cell,
            input_size,
            hidden,
            bidirectional: dirs == 2,
            bias: RnnBias::Double,
        };
        let name = self.fresh(n);
        self.b.push(&name, op, &[&x])?;
        let b = if Self::has_input(n, 3) {
            self.const_f32(n, 3)
        } else {
            Some(vec![0.0; dirs * 2 * g])
        };
        if let (Some(w), Some(r), Some(b)) = (self.const_f32(n, 1), self.const_f32(n, 2), b) {
            let weights = rnn_weights(cell, dirs, hidden, input_size, &w, &r, &b);
            self.attach(&name, weights.into_iter().map(Some).collect());
        }
        // Y is [B, T, dirs·hidden] in the IR, [T, dirs, B, hidden] (layout 0) or
        // [B, T, dirs, hidden] (layout 1) in ONNX; over a merged batch the IR's
        // [B, merged, T, dirs·hidden] is ONNX's [T, dirs, B·merged (or merged·B), hidden].
        let s = self.shape(&name)?.clone();
        let seq = match s.0.get(s.rank() - 2) {
            Some(Dim::Fixed(t)) => Sym::N(*t as i64),
            _ => Sym::Seq,
        };
        let (dirs, hidden) = (Sym::N(dirs as i64), Sym::N(hidden as i64));
        let y = match merged {
            None => View {
                ir: name.clone(),
                atoms: vec![Sym::Batch, seq, dirs, hidden],
                order: if layout == 1 {
                    vec![0, 1, 2, 3]
                } else {
                    vec![1, 2, 0, 3]
                },
                groups: vec![1; 4],
            },
            Some(b_first) => {
                let Some(Dim::Fixed(m)) = s.0.first() else {
                    return Err(err(
                        "the axis merged with the batch has no fixed size".into()
                    ));
                };
                View {
                    ir: name.clone(),
                    atoms: vec![Sym::Batch, Sym::N(*m as i64), seq, dirs, hidden],
                    order: if b_first {
                        vec![2, 3, 0, 1, 4]
                    } else {
                        vec![2, 3, 1, 0, 4]
                    },
                    groups: vec![1, 1, 2, 1],
                }
            }
        };
        self.define_view(n, y)?;
        for (k, out) in n.output.iter().enumerate().skip(1) {
            if !out.is_empty() {
                let state = if k == 1 { "hidden" } else { "cell" };
                self.vals.insert(
                    out.clone(),
                    Val::Unusable(format!(
                        "the final {state} state of {} `{name}` is not modelled by the IR \
                         (only the full output sequence Y is)",
                        n.op_type
                    )),
                );
            }
        }
        Ok(())
    }
}

/// The IR parameters of an ONNX `LSTM`/`GRU` (see [`Op::params`]): per direction
/// `weight_ih [G*H, I]`, `weight_hh [G*H, H]`, `bias_ih [G*H]`, `bias_hh [G*H]`, from
/// `W [dirs, G*H, I]`, `R [dirs, G*H, H]` and `B [dirs, 2*G*H]`, with the gate blocks
/// moved from ONNX's order (LSTM `i, o, f, c`; GRU `z, r, h`) to PyTorch's
/// (LSTM `i, f, g, o`; GRU `r, z, n`).
fn rnn_weights(
    cell: Cell,
    dirs: usize,
    hidden: usize,
    input: usize,
    w: &[f32],
    r: &[f32],
    b: &[f32],
) -> Vec<Vec<f32>> {
    // For each PyTorch gate, the ONNX gate block it comes from.
    let from: &[usize] = match cell {
        Cell::Lstm => &[0, 2, 3, 1],
        Cell::Gru => &[1, 0, 2],
        Cell::RnnTanh | Cell::RnnRelu => &[0],
    };
    let g = cell.gates() * hidden;
    let reorder = |block: &[f32], cols: usize| -> Vec<f32> {
        from.iter()
            .flat_map(|&k| &block[k * hidden * cols..(k + 1) * hidden * cols])
            .copied()
            .collect()
    };
    let mut out = Vec::with_capacity(4 * dirs);
    for d in 0..dirs {
        out.push(reorder(&w[d * g * input..(d + 1) * g * input], input));
        out.push(reorder(&r[d * g * hidden..(d + 1) * g * hidden], hidden));
        let bd = &b[d * 2 * g..(d + 1) * 2 * g];
        out.push(reorder(&bd[..g], 1));
        out.push(reorder(&bd[g..], 1));
    }
    out
}

/// The plain cell an ONNX `RNN` names in `activations` (default Tanh; one per
/// direction, the same in both).
fn plain_cell(a: &Attrs) -> Result<Cell, String> {
    let names: Vec<String> = a
        .get("activations")
        .map(|v| {
            v.strings
                .iter()
                .map(|s| String::from_utf8_lossy(s).to_ascii_lowercase())
                .collect()
        })
        .unwrap_or_default();
    let first = names.first().map_or("tanh", String::as_str);
    if names.iter().any(|n| n != first) {
        return Err(format!(
            "RNN with activations {names:?}: only the same activation in both directions is \
             supported"
        ));
    }
    match first {
        "tanh" => Ok(Cell::RnnTanh),
        "relu" => Ok(Cell::RnnRelu),
        other => Err(format!(
            "RNN with activation `{other}`: only Tanh and Relu (nn.RNN's) are supported"
        )),
    }
}
