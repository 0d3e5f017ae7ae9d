//! Constant folding of weight rearrangements: `Slice`, `Concat`, `Unsqueeze`,
//! `Squeeze`, `Reshape`, `Transpose` and `Gather` whose data are constants. An export without
//! constant folding (`do_constant_folding=False`, which keeps BatchNorm and Dropout
//! in training mode) leaves them in the graph: PyTorch's LSTM/GRU weights reach the
//! ONNX node as slices of each gate block, concatenated in ONNX's gate order.
//!
//! Element-wise arithmetic, `Expand`, `Trilu` and `Where` of constants fold too:
//! attention's `1 / sqrt(d)` computed from a shape, a causal mask built in the graph.
//!
//! Written by hand: only these few ops on small row-major `f32` tensors are
//! needed, which an ONNX runtime crate would bring with a whole interpreter.

use super::decode::{Attrs, is_int_type, tensor_f32, tensor_ints};
use super::import::{Importer, is_default, label};
use super::proto::{DataType, NodeProto, TensorProto};
use super::sym::Sym;
use super::view::Val;
use crate::error::GraphError;
use std::rc::Rc;

mod numeric;
use numeric::{numeric, unary_fn};

/// A dense row-major constant.
#[derive(Clone)]
struct Dense {
    dims: Vec<usize>,
    values: Vec<f32>,
}

impl Dense {
    fn of(t: &TensorProto) -> Option<Dense> {
        // Axes of size 0 are allowed: an empty slice (of a mask built by `x[a:] = v`
        // with `a` the axis's length) folds on as one.
        let dims = t
            .dims
            .iter()
            .map(|&d| usize::try_from(d).ok())
            .collect::<Option<Vec<_>>>()?;
        Some(Dense {
            dims,
            values: tensor_f32(t)?,
        })
    }

    /// An integer constant (a buffer of position ids) read exactly into floats; axes of
    /// size 0 are allowed, as in [`Dense::of`].
    fn of_ints(t: &TensorProto) -> Option<Dense> {
        let dims = t
            .dims
            .iter()
            .map(|&d| usize::try_from(d).ok())
            .collect::<Option<Vec<_>>>()?;
        let ints = tensor_ints(t).ok()?;
        let exact = ints.iter().all(|v| v.unsigned_abs() <= EXACT_IN_F32);
        exact.then(|| Dense {
            dims,
            values: ints.into_iter().map(|v| v as f32).collect(),
        })
    }

    fn into_tensor(self, name: &str) -> TensorProto {
        TensorProto {
            dims: self.dims.iter().map(|&d| d as i64).collect(),
            data_type: DataType::Float as i32,
            name: name.to_string(),
            float_data: self.values,
            ..Default::default()
        }
    }

    fn into_int_tensor(self, name: &str) -> TensorProto {
        TensorProto {
            dims: self.dims.iter().map(|&d| d as i64).collect(),
            data_type: DataType::Int64 as i32,
            name: name.to_string(),
            int64_data: self.values.into_iter().map(|v| v as i64).collect(),
            ..Default::default()
        }
    }

    /// Elements before `axis`, along it, and after it.
    fn split(&self, axis: usize) -> (usize, usize, usize) {
        let before = self.dims[..axis].iter().product();
        let after = self.dims[axis + 1..].iter().product();
        (before, self.dims[axis], after)
    }

    /// The indices `idx` along `axis` (a gather), keeping the axis.
    fn take(&self, axis: usize, idx: &[usize]) -> Dense {
        let (before, _, after) = self.split(axis);
        let along = self.dims[axis];
        let mut values = Vec::with_capacity(before * idx.len() * after);
        for o in 0..before {
            for &i in idx {
                let at = (o * along + i) * after;
                values.extend_from_slice(&self.values[at..at + after]);
            }
        }
        let mut dims = self.dims.clone();
        dims[axis] = idx.len();
        Dense { dims, values }
    }
}

/// Why a constant cannot be folded.
type Why = String;

/// Integers up to 2^24 are exact in an `f32` (element indices and ids carried as floats).
const EXACT_IN_F32: u64 = 1 << 24;

/// A constant read from a float initializer (a parameter) by folded `Gather`, `Slice`,
/// `Reshape`, ...: element `k` of the constant is element `index[k]` of `table`.
#[derive(Clone, Debug)]
pub(super) struct ReadFrom {
    pub(super) table: String,
    pub(super) len: usize,
    pub(super) index: Vec<usize>,
}

impl ReadFrom {
    /// Whether the constant is the whole table in its order (a plain learned tensor).
    pub(super) fn is_whole(&self) -> bool {
        self.index.len() == self.len && self.index.iter().enumerate().all(|(k, &i)| k == i)
    }
}

/// An integer constant input's values and dims, when the node has that input.
type IntInput = Result<Option<(Vec<i64>, Vec<i64>)>, Why>;

impl Importer {
    /// A constant or a shape value as a dense tensor (the symbolic batch or sequence
    /// length cannot be).
    fn dense_input(&self, n: &NodeProto, pos: usize) -> Option<Dense> {
        match self.vals.get(n.input.get(pos)?.as_str())? {
            Val::Const(t) => Dense::of(t).or_else(|| {
                let values = tensor_ints(t).ok()?.into_iter().map(|v| v as f32).collect();
                let dims = t
                    .dims
                    .iter()
                    .map(|&d| usize::try_from(d).ok())
                    .collect::<Option<Vec<_>>>()?;
                Some(Dense { dims, values })
            }),
            Val::Ints { v, scalar } => {
                let values = v
                    .iter()
                    .map(|s| match s {
                        Sym::N(k) => Some(*k as f32),
                        _ => None,
                    })
                    .collect::<Option<Vec<f32>>>()?;
                let dims = if *scalar { vec![] } else { vec![values.len()] };
                Some(Dense { dims, values })
            }
            _ => None,
        }
    }

    /// Folds element-wise arithmetic, `Expand`, `Trilu` and `Where` of constants (the
    /// attention scale `1 / sqrt(d)` from a shape, a causal mask built in the graph);
    /// `false` when an input is not constant.
    fn fold_numeric(&mut self, n: &NodeProto, a: &Attrs) -> Result<bool, GraphError> {
        let op = n.op_type.as_str();
        if !matches!(
            op,
            "Add"
                | "Sub"
                | "Mul"
                | "Div"
                | "Pow"
                | "Min"
                | "Max"
                | "Mod"
                | "Equal"
                | "Less"
                | "LessOrEqual"
                | "Greater"
                | "GreaterOrEqual"
                | "And"
                | "Or"
                | "Xor"
                | "Where"
                | "Expand"
                | "Tile"
                | "Trilu"
                | "ScatterND"
                | "GatherElements"
                | "Cast"
                | "Clip"
        ) && unary_fn(op).is_none()
        {
            return Ok(false);
        }
        // A shape value stays one through a `Cast` (`alias`), and so does a float tensor
        // cast to a float type (a parameter read at constant indices stays one); tensors
        // cast to integers or booleans convert, and integer tensors to floats.
        let to_int = matches!(a.int("to", 1), 2..=7 | 9 | 12 | 13);
        let first = n.input.first().and_then(|x| self.vals.get(x.as_str()));
        let converts = match first {
            Some(Val::Const(t)) => to_int || is_int_type(t.data_type),
            _ => false,
        };
        if op == "Cast" && !converts {
            return Ok(false);
        }
        // A learned tensor tiled (MViT's temporal positions) is no constant: folded, its
        // elements would stop counting as parameters.
        let learned = |x: &String| self.initializers.contains(x) || self.read_from.contains_key(x);
        if op == "Tile" && n.input.first().is_some_and(learned) {
            return Ok(false);
        }
        let mut data = Vec::new();
        for pos in 0..n.input.len() {
            // `Clip`'s bounds are optional inputs: a missing one reads as no bound.
            if !Self::has_input(n, pos) {
                if op == "Clip" {
                    let unbounded = if pos == 1 { f32::MIN } else { f32::MAX };
                    data.push(Dense {
                        dims: vec![],
                        values: vec![unbounded],
                    });
                }
                continue;
            }
            match self.dense_input(n, pos) {
                Some(d) => data.push(d),
                // A buffer expanded over the batch has the same rows for every sample: a
                // gather along another axis reads them as the buffer's (BERT's
                // `token_type_ids.expand(B, T).gather(1, position_ids)`).
                None if op == "GatherElements" && pos == 0 && a.int("axis", 0) != 0 => {
                    match self.vals.get(n.input[0].as_str()) {
                        Some(Val::Broadcast(t)) => match Dense::of(t).or_else(|| {
                            let values = tensor_ints(t).ok()?.iter().map(|&v| v as f32).collect();
                            let dims = t.dims.iter().map(|&d| d as usize).collect();
                            Some(Dense { dims, values })
                        }) {
                            Some(d) => data.push(d),
                            None => return Ok(false),
                        },
                        _ => return Ok(false),
                    }
                }
                None => return Ok(false),
            }
        }
        // Arithmetic keeps an integer tensor's type (ONNX types the output as input 0; an
        // integer `Div` truncates, as the conversion does): indices computed from
        // positions stay indices (`F.unfold`'s windows). A shape value may stand for its
        // cast to a float (`alias`), so it decides nothing.
        let integer = matches!(
            op,
            "Add"
                | "Sub"
                | "Mul"
                | "Div"
                | "Mod"
                | "Min"
                | "Max"
                | "Neg"
                | "Abs"
                | "Tile"
                | "Expand"
        ) && matches!(first, Some(Val::Const(t)) if is_int_type(t.data_type));
        let folded = numeric(op, data, a)
            .map_err(|why| GraphError::node(label(n), format!("{op} of constants: {why}")))?;
        let name = n.output.first().cloned().unwrap_or_default();
        let tensor = match op {
            "Cast" if to_int => folded.into_int_tensor(&name),
            _ if integer => folded.into_int_tensor(&name),
            _ => folded.into_tensor(&name),
        };
        self.define(n, Val::Const(Rc::new(tensor)));
        Ok(true)
    }

    /// Evaluates an `Einsum` of constants (`einsum::lower` leaves the ones no graph
    /// input reaches). Where operand 0 is a parameter (read at constant indices) and
    /// the others are lookups of zeros and ones that pick one of its elements for
    /// every output element (TensorFlow's MaxViT reads its relative-position table
    /// through two one-hot `Einsum`s), the result still reads the parameter, at the
    /// picked indices; any other product of a parameter computes on it, and is
    /// refused by node.
    fn fold_einsum(&mut self, n: &NodeProto, a: &Attrs) -> Result<bool, GraphError> {
        if !(is_default(n) && n.op_type == "Einsum") {
            return Ok(false);
        }
        let err = |why: String| GraphError::node(label(n), format!("Einsum of constants: {why}"));
        let equation = a
            .string("equation")
            .ok_or_else(|| err("no `equation` attribute".into()))?;
        let data: Vec<Dense> = (0..n.input.len())
            .map(|pos| self.dense_input(n, pos))
            .collect::<Option<_>>()
            .ok_or_else(
                || err("an operand is neither a constant nor reached by an input".into()),
            )?;
        let eval = |data: &[Dense]| {
            let operands: Vec<(&[usize], &[f32])> = data
                .iter()
                .map(|d| (d.dims.as_slice(), d.values.as_slice()))
                .collect();
            super::einsum::evaluate(&equation, &operands).map_err(err)
        };
        let (dims, values) = eval(&data)?;
        let table = n
            .input
            .first()
            .and_then(|x| match self.read_from.get(x.as_str()) {
                Some(r) => Some(r.clone()),
                None => self.initializers.contains(x.as_str()).then(|| ReadFrom {
                    table: x.clone(),
                    len: data[0].values.len(),
                    index: (0..data[0].values.len()).collect(),
                }),
            });
        let mut read_from = None;
        if let Some(r) = table {
            // Every output element is one table element times ones: the lookups are
            // zeros and ones, and the product with a table of ones counts one term.
            let lookups_binary = data[1..]
                .iter()
                .all(|d| d.values.iter().all(|&v| v == 0.0 || v == 1.0));
            let mut probe = data.clone();
            probe[0].values = vec![1.0; probe[0].values.len()];
            let (_, counts) = eval(&probe)?;
            if !(lookups_binary && counts.iter().all(|&c| c == 1.0) && r.len as u64 <= EXACT_IN_F32)
            {
                return Err(err(format!(
                    "`{equation}` computes on parameter `{}` (each output element is not one \
                     of its elements): parameters computed on in the graph are not supported",
                    r.table
                )));
            }
            probe[0].values = r.index.iter().map(|&i| i as f32).collect();
            let (_, picked) = eval(&probe)?;
            read_from = Some(ReadFrom {
                index: picked.into_iter().map(|v| v as usize).collect(),
                ..r
            });
        }
        let name = n.output.first().cloned().unwrap_or_default();
        let tensor = Dense { dims, values }.into_tensor(&name);
        if let Some(r) = read_from {
            self.read_from.insert(name, r);
        }
        self.define(n, Val::Const(Rc::new(tensor)));
        Ok(true)
    }

    /// Folds `n` when it rearranges a float constant or computes on constants;
    /// `false` when it does not.
    pub(super) fn fold(&mut self, n: &NodeProto, a: &Attrs) -> Result<bool, GraphError> {
        if self.fold_numeric(n, a)? || self.fold_einsum(n, a)? {
            return Ok(true);
        }
        let op = n.op_type.as_str();
        if !matches!(
            op,
            "Slice" | "Concat" | "Unsqueeze" | "Squeeze" | "Reshape" | "Gather" | "Transpose"
        ) {
            return Ok(false);
        }
        // Float constants, or integer ones of rank 2 and more (rank 0 and 1 are shape
        // values, `shapes`): a buffer of position ids sliced to the sequence.
        let mut ints = false;
        let data: Vec<Dense> = {
            let count = if op == "Concat" { n.input.len() } else { 1 };
            let mut data = Vec::with_capacity(count);
            for pos in 0..count {
                match n.input.get(pos).and_then(|i| self.vals.get(i.as_str())) {
                    // A shape value of numbers becoming a tensor of rank 2 (`shapes`).
                    Some(Val::Ints { .. }) if op != "Concat" => match self.dense_input(n, pos) {
                        Some(d) => {
                            ints = true;
                            data.push(d);
                        }
                        None => return Ok(false),
                    },
                    Some(Val::Const(t)) => match Dense::of(t) {
                        Some(d) => data.push(d),
                        None => match Dense::of_ints(t) {
                            // ... or of rank 1 made rank 2 (`Unsqueeze`).
                            Some(d) if t.dims.len() >= 2 || op == "Unsqueeze" => {
                                ints = true;
                                data.push(d);
                            }
                            _ => return Ok(false),
                        },
                    },
                    _ => return Ok(false),
                }
            }
            data
        };
        // Which parameter elements the result reads, where input 0 is (read from) a float
        // initializer and the op only moves elements.
        let source = match (op, n.input.first()) {
            ("Concat", _) | (_, None) => None,
            (_, Some(_)) if ints => None,
            (_, Some(x)) => match self.read_from.get(x.as_str()) {
                Some(r) => Some(r.clone()),
                None if self.initializers.contains(x.as_str()) => {
                    let len = data[0].values.len();
                    (len as u64 <= EXACT_IN_F32).then(|| ReadFrom {
                        table: x.clone(),
                        len,
                        index: (0..len).collect(),
                    })
                }
                None => None,
            },
        };
        // Only constants in, like an embedding's ids: left to the op's import otherwise.
        // Indices may also be shape values (`in_proj_weight[E:]` sliced at a size).
        let fixed_ints = |v: &[Sym]| v.iter().all(|s| matches!(s, Sym::N(_)));
        let all_const = (0..n.input.len())
            .filter(|&p| Self::has_input(n, p))
            .all(|p| match self.vals.get(n.input[p].as_str()) {
                Some(Val::Const(_)) => true,
                Some(Val::Ints { v, .. }) => fixed_ints(v),
                _ => false,
            });
        if !all_const {
            return Ok(false);
        }
        // An integer constant input with its dims.
        let int_input = |pos: usize| -> IntInput {
            if !Self::has_input(n, pos) {
                return Ok(None);
            }
            match self.vals.get(n.input[pos].as_str()) {
                Some(Val::Const(t)) => tensor_ints(t)
                    .map(|v| Some((v, t.dims.clone())))
                    .map_err(|e| e.to_string()),
                Some(Val::Ints { v, scalar }) => {
                    let ints: Vec<i64> = v
                        .iter()
                        .map(|s| match s {
                            Sym::N(k) => *k,
                            _ => unreachable!("checked: fixed"),
                        })
                        .collect();
                    let dims = if *scalar {
                        vec![]
                    } else {
                        vec![ints.len() as i64]
                    };
                    Ok(Some((ints, dims)))
                }
                _ => Err(format!(
                    "input `{}` must be a constant to fold {op} of a constant",
                    n.input[pos]
                )),
            }
        };
        let read_from = match &source {
            Some(r) => {
                let ids = Dense {
                    dims: data[0].dims.clone(),
                    values: r.index.iter().map(|&i| i as f32).collect(),
                };
                fold_one(op, vec![ids], a, &int_input)
                    .ok()
                    .map(|d| ReadFrom {
                        index: d.values.into_iter().map(|v| v as usize).collect(),
                        ..r.clone()
                    })
            }
            None => None,
        };
        let folded = fold_one(op, data, a, &int_input)
            .map_err(|why| GraphError::node(label(n), format!("{op} of a constant: {why}")))?;
        let name = n.output.first().cloned().unwrap_or_default();
        let tensor = match ints {
            true => folded.into_int_tensor(&name),
            false => folded.into_tensor(&name),
        };
        if let Some(r) = read_from {
            self.read_from.insert(name, r);
        }
        self.define(n, Val::Const(Rc::new(tensor)));
        Ok(true)
    }
}

/// Normalises a possibly negative axis of a rank-`rank` tensor.
pub(super) fn axis_of(axis: i64, rank: usize) -> Result<usize, Why> {
    let a = if axis < 0 { axis + rank as i64 } else { axis };
    usize::try_from(a)
        .ok()
        .filter(|&a| a < rank)
        .ok_or_else(|| format!("axis {axis} of a rank-{rank} tensor"))
}

/// `Gather` indices into an axis of `len`, negative ones counted from its end.
pub(super) fn gather_indices(ids: &[i64], len: usize) -> Result<Vec<usize>, Why> {
    let d = len as i64;
    ids.iter()
        .map(|&i| {
            let j = if i < 0 { i + d } else { i };
            usize::try_from(j)
                .ok()
                .filter(|&j| (j as i64) < d)
                .ok_or_else(|| format!("index {i} out of an axis of {d}"))
        })
        .collect()
}

fn fold_one(
    op: &str,
    mut data: Vec<Dense>,
    a: &Attrs,
    int_input_dims: &impl Fn(usize) -> IntInput,
) -> Result<Dense, Why> {
    let int_input = |pos: usize| Ok::<_, Why>(int_input_dims(pos)?.map(|(v, _)| v));
    if data.is_empty() {
        return Err(format!("{op} needs an input"));
    }
    let x = data.remove(0);
    let rank = x.dims.len();
    let axes_arg = |pos: usize| -> Result<Option<Vec<i64>>, Why> {
        Ok(int_input(pos)?.or_else(|| a.ints("axes")))
    };
    match op {
        "Unsqueeze" => {
            let axes = axes_arg(1)?.ok_or("Unsqueeze needs axes")?;
            let out_rank = rank + axes.len();
            let mut at = axes
                .iter()
                .map(|&k| axis_of(k, out_rank))
                .collect::<Result<Vec<_>, _>>()?;
            at.sort_unstable();
            if at.windows(2).any(|w| w[0] == w[1]) {
                return Err(format!("Unsqueeze's axes {axes:?} repeat an axis"));
            }
            let mut dims = x.dims.clone();
            for k in at {
                dims.insert(k, 1);
            }
            Ok(Dense { dims, ..x })
        }
        "Squeeze" => {
            let dims = match axes_arg(1)? {
                None => x.dims.iter().copied().filter(|&d| d != 1).collect(),
                Some(axes) => {
                    let at = axes
                        .iter()
                        .map(|&k| axis_of(k, rank))
                        .collect::<Result<Vec<_>, _>>()?;
                    if at.iter().any(|&k| x.dims[k] != 1) {
                        return Err(format!("squeezing an axis of size > 1 of {:?}", x.dims));
                    }
                    x.dims
                        .iter()
                        .enumerate()
                        .filter(|(k, _)| !at.contains(k))
                        .map(|(_, &d)| d)
                        .collect()
                }
            };
            Ok(Dense { dims, ..x })
        }
        "Reshape" => {
            let target = int_input(1)?.ok_or("Reshape needs a shape")?;
            let total = x.values.len();
            let mut dims = Vec::with_capacity(target.len());
            let mut infer = None;
            for (k, &t) in target.iter().enumerate() {
                match t {
                    -1 if infer.is_none() => {
                        infer = Some(k);
                        dims.push(1);
                    }
                    0 => dims.push(*x.dims.get(k).ok_or("Reshape copies a missing axis")?),
                    t if t > 0 => dims.push(t as usize),
                    _ => return Err(format!("bad Reshape target {target:?}")),
                }
            }
            let cannot = || format!("cannot reshape {:?} to {target:?}", x.dims);
            let product = |d: &[usize]| d.iter().try_fold(1usize, |p, &v| p.checked_mul(v));
            let known = product(&dims).ok_or_else(cannot)?;
            if let Some(k) = infer {
                if known == 0 || !total.is_multiple_of(known) {
                    return Err(cannot());
                }
                dims[k] = total / known;
            }
            if product(&dims) != Some(total) {
                return Err(format!("cannot reshape {:?} to {target:?}", x.dims));
            }
            Ok(Dense { dims, ..x })
        }
        "Concat" => {
            let axis = axis_of(a.int("axis", 0), rank)?;
            let mut parts = vec![x];
            parts.extend(data);
            let (before, _, after) = parts[0].split(axis);
            for p in &parts {
                let same = p.dims.len() == rank
                    && (0..rank).all(|k| k == axis || p.dims[k] == parts[0].dims[k]);
                if !same {
                    return Err(format!(
                        "Concat of {:?} and {:?} along axis {axis}",
                        parts[0].dims, p.dims
                    ));
                }
            }
            let mut values = Vec::new();
            for o in 0..before {
                for p in &parts {
                    let block = p.dims[axis] * after;
                    values.extend_from_slice(&p.values[o * block..(o + 1) * block]);
                }
            }
            let mut dims = parts[0].dims.clone();
            dims[axis] = parts.iter().map(|p| p.dims[axis]).sum();
            Ok(Dense { dims, values })
        }
        "Slice" => {
            let starts = int_input(1)?.ok_or("Slice needs starts")?;
            let ends = int_input(2)?.ok_or("Slice needs ends")?;
            let axes = int_input(3)?.unwrap_or_else(|| (0..starts.len() as i64).collect());
            let steps = int_input(4)?.unwrap_or_else(|| vec![1; starts.len()]);
            let mut out = x;
            for (k, &begin) in starts.iter().enumerate() {
                let axis = axis_of(*axes.get(k).ok_or("Slice axes too short")?, rank)?;
                let d = out.dims[axis] as i64;
                let step = *steps.get(k).ok_or("Slice steps too short")?;
                let end = *ends.get(k).ok_or("Slice ends too short")?;
                let clamp =
                    |i: i64, lo: i64, hi: i64| (if i < 0 { i + d } else { i }).clamp(lo, hi);
                let idx: Vec<usize> = match step {
                    s if s > 0 => {
                        let (b, e) = (clamp(begin, 0, d), clamp(end, 0, d));
                        (b..e).step_by(s as usize).map(|i| i as usize).collect()
                    }
                    s if s < 0 => {
                        let (b, e) = (clamp(begin, -1, d - 1), clamp(end, -1, d - 1));
                        let mut v = Vec::new();
                        let mut i = b;
                        while i > e {
                            v.push(i as usize);
                            i += s;
                        }
                        v
                    }
                    _ => return Err("Slice step 0".into()),
                };
                out = out.take(axis, &idx);
            }
            Ok(out)
        }
        "Transpose" => {
            let perm: Vec<usize> = match a.ints("perm") {
                Some(p) => p
                    .iter()
                    .map(|&k| axis_of(k, rank))
                    .collect::<Result<_, _>>()?,
                None => (0..rank).rev().collect(),
            };
            let mut seen = perm.clone();
            seen.sort_unstable();
            if seen != (0..rank).collect::<Vec<_>>() {
                return Err(format!("perm {perm:?} of a rank-{rank} tensor"));
            }
            let dims: Vec<usize> = perm.iter().map(|&k| x.dims[k]).collect();
            let values = permute(&x.values, &x.dims, &perm);
            Ok(Dense { dims, values })
        }
        "Gather" => {
            let (idx, idx_dims) = int_input_dims(1)?.ok_or("Gather needs indices")?;
            let axis = axis_of(a.int("axis", 0), rank)?;
            let idx = gather_indices(&idx, x.dims[axis])?;
            let mut out = x.take(axis, &idx);
            // The gathered axis becomes the index tensor's axes (none for a scalar index).
            out.dims
                .splice(axis..=axis, idx_dims.iter().map(|&d| d as usize));
            Ok(out)
        }
        _ => unreachable!("not a folded op"),
    }
}

/// Row-major `values` of shape `dims` with the axes reordered: output axis `k` is input axis `perm[k]`.
pub(super) fn permute(values: &[f32], dims: &[usize], perm: &[usize]) -> Vec<f32> {
    let rank = dims.len();
    let mut strides = vec![1usize; rank];
    for d in (0..rank.saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * dims[d + 1];
    }
    let out_dims: Vec<usize> = perm.iter().map(|&p| dims[p]).collect();
    let in_strides: Vec<usize> = perm.iter().map(|&p| strides[p]).collect();
    let mut out = Vec::with_capacity(values.len());
    let mut idx = vec![0usize; rank];
    for _ in 0..values.len() {
        out.push(
            values[idx
                .iter()
                .zip(&in_strides)
                .map(|(i, s)| i * s)
                .sum::<usize>()],
        );
        for d in (0..rank).rev() {
            idx[d] += 1;
            if idx[d] < out_dims[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    out
}
