//! Normalisation layers.

use crate::error::GraphError;
use crate::onnx::decode::{Attrs, numel};
use crate::onnx::import::{Importer, label};
use crate::onnx::proto::NodeProto;
use crate::onnx::view::Val;
use crate::op::Op;

impl Importer {
    /// `BatchNormalization` over the channel axis; running statistics are not kept.
    pub(super) fn batch_norm(
        &mut self,
        _i: usize,
        n: &NodeProto,
        _a: &Attrs,
    ) -> Result<(), GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        let x = self.act(n, 0)?;
        let features = self.channels(n, &x)?;
        if let Ok(Val::Const(scale)) = self.val(n, 1)
            && numel(&scale.dims) != Some(features)
        {
            return Err(err(format!(
                "scale has shape {:?} but the input has {features} channels",
                scale.dims
            )));
        }
        let name = self.emit(n, Op::BatchNorm { features }, &[&x])?;
        let weights = vec![self.const_f32(n, 1), self.const_f32(n, 2)];
        self.attach(&name, weights);
        Ok(())
    }

    /// `InstanceNormalization` over the spatial axes of each channel: affine where the
    /// scale and shift are initializers (`nn.InstanceNorm2d(affine=True)`), plain where
    /// they are constant ones and zeros (GroupNorm's export, whose own scale and shift
    /// follow as learned tensors).
    pub(super) fn instance_norm(
        &mut self,
        _i: usize,
        n: &NodeProto,
        _a: &Attrs,
    ) -> Result<(), GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        let x = self.act(n, 0)?;
        let channels = self.channels(n, &x)?;
        let learned = |pos: usize| {
            n.input
                .get(pos)
                .is_some_and(|i| self.initializers.contains(i))
        };
        let affine = learned(1) || learned(2);
        let values = (self.const_f32(n, 1), self.const_f32(n, 2));
        if !affine {
            let plain = match &values {
                (Some(s), Some(b)) => {
                    s.len() == channels
                        && b.len() == channels
                        && s.iter().all(|&v| v == 1.0)
                        && b.iter().all(|&v| v == 0.0)
                }
                _ => false,
            };
            if !plain {
                return Err(err(
                    "InstanceNormalization whose scale and shift are constants other than \
                     ones and zeros"
                        .into(),
                ));
            }
        }
        let name = self.emit(n, Op::InstanceNorm { channels, affine }, &[&x])?;
        if affine {
            self.attach(&name, vec![values.0, values.1]);
        }
        Ok(())
    }

    /// `LayerNormalization` over the last axis; a missing bias is zeros.
    pub(super) fn layer_norm(
        &mut self,
        _i: usize,
        n: &NodeProto,
        a: &Attrs,
    ) -> Result<(), GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        let x = self.act(n, 0)?;
        let rank = self.shape(&x)?.rank() as i64 + 1;
        let axis = a.int("axis", -1);
        if axis != -1 && axis != rank - 1 {
            return Err(err(format!(
                "LayerNormalization over axis {axis} of a rank-{rank} tensor: only the \
                 last axis is supported"
            )));
        }
        let features = self.last_dim(n, &x)?;
        let name = self.emit(n, Op::LayerNorm { features }, &[&x])?;
        // Without a bias input, zeros as long as the scale the file holds (not as the
        // shape claims: a malformed file may claim any size).
        let scale = self.const_f32(n, 1);
        let bias = if Self::has_input(n, 2) {
            self.const_f32(n, 2)
        } else {
            scale.as_ref().map(|w| vec![0.0; w.len()])
        };
        let weights = vec![scale, bias];
        self.attach(&name, weights);
        Ok(())
    }

    /// `RMSNormalization` over the last axis with its learned scale (written out op by op
    /// before opset 23, fused by `fuse::fuse_rms_norm`).
    pub(super) fn rms_norm(
        &mut self,
        _i: usize,
        n: &NodeProto,
        a: &Attrs,
    ) -> Result<(), GraphError> {
        let x = self.act(n, 0)?;
        let rank = self.shape(&x)?.rank() as i64 + 1;
        let axis = a.int("axis", -1);
        if axis != -1 && axis != rank - 1 {
            return Err(GraphError::node(
                label(n),
                format!(
                    "RMSNormalization over axis {axis} of a rank-{rank} tensor: only the \
                     last axis is supported"
                ),
            ));
        }
        let features = self.last_dim(n, &x)?;
        let name = self.emit(n, Op::RmsNorm { features }, &[&x])?;
        let weights = vec![self.const_f32(n, 1)];
        self.attach(&name, weights);
        Ok(())
    }

    /// `LRN` across channels.
    pub(super) fn lrn(&mut self, _i: usize, n: &NodeProto, a: &Attrs) -> Result<(), GraphError> {
        let x = self.act(n, 0)?;
        let size = a
            .get("size")
            .map(|v| v.i)
            .filter(|&s| s > 0)
            .ok_or_else(|| GraphError::node(label(n), "LRN needs a positive size"))?;
        let op = Op::Lrn {
            size: size as usize,
            alpha: a.float("alpha", 1e-4),
            beta: a.float("beta", 0.75),
            bias: a.float("bias", 1.0),
        };
        self.emit(n, op, &[&x])?;
        Ok(())
    }
}
