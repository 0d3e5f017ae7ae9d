//! Convolutions and pools, with the window their attributes describe.

use super::linear::bias_values;
use crate::error::GraphError;
use crate::onnx::decode::tensor_floats;
use crate::onnx::decode::{Attrs, positive, tensor_f32};
use crate::onnx::import::{Importer, label};
use crate::onnx::proto::NodeProto;
use crate::onnx::sym::Sym;
use crate::onnx::view::Val;
use crate::op::{Op, PoolKind, ResizeMode, Window};

impl Importer {
    /// `Conv` over 1, 2 or 3 spatial dimensions, folding a following bias `Add`.
    pub(super) fn conv(&mut self, i: usize, n: &NodeProto, a: &Attrs) -> Result<(), GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        let x = self.act(n, 0)?;
        // A weight standardised in the graph is its raw initializer, standardised here.
        let held = n.input.get(1).and_then(|w| self.standardizing.get(w));
        let held_weight = held.is_some();
        let (w, standardize, gain) = match held {
            Some(s) => (
                s.weight.clone(),
                Some(s.standardize.clone()),
                s.gain.clone(),
            ),
            None => (self.konst(n, 1, "Conv weight W")?, None, None),
        };
        let wd = positive(&w.dims)
            .filter(|d| (3..=5).contains(&d.len()))
            .ok_or_else(|| {
                err(format!(
                    "Conv weight W has shape {:?}; only 1-d, 2-d and 3-d convolutions are supported",
                    w.dims
                ))
            })?;
        let spatial = wd.len() - 2;
        let in_channels = self.channels(n, &x)?;
        let groups = a.int("group", 1);
        if groups < 1 || wd[1] * groups as usize != in_channels {
            return Err(err(format!(
                "weight W {wd:?} with group {groups} does not fit {in_channels} input channels"
            )));
        }
        let kernel = wd[2..].to_vec();
        if let Some(ks) = a.ints("kernel_shape")
            && positive(&ks).as_deref() != Some(&kernel[..])
        {
            return Err(err(format!(
                "kernel_shape {ks:?} differs from the weight's kernel {kernel:?}"
            )));
        }
        let window = self.window(n, a, &x, kernel, false)?;
        let out_channels = wd[0];
        let (bias, bias_vals, folded) = self.channel_bias(i, n, spatial, out_channels);
        let op = Op::Conv {
            in_channels,
            out_channels,
            window,
            groups: groups as usize,
            bias,
            standardize,
        };
        let name = self.emit_with_bias(n, op, &x, tensor_f32(&w), bias_vals, folded, gain)?;
        if held_weight {
            self.sources.entry(name).or_default().push(w.name.clone());
        }
        Ok(())
    }

    /// A convolution's bias: input 2, else a following `Add` of `[1, C, 1, ...]` folded
    /// in (its values, and the folded node's output to redirect).
    #[allow(clippy::type_complexity)] // (has bias, its values, the folded Add's output)
    fn channel_bias(
        &mut self,
        i: usize,
        n: &NodeProto,
        spatial: usize,
        out_channels: usize,
    ) -> (bool, Option<Vec<f32>>, Option<String>) {
        if Self::has_input(n, 2) {
            return (true, self.const_f32(n, 2), None);
        }
        let folded = self.bias_fold(i, |d| {
            // Broadcasts as [1, C, 1, ...] against [B, C, spatial...].
            let mut full = vec![1i64; (spatial + 2).saturating_sub(d.len())];
            full.extend_from_slice(d);
            full.len() == spatial + 2
                && full[1] == out_channels as i64
                && full.iter().enumerate().all(|(k, &v)| k == 1 || v == 1)
        });
        match folded {
            Some((f, t)) => (true, bias_values(&t, out_channels), Some(f)),
            None => (false, None, None),
        }
    }

    /// Emits a convolution `op` of `x` with its weight, bias and gain values (in
    /// [`Op::params`] order); a folded bias `Add`'s output becomes the convolution's.
    #[allow(clippy::too_many_arguments)] // a convolution's input and its parameters
    fn emit_with_bias(
        &mut self,
        n: &NodeProto,
        op: Op,
        x: &str,
        weight: Option<Vec<f32>>,
        bias: Option<Vec<f32>>,
        folded: Option<String>,
        gain: Option<Vec<f32>>,
    ) -> Result<String, GraphError> {
        let has_bias = matches!(
            op,
            Op::Conv { bias: true, .. } | Op::ConvTranspose { bias: true, .. }
        );
        let name = self.emit(n, op, &[x])?;
        if let Some(f) = folded {
            self.vals.insert(f, Val::Ir(name.clone()));
        }
        let mut weights = vec![weight];
        if has_bias {
            weights.push(bias);
        }
        if gain.is_some() {
            weights.push(gain);
        }
        self.attach(&name, weights);
        Ok(name)
    }

    /// `ConvTranspose` over 1, 2 or 3 spatial dimensions with explicit pads (`auto_pad`
    /// and `output_shape` are refused), folding a following bias `Add`.
    pub(super) fn conv_transpose(
        &mut self,
        i: usize,
        n: &NodeProto,
        a: &Attrs,
    ) -> Result<(), GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        let x = self.act(n, 0)?;
        let w = self.konst(n, 1, "ConvTranspose weight W")?;
        let wd = positive(&w.dims)
            .filter(|d| (3..=5).contains(&d.len()))
            .ok_or_else(|| {
                err(format!(
                    "ConvTranspose weight W has shape {:?}; only 1-d, 2-d and 3-d are supported",
                    w.dims
                ))
            })?;
        let sp = wd.len() - 2;
        // Channels before the spatial axes; any axes before them are more batch.
        let s = self.shape(&x)?;
        let in_channels = s
            .rank()
            .checked_sub(sp + 1)
            .and_then(|c| s.0[c].fixed())
            .ok_or_else(|| err(format!("needs a [B, C, ...] input, got {s}")))?;
        let groups = a.int("group", 1);
        if groups < 1 || wd[0] != in_channels {
            return Err(err(format!(
                "weight W {wd:?} with group {groups} does not fit {in_channels} input channels"
            )));
        }
        if a.ints("output_shape").is_some() {
            return Err(err(
                "ConvTranspose with output_shape: only explicit pads".into()
            ));
        }
        let auto_pad = a.string("auto_pad").unwrap_or_default();
        if !matches!(auto_pad.as_str(), "" | "NOTSET" | "VALID") {
            return Err(err(format!(
                "ConvTranspose with auto_pad {auto_pad}: only explicit pads"
            )));
        }
        let kernel = wd[2..].to_vec();
        if let Some(ks) = a.ints("kernel_shape")
            && positive(&ks).as_deref() != Some(&kernel[..])
        {
            return Err(err(format!(
                "kernel_shape {ks:?} differs from the weight's kernel {kernel:?}"
            )));
        }
        let per_dim = |attr: &str, default: i64| -> Result<Vec<usize>, GraphError> {
            let v = a.ints(attr).unwrap_or_else(|| vec![default; sp]);
            match v
                .iter()
                .map(|&k| usize::try_from(k).ok())
                .collect::<Option<Vec<_>>>()
            {
                Some(u) if u.len() == sp => Ok(u),
                _ => Err(err(format!(
                    "{attr} {v:?} must hold {sp} non-negative numbers"
                ))),
            }
        };
        let (stride, dilation) = (per_dim("strides", 1)?, per_dim("dilations", 1)?);
        if stride.contains(&0) || dilation.contains(&0) {
            return Err(err("strides and dilations must be positive".into()));
        }
        let output_padding = per_dim("output_padding", 0)?;
        let pads = match a.ints("pads") {
            None => vec![0; 2 * sp],
            Some(p) => p
                .iter()
                .map(|&k| usize::try_from(k).ok())
                .collect::<Option<Vec<_>>>()
                .filter(|p| p.len() == 2 * sp)
                .ok_or_else(|| {
                    err(format!(
                        "pads {p:?} must hold {} non-negative numbers",
                        2 * sp
                    ))
                })?,
        };
        let window = Window {
            kernel,
            stride,
            padding: (0..sp).map(|d| [pads[d], pads[d + sp]]).collect(),
            dilation,
        };
        let out_channels = wd[1] * groups as usize;
        let (bias, bias_vals, folded) = self.channel_bias(i, n, sp, out_channels);
        let op = Op::ConvTranspose {
            in_channels,
            out_channels,
            window,
            output_padding,
            groups: groups as usize,
            bias,
        };
        self.emit_with_bias(n, op, &x, tensor_f32(&w), bias_vals, folded, None)
            .map(drop)
    }

    /// `MaxPool` and `AveragePool`.
    pub(super) fn pool(&mut self, _i: usize, n: &NodeProto, a: &Attrs) -> Result<(), GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        let x = self.act(n, 0)?;
        let kernel = a
            .ints("kernel_shape")
            .ok_or_else(|| err(format!("{} needs kernel_shape", n.op_type)))?;
        let kernel = positive(&kernel)
            .ok_or_else(|| err(format!("kernel_shape {kernel:?} must be positive")))?;
        if !(1..=3).contains(&kernel.len()) {
            return Err(err(format!(
                "pooling over {} spatial dimensions is not supported (1, 2 or 3)",
                kernel.len()
            )));
        }
        let window = self.window(n, a, &x, kernel, a.int("ceil_mode", 0) != 0)?;
        let pool = if n.op_type == "MaxPool" {
            PoolKind::Max
        } else {
            PoolKind::Avg
        };
        self.emit(n, Op::Pool { pool, window }, &[&x])?;
        Ok(())
    }

    /// `Resize` (opset 10+: `X, roi, scales, sizes`) and `Upsample` (`X, scales`): the
    /// spatial axes to the `sizes` given (a shape value, PyTorch's `interpolate(size=...)`)
    /// or to `floor(in x scale)`; the batch and the channels keep their sizes.
    pub(super) fn resize(&mut self, _i: usize, n: &NodeProto, a: &Attrs) -> Result<(), GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        let x = self.act(n, 0)?;
        let s = self.shape(&x)?.clone();
        let spatial: Option<Vec<usize>> = s.0.iter().skip(1).map(|d| d.fixed()).collect();
        let Some(spatial) = spatial.filter(|sp| !sp.is_empty()) else {
            return Err(err(format!(
                "{} of {s}: needs [B, C, spatial...] with concrete spatial sizes",
                n.op_type
            )));
        };
        let rank = spatial.len() + 2;
        let (scales_at, sizes_at) = match (n.op_type.as_str(), self.opset) {
            ("Upsample", _) | (_, ..=10) => (1, None),
            _ => (2, Some(3)),
        };
        let given = |pos: usize| Self::has_input(n, pos) && !self.is_empty_const(n, pos);
        let size: Vec<usize> = if let Some(pos) = sizes_at.filter(|&p| given(p)) {
            let (v, _) = self.ints_of(n, pos, "Resize sizes")?;
            if v.len() != rank {
                return Err(err(format!("Resize sizes {v:?} for a rank-{rank} input")));
            }
            let keeps = v[0] == Sym::Batch && v[1] == Sym::N(s.0[0].fixed().unwrap_or(0) as i64);
            let out: Option<Vec<usize>> = v[2..]
                .iter()
                .map(|d| match d {
                    Sym::N(k) if *k > 0 => Some(*k as usize),
                    _ => None,
                })
                .collect();
            match (keeps, out) {
                (true, Some(out)) => out,
                _ => {
                    return Err(err(format!(
                        "Resize sizes {v:?}: only the spatial axes may change, to fixed sizes"
                    )));
                }
            }
        } else if given(scales_at) {
            let t = self.konst(n, scales_at, "Resize scales")?;
            let scales = tensor_floats(&t).map_err(|e| err(format!("Resize scales: {e}")))?;
            if scales.len() != rank || scales[0] != 1.0 || scales[1] != 1.0 {
                return Err(err(format!(
                    "Resize scales {scales:?}: one per axis of a rank-{rank} input, 1 for the \
                     batch and the channels"
                )));
            }
            spatial
                .iter()
                .zip(&scales[2..])
                .map(|(&d, &f)| (d as f64 * f).floor() as usize)
                .collect()
        } else {
            return Err(err(format!("{} needs scales or sizes", n.op_type)));
        };
        let mode = match a.string("mode").as_deref().unwrap_or("nearest") {
            "nearest" => ResizeMode::Nearest,
            "linear" | "bilinear" | "trilinear" => ResizeMode::Linear,
            "cubic" | "bicubic" => ResizeMode::Cubic,
            other => return Err(err(format!("Resize mode `{other}`"))),
        };
        let coords = a.string("coordinate_transformation_mode");
        let align_corners = coords.as_deref() == Some("align_corners");
        let op = Op::Resize {
            size,
            mode,
            align_corners,
        };
        self.emit(n, op, &[&x])?;
        Ok(())
    }

    /// `GlobalAveragePool` and `GlobalMaxPool`.
    pub(super) fn global_pool(
        &mut self,
        _i: usize,
        n: &NodeProto,
        _a: &Attrs,
    ) -> Result<(), GraphError> {
        let x = self.act(n, 0)?;
        let pool = if n.op_type == "GlobalMaxPool" {
            PoolKind::Max
        } else {
            PoolKind::Avg
        };
        self.emit(n, Op::GlobalPool { pool }, &[&x])?;
        Ok(())
    }

    /// The window of a Conv or pool: strides, dilations and pads or `auto_pad`.
    fn window(
        &self,
        n: &NodeProto,
        a: &Attrs,
        x: &str,
        kernel: Vec<usize>,
        ceil_mode: bool,
    ) -> Result<Window, GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        let sp = kernel.len();
        let per_dim = |attr: &str| -> Result<Vec<usize>, GraphError> {
            match a.ints(attr) {
                None => Ok(vec![1; sp]),
                Some(v) => positive(&v)
                    .filter(|v| v.len() == sp)
                    .ok_or_else(|| err(format!("{attr} {v:?} must hold {sp} positive numbers"))),
            }
        };
        let stride = per_dim("strides")?;
        let dilation = per_dim("dilations")?;
        let s = self.shape(x)?;
        let input: Option<Vec<usize>> = s.0.iter().skip(1).map(|d| d.fixed()).collect();
        let input = input
            .filter(|i| i.len() == sp && s.rank() == sp + 1)
            .ok_or_else(|| {
                err(format!(
                    "{} over {sp} spatial dimension(s) needs a [B, C, ...] input of rank {} with \
                 concrete sizes, got {s}",
                    n.op_type,
                    sp + 2
                ))
            })?;
        let auto_pad = a.string("auto_pad").unwrap_or_default();
        let mut padding = match auto_pad.as_str() {
            "" | "NOTSET" => match a.ints("pads") {
                None => vec![[0, 0]; sp],
                Some(p) if p.len() == 2 * sp && p.iter().all(|&v| v >= 0) => (0..sp)
                    .map(|d| [p[d] as usize, p[d + sp] as usize])
                    .collect(),
                Some(p) => {
                    return Err(err(format!(
                        "pads {p:?} must hold {} non-negative numbers",
                        2 * sp
                    )));
                }
            },
            "VALID" => vec![[0, 0]; sp],
            "SAME_UPPER" | "SAME_LOWER" => (0..sp)
                .map(|d| {
                    let out = input[d].div_ceil(stride[d]);
                    let span = dilation[d] * (kernel[d] - 1) + 1;
                    let total = ((out - 1) * stride[d] + span).saturating_sub(input[d]);
                    let (small, big) = (total / 2, total - total / 2);
                    if auto_pad == "SAME_UPPER" {
                        [small, big]
                    } else {
                        [big, small]
                    }
                })
                .collect(),
            other => return Err(err(format!("unknown auto_pad `{other}`"))),
        };
        if ceil_mode {
            // Extra end padding makes the IR's floor division give ONNX's ceil output,
            // dropping a last window that would start in the end padding.
            for d in 0..sp {
                let span = dilation[d] * (kernel[d] - 1) + 1;
                let padded = input[d] + padding[d][0] + padding[d][1];
                if padded < span {
                    continue;
                }
                let mut out = (padded - span).div_ceil(stride[d]) + 1;
                if (out - 1) * stride[d] >= input[d] + padding[d][0] {
                    out -= 1;
                }
                let need = (out - 1) * stride[d] + span;
                padding[d][1] += need.saturating_sub(padded);
            }
        }
        Ok(Window {
            kernel,
            stride,
            padding,
            dilation,
        })
    }
}
