//! The TOML layer spec: a model written by hand, one `[[layer]]` per node.
//! The format is documented in `docs/model-spec.md`.

use crate::error::GraphError;
use crate::graph::{Graph, GraphBuilder, InputKind, LossKind};
use crate::loss::{LossChoice, LossRequest};
use crate::op::{Cell, Op, PoolKind, ReduceKind, ResizeMode, RnnBias, Standardize, Window};
use crate::shape::{Dim, Shape};
use std::collections::BTreeSet;
use std::path::Path;
use toml::{Table, Value};

/// Reads and builds the spec at `path`; errors name the file and the layer.
pub fn load(path: &Path) -> Result<Graph, GraphError> {
    let text = std::fs::read_to_string(path).map_err(|source| GraphError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse(&text).map_err(|e| e.in_file(path))
}

/// Builds a graph from spec text.
pub fn parse(text: &str) -> Result<Graph, GraphError> {
    let doc: Table = text.parse().map_err(|source| GraphError::Toml { source })?;
    let mut top = Keys::new("the spec", &doc);
    let name = top.str_or("name", "model")?;
    let mut g = GraphBuilder::new(name);
    if let Some(t) = top.usize_opt("seq_len")? {
        g.seq_len(t);
    }
    for (i, input) in top.tables("input")?.iter().enumerate() {
        let mut k = Keys::new(&format!("input #{}", i + 1), input);
        let name = k.str("name")?;
        let shape = k.shape("shape")?;
        let kind = match k.str_or("kind", "float")?.as_str() {
            "float" => InputKind::Float,
            "tokens" => InputKind::Tokens {
                vocab: k.usize("vocab")?,
            },
            other => return Err(k.bad("kind", format!("`{other}`, expected float or tokens"))),
        };
        k.done()?;
        g.input_of(&name, shape, kind)?;
    }
    let layers = top.tables("layer")?;
    if layers.is_empty() {
        return Err(GraphError::Invalid("the spec has no [[layer]]".into()));
    }
    for (i, layer) in layers.iter().enumerate() {
        let name = match layer.get("name") {
            Some(Value::String(s)) => s.clone(),
            _ => format!("layer{}", i + 1),
        };
        let mut k = Keys::new(&format!("layer `{name}`"), layer);
        k.seen.insert("name");
        add_layer(&mut g, &name, &mut k)?;
        k.done()?;
    }
    let last = g.last().unwrap_or_default().to_string();
    let loss = top.table_opt("loss")?;
    // Cross-entropy and CTC read the output by its layout (`Graph::with_loss`).
    let (kind, input, request) = match loss {
        // As an ONNX export's, by the output's layout: logits are trained
        // as `kind = "cross_entropy"` would train them.
        None => match crate::loss::by_layout(g.shape(&last)?) {
            LossKind::Mse => (LossKind::Mse, last, None),
            _ => (
                LossKind::Mse,
                last,
                Some(LossRequest {
                    choice: LossChoice::CrossEntropy,
                    class_axis: None,
                    blank: None,
                }),
            ),
        },
        Some(t) => {
            let mut k = Keys::new("[loss]", t);
            let by_layout = |k: &mut Keys<'_>, choice| -> Result<_, GraphError> {
                Ok(Some(LossRequest {
                    choice,
                    class_axis: k.i64_opt("class_axis")?,
                    blank: if choice == LossChoice::Ctc {
                        k.usize_opt("blank")?
                    } else {
                        None
                    },
                }))
            };
            let (kind, request) = match k.str("kind")?.as_str() {
                "mse" => (LossKind::Mse, None),
                "cross_entropy" | "ce" => {
                    (LossKind::Mse, by_layout(&mut k, LossChoice::CrossEntropy)?)
                }
                "cross_entropy_per_frame" => (LossKind::CrossEntropyPerFrame, None),
                "ctc" => (LossKind::Mse, by_layout(&mut k, LossChoice::Ctc)?),
                other => {
                    return Err(k.bad(
                        "kind",
                        format!(
                            "`{other}`, expected mse, cross_entropy, cross_entropy_per_frame or ctc"
                        ),
                    ));
                }
            };
            let input = k.str_or("input", &last)?;
            k.done()?;
            (kind, input, request)
        }
    };
    top.done()?;
    let graph = g.finish(kind, &input)?;
    match request {
        Some(req) => graph.with_loss(&req),
        None => Ok(graph),
    }
}

fn add_layer(g: &mut GraphBuilder, name: &str, k: &mut Keys) -> Result<(), GraphError> {
    let op = k.str("op")?;
    let inputs: Vec<String> = match (k.take("inputs"), k.take("input")) {
        (Some(Value::Array(a)), None) => a
            .iter()
            .map(|v| v.as_str().map(String::from))
            .collect::<Option<_>>()
            .ok_or_else(|| k.bad("inputs", "must be a list of tensor names"))?,
        (None, Some(Value::String(s))) => vec![s.clone()],
        (None, None) => vec![
            g.last()
                .ok_or_else(|| GraphError::node(name, "the first layer needs `input`"))?
                .to_string(),
        ],
        _ => return Err(k.bad("input", "give either `input = \"name\"` or `inputs = [..]`")),
    };
    let Some(x) = inputs.first().map(String::as_str) else {
        return Err(k.bad("inputs", "is empty; name the layer's inputs"));
    };
    let refs: Vec<&str> = inputs.iter().map(String::as_str).collect();
    match op.as_str() {
        "linear" | "dense" | "fc" => {
            let out = k.usize("out_features")?;
            let bias = k.bool_or("bias", true)?;
            g.linear_with(name, x, out, bias).map(drop)
        }
        "conv1d" | "conv2d" | "conv3d" => {
            let spatial = usize::from(op.as_bytes()[4] - b'0');
            let out_channels = k.usize("out_channels")?;
            let window = k.window(g, name, x, spatial)?;
            let groups = k.usize_opt("groups")?.unwrap_or(1);
            let bias = k.bool_or("bias", true)?;
            // Its keys are read only with `standardize = true` (else unknown keys):
            // timm's `StdConv2d` eps; NFNet's gain scale is `gamma / sqrt(fan_in)`.
            let standardize = match k.bool_or("standardize", false)? {
                true => Some(Standardize {
                    eps: k.f64_or("standardize_eps", 1e-6)? as f32,
                    gain: k.bool_or("gain", false)?,
                    scale: k.f64_or("gain_scale", 1.0)? as f32,
                }),
                false => None,
            };
            let in_channels = g
                .shape(x)?
                .0
                .first()
                .and_then(|d| d.fixed())
                .ok_or_else(|| GraphError::node(name, "needs [B, C, ...] input"))?;
            g.push(
                name,
                Op::Conv {
                    in_channels,
                    out_channels,
                    window,
                    groups,
                    bias,
                    standardize,
                },
                &refs,
            )
            .map(drop)
        }
        "conv_transpose" => {
            let spatial = g.shape(x)?.rank().saturating_sub(1);
            if matches!(k.table.get("padding"), Some(Value::String(_))) {
                return Err(k.bad("padding", "is a number or a list (what is cropped)"));
            }
            let out_channels = k.usize("out_channels")?;
            let window = k.window(g, name, x, spatial)?;
            let output_padding = k.per_dim("output_padding", spatial, 0)?;
            let groups = k.usize_opt("groups")?.unwrap_or(1);
            let bias = k.bool_or("bias", true)?;
            let in_channels = g
                .shape(x)?
                .0
                .first()
                .and_then(|d| d.fixed())
                .ok_or_else(|| GraphError::node(name, "needs [B, C, ...] input"))?;
            let op = Op::ConvTranspose {
                in_channels,
                out_channels,
                window,
                output_padding,
                groups,
                bias,
            };
            g.push(name, op, &refs).map(drop)
        }
        "maxpool" | "avgpool" | "maxpool1d" | "avgpool1d" | "maxpool2d" | "avgpool2d"
        | "maxpool3d" | "avgpool3d" => {
            let pool = if op.starts_with("max") {
                PoolKind::Max
            } else {
                PoolKind::Avg
            };
            let spatial = match op.as_bytes()[op.len() - 2] {
                b'1' => 1,
                b'3' => 3,
                _ => 2,
            };
            let window = k.window(g, name, x, spatial)?;
            g.push(name, Op::Pool { pool, window }, &refs).map(drop)
        }
        "global_maxpool" | "global_avgpool" => {
            let pool = if op == "global_maxpool" {
                PoolKind::Max
            } else {
                PoolKind::Avg
            };
            g.push(name, Op::GlobalPool { pool }, &refs).map(drop)
        }
        "batchnorm" => g.batch_norm(name, x).map(drop),
        "layernorm" => g.layer_norm(name, x).map(drop),
        "rmsnorm" => g.rms_norm(name, x).map(drop),
        "lstm" | "gru" | "rnn" => {
            let cell = match op.as_str() {
                "lstm" => Cell::Lstm,
                "gru" => Cell::Gru,
                _ => match k.str_or("activation", "tanh")?.as_str() {
                    "tanh" => Cell::RnnTanh,
                    "relu" => Cell::RnnRelu,
                    other => {
                        return Err(
                            k.bad("activation", format!("`{other}`, expected tanh or relu"))
                        );
                    }
                },
            };
            let hidden = k.usize("hidden")?;
            let bidirectional = k.bool_or("bidirectional", false)?;
            let bias = match k.str_or("bias", "double")?.as_str() {
                "single" => RnnBias::Single,
                "double" => RnnBias::Double,
                other => {
                    return Err(k.bad("bias", format!("`{other}`, expected single or double")));
                }
            };
            g.rnn(name, x, cell, hidden, bidirectional, bias).map(drop)
        }
        simple => {
            let op = match simple {
                "matmul" => Op::MatMul,
                "relu" => Op::Relu,
                "clipped_relu" => Op::Clamp {
                    min: 0.0,
                    max: k.f64("max")? as f32,
                },
                "clamp" => Op::Clamp {
                    min: k.f64_or("min", f32::MIN.into())?.max(f32::MIN.into()) as f32,
                    max: k.f64_or("max", f32::MAX.into())?.min(f32::MAX.into()) as f32,
                },
                "instance_norm" => Op::InstanceNorm {
                    channels: g
                        .shape(x)?
                        .0
                        .first()
                        .and_then(|d| d.fixed())
                        .ok_or_else(|| GraphError::node(name, "needs [B, C, ...] input"))?,
                    affine: k.bool_or("affine", false)?,
                },
                "leaky_relu" => Op::LeakyRelu {
                    alpha: k.f64_or("alpha", 0.01)? as f32,
                },
                "gelu" => Op::Gelu,
                "tanh" => Op::Tanh,
                "sigmoid" => Op::Sigmoid,
                "exp" => Op::Exp,
                // PyTorch's nn.Hardsigmoid (ONNX's default alpha is 0.2).
                "hardsigmoid" => Op::HardSigmoid {
                    alpha: k.f64_or("alpha", 1.0 / 6.0)? as f32,
                    beta: k.f64_or("beta", 0.5)? as f32,
                },
                "hardswish" => Op::HardSwish,
                "scale" => Op::Scale {
                    factor: k.f64("factor")? as f32,
                },
                // nn.LocalResponseNorm's defaults.
                "lrn" => Op::Lrn {
                    size: k.usize("size")?,
                    alpha: k.f64_or("alpha", 1e-4)? as f32,
                    beta: k.f64_or("beta", 0.75)? as f32,
                    bias: k.f64_or("bias", 1.0)? as f32,
                },
                "slice" => Op::Slice {
                    axis: k.i64_or("axis", 1)?,
                    start: usize::try_from(k.i64_or("start", 0)?)
                        .map_err(|_| k.bad("start", "must not be negative"))?,
                    end: k.usize("end")?,
                },
                "reduce_sum" | "reduce_mean" | "reduce_max" | "reduce_l2" => Op::Reduce {
                    reduce: match simple {
                        "reduce_sum" => ReduceKind::Sum,
                        "reduce_mean" => ReduceKind::Mean,
                        "reduce_l2" => ReduceKind::L2,
                        _ => ReduceKind::Max,
                    },
                    axes: k.i64_list("axes")?,
                    keep_dims: k.bool_or("keep_dims", false)?,
                },
                "softmax" => Op::Softmax {
                    axis: k.i64_or("axis", -1)?,
                },
                "transpose" => Op::Transpose {
                    perm: k.usize_list("perm")?,
                },
                "add_param" => Op::AddParam {
                    shape: k.usize_list("shape")?,
                },
                "mul_param" => Op::MulParam {
                    shape: k.usize_list("shape")?,
                },
                "prelu" => Op::PRelu {
                    shape: k.usize_list("shape")?,
                },
                "add_table" => Op::AddTable {
                    shape: k.usize_list("shape")?,
                    table: k.usize("table")?,
                    index: k.usize_list("index")?,
                },
                "pad" => {
                    let flat = k.usize_list("pads")?;
                    if flat.len() % 2 != 0 {
                        return Err(k.bad("pads", "holds a [before, after] pair per sample axis"));
                    }
                    Op::Pad {
                        pads: flat.chunks(2).map(|p| [p[0], p[1]]).collect(),
                        value: k.f64_or("value", 0.0)? as f32,
                    }
                }
                "resize" => Op::Resize {
                    size: k.usize_list("size")?,
                    mode: match k.str_or("mode", "nearest")?.as_str() {
                        "nearest" => ResizeMode::Nearest,
                        "linear" => ResizeMode::Linear,
                        "cubic" => ResizeMode::Cubic,
                        _ => return Err(k.bad("mode", "is one of nearest, linear, cubic")),
                    },
                    align_corners: k.bool_or("align_corners", false)?,
                },
                "causal_mask" => Op::CausalMask,
                "add_const" | "mul_const" => {
                    let shape = k.usize_list("shape")?;
                    let values = k
                        .f64_list("values")?
                        .into_iter()
                        .map(|v| v as f32)
                        .collect();
                    match op.as_str() {
                        "add_const" => Op::AddConst { shape, values },
                        _ => Op::MulConst { shape, values },
                    }
                }
                "concat_param" => Op::ConcatParam {
                    axis: k.i64_or("axis", 1)?,
                    shape: k.usize_list("shape")?,
                    first: k.bool_or("first", true)?,
                },
                "broadcast_param" => Op::BroadcastParam {
                    shape: k.usize_list("shape")?,
                },
                "flatten" => Op::Flatten,
                "expand" => Op::Expand {
                    shape: k.usize_list("shape")?,
                },
                "reshape" => Op::Reshape {
                    shape: k.i64_list("shape")?,
                },
                "concat" => Op::Concat {
                    axis: k.i64_or("axis", -1)?,
                },
                "add" => Op::Add,
                "mul" => Op::Mul,
                "div" => Op::Div,
                "dropout" => Op::Dropout {
                    p: k.f64("p")? as f32,
                },
                "drop_path" => Op::DropPath {
                    p: k.f64("p")? as f32,
                },
                "embedding" => Op::Embedding {
                    vocab: k.usize("vocab")?,
                    dim: k.usize("dim")?,
                },
                other => {
                    return Err(GraphError::node(
                        name,
                        format!(
                            "unknown op `{other}`; known: {}",
                            crate::op::OP_NAMES.join(", ")
                        ),
                    ));
                }
            };
            g.push(name, op, &refs).map(drop)
        }
    }
}

/// A TOML table whose keys are checked off as they are read, so that a typo
/// (an unknown key) is an error naming the layer instead of silently ignored.
struct Keys<'a> {
    what: String,
    table: &'a Table,
    seen: BTreeSet<&'a str>,
}

impl<'a> Keys<'a> {
    fn new(what: &str, table: &'a Table) -> Keys<'a> {
        Keys {
            what: what.to_string(),
            table,
            seen: BTreeSet::new(),
        }
    }

    fn bad(&self, key: &str, why: impl std::fmt::Display) -> GraphError {
        GraphError::Invalid(format!("{}: `{key}` {why}", self.what))
    }

    fn take(&mut self, key: &'a str) -> Option<&'a Value> {
        let v = self.table.get(key);
        if v.is_some() {
            self.seen.insert(key);
        }
        v
    }

    fn done(&self) -> Result<(), GraphError> {
        match self.table.keys().find(|k| !self.seen.contains(k.as_str())) {
            Some(k) => Err(GraphError::Invalid(format!(
                "{}: unknown key `{k}`",
                self.what
            ))),
            None => Ok(()),
        }
    }

    fn str(&mut self, key: &'a str) -> Result<String, GraphError> {
        match self.take(key) {
            Some(Value::String(s)) => Ok(s.clone()),
            Some(_) => Err(self.bad(key, "must be a string")),
            None => Err(self.bad(key, "is missing")),
        }
    }

    fn str_or(&mut self, key: &'a str, default: &str) -> Result<String, GraphError> {
        match self.take(key) {
            None => Ok(default.to_string()),
            Some(_) => self.str(key),
        }
    }

    fn usize_opt(&mut self, key: &'a str) -> Result<Option<usize>, GraphError> {
        match self.take(key) {
            None => Ok(None),
            Some(Value::Integer(n)) if *n > 0 => Ok(Some(*n as usize)),
            Some(_) => Err(self.bad(key, "must be a positive integer")),
        }
    }

    fn usize(&mut self, key: &'a str) -> Result<usize, GraphError> {
        self.usize_opt(key)?
            .ok_or_else(|| self.bad(key, "is missing"))
    }

    fn i64_or(&mut self, key: &'a str, default: i64) -> Result<i64, GraphError> {
        Ok(self.i64_opt(key)?.unwrap_or(default))
    }

    fn i64_opt(&mut self, key: &'a str) -> Result<Option<i64>, GraphError> {
        match self.take(key) {
            None => Ok(None),
            Some(Value::Integer(v)) => Ok(Some(*v)),
            Some(_) => Err(self.bad(key, "must be an integer")),
        }
    }

    fn f64(&mut self, key: &'a str) -> Result<f64, GraphError> {
        match self.take(key) {
            Some(Value::Float(x)) => Ok(*x),
            Some(Value::Integer(n)) => Ok(*n as f64),
            Some(_) => Err(self.bad(key, "must be a number")),
            None => Err(self.bad(key, "is missing")),
        }
    }

    fn f64_or(&mut self, key: &'a str, default: f64) -> Result<f64, GraphError> {
        match self.take(key) {
            None => Ok(default),
            Some(Value::Float(x)) => Ok(*x),
            Some(Value::Integer(n)) => Ok(*n as f64),
            Some(_) => Err(self.bad(key, "must be a number")),
        }
    }

    fn bool_or(&mut self, key: &'a str, default: bool) -> Result<bool, GraphError> {
        match self.take(key) {
            None => Ok(default),
            Some(Value::Boolean(b)) => Ok(*b),
            Some(_) => Err(self.bad(key, "must be true or false")),
        }
    }

    fn i64_list(&mut self, key: &'a str) -> Result<Vec<i64>, GraphError> {
        match self.take(key) {
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| v.as_integer())
                .collect::<Option<_>>()
                .ok_or_else(|| self.bad(key, "must be a list of integers")),
            _ => Err(self.bad(key, "must be a list of integers")),
        }
    }

    fn f64_list(&mut self, key: &'a str) -> Result<Vec<f64>, GraphError> {
        match self.take(key) {
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| v.as_float().or_else(|| v.as_integer().map(|n| n as f64)))
                .collect::<Option<_>>()
                .ok_or_else(|| self.bad(key, "must be a list of numbers")),
            _ => Err(self.bad(key, "must be a list of numbers")),
        }
    }

    fn usize_list(&mut self, key: &'a str) -> Result<Vec<usize>, GraphError> {
        self.i64_list(key)?
            .into_iter()
            .map(|v| usize::try_from(v).map_err(|_| self.bad(key, "must not be negative")))
            .collect()
    }

    /// An integer or a list of `n` integers.
    fn per_dim(
        &mut self,
        key: &'a str,
        n: usize,
        default: usize,
    ) -> Result<Vec<usize>, GraphError> {
        match self.take(key) {
            None => Ok(vec![default; n]),
            Some(Value::Integer(v)) if *v >= 0 => Ok(vec![*v as usize; n]),
            Some(Value::Array(a)) if a.len() == n => a
                .iter()
                .map(|v| v.as_integer().filter(|&x| x >= 0).map(|x| x as usize))
                .collect::<Option<_>>()
                .ok_or_else(|| self.bad(key, "must hold non-negative integers")),
            Some(_) => Err(self.bad(
                key,
                format!("must be a non-negative integer or a list of {n}"),
            )),
        }
    }

    fn shape(&mut self, key: &'a str) -> Result<Shape, GraphError> {
        let Some(Value::Array(a)) = self.take(key) else {
            return Err(self.bad(key, "must be a list like [26, 9, 9] or [\"T\", 494]"));
        };
        a.iter()
            .map(|v| match v {
                Value::Integer(n) if *n > 0 => Ok(Dim::Fixed(*n as usize)),
                Value::String(s) if s == "T" => Ok(Dim::Seq),
                _ => Err(self.bad(key, "holds positive integers or \"T\"")),
            })
            .collect::<Result<_, _>>()
            .map(Shape)
    }

    fn window(
        &mut self,
        g: &GraphBuilder,
        name: &str,
        input: &str,
        spatial: usize,
    ) -> Result<Window, GraphError> {
        let kernel = self.per_dim("kernel", spatial, 0)?;
        if kernel.contains(&0) {
            return Err(self.bad("kernel", "is missing or zero"));
        }
        let stride = match self.table.get("stride") {
            None if self
                .table
                .get("op")
                .and_then(Value::as_str)
                .is_some_and(|o| o.contains("pool")) =>
            {
                kernel.clone()
            }
            _ => self.per_dim("stride", spatial, 1)?,
        };
        let dilation = self.per_dim("dilation", spatial, 1)?;
        for (key, values) in [("stride", &stride), ("dilation", &dilation)] {
            if values.contains(&0) {
                return Err(self.bad(key, "must be positive"));
            }
        }
        let mut window = Window {
            padding: vec![[0, 0]; spatial],
            kernel,
            stride,
            dilation,
        };
        match self.take("padding") {
            Some(Value::String(s)) if s == "same" => {
                window.padding = g.same_padding(name, input, &window)?;
            }
            Some(Value::String(s)) if s == "valid" => {}
            Some(Value::String(s)) => {
                return Err(self.bad(
                    "padding",
                    format!("`{s}`, expected same, valid or integers"),
                ));
            }
            Some(_) => {
                self.seen.remove("padding");
                let p = self.per_dim("padding", spatial, 0)?;
                window.padding = p.iter().map(|&x| [x, x]).collect();
            }
            None => {}
        }
        Ok(window)
    }

    fn tables(&mut self, key: &'a str) -> Result<Vec<&'a Table>, GraphError> {
        match self.take(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| v.as_table())
                .collect::<Option<_>>()
                .ok_or_else(|| self.bad(key, format!("must be [[{key}]] tables"))),
            Some(_) => Err(self.bad(key, format!("must be [[{key}]] tables"))),
        }
    }

    fn table_opt(&mut self, key: &'a str) -> Result<Option<&'a Table>, GraphError> {
        match self.take(key) {
            None => Ok(None),
            Some(Value::Table(t)) => Ok(Some(t)),
            Some(_) => Err(self.bad(key, "must be a [table]")),
        }
    }
}

#[cfg(test)]
mod tests;
