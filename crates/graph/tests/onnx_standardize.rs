//! Weight standardisation written into the graph (timm's `StdConv2d` for BiT and the
//! hybrid ViTs' ResNet stems, `ScaledStdConv2d` for NFNet): `F.batch_norm` of the
//! convolution's own weight in training mode, reshaped back and read by the `Conv`.
//! It imports as one convolution whose raw weight (and gain) are the parameters.

use batchfit_graph::onnx::proto::TensorProto;
use batchfit_graph::{Op, Standardize, onnx};

mod common;
use common::*;

const OUT: i64 = 4;
const IN: i64 = 3;

/// `x [B, 3, 6, 6]` through a 3x3 standardised convolution to `y`. `gain`: NFNet's
/// learned gain times `scale` (`ScaledStdConv2d`), else a `Constant` of ones (BiT).
fn std_conv(gain: Option<f32>, eps: f32) -> Net {
    let mut n = Net::new("std-conv");
    n.input("x", "batch,3,6,6");
    let w: Vec<f32> = (0..OUT * IN * 9).map(|k| (k % 7) as f32 - 3.0).collect();
    n.init(floats("conv.weight", &[OUT, IN, 3, 3], &w))
        .init(int64s("rows", &[1, OUT, -1]))
        .init(int64s("flat", &[-1]))
        .init(zeros("zeros", &[OUT]));
    n.node(
        "Reshape",
        "/conv/Reshape",
        &["conv.weight", "rows"],
        &["wr"],
        vec![],
    );
    match gain {
        Some(scale) => {
            let mut c = scalar("c", scale);
            c.dims.clear();
            n.init(floats("conv.gain", &[OUT, 1, 1, 1], &[1.0, 2.0, 0.5, 1.0]))
                .init(c);
            n.node("Mul", "/conv/Mul", &["conv.gain", "c"], &["gc"], vec![]);
            n.node(
                "Reshape",
                "/conv/Reshape_1",
                &["gc", "flat"],
                &["g"],
                vec![],
            );
        }
        None => {
            let ones = floats("ones", &[OUT], &[1.0; OUT as usize]);
            n.node(
                "Constant",
                "/conv/ones",
                &[],
                &["g"],
                vec![tensor("value", ones)],
            );
        }
    }
    // The running statistics' inputs, computed by the exporter and never read.
    n.node(
        "Transpose",
        "/conv/Transpose",
        &["wr"],
        &["wt"],
        vec![ints("perm", &[0, 2, 1])],
    );
    n.node(
        "ReduceMean",
        "/conv/ReduceMean",
        &["wt"],
        &["m"],
        vec![ints("axes", &[0, 1]), int("keepdims", 0)],
    );
    n.node(
        "BatchNormalization",
        "/conv/BatchNormalization",
        &["wr", "g", "zeros", "m", "m"],
        &["ws", "rm", "rv"],
        vec![int("training_mode", 1), float("epsilon", eps)],
    );
    n.node(
        "Shape",
        "/conv/Shape",
        &["conv.weight"],
        &["wshape"],
        vec![],
    );
    n.node(
        "Reshape",
        "/conv/Reshape_2",
        &["ws", "wshape"],
        &["w2"],
        vec![],
    );
    n.node(
        "Conv",
        "/conv/Conv",
        &["x", "w2"],
        &["y"],
        vec![ints("pads", &[1, 1, 1, 1])],
    );
    n.output("y");
    n
}

fn only_conv(g: &batchfit_graph::Graph) -> &Op {
    let convs: Vec<_> = g.nodes.iter().filter(|n| n.op.name() == "conv2d").collect();
    assert_eq!(convs.len(), 1, "{:?}", g.nodes);
    &convs[0].op
}

#[test]
fn bit_weight_standardisation_is_one_convolution_of_the_raw_weight() {
    let g = onnx::parse(&std_conv(None, 1e-8).bytes()).unwrap();
    let Op::Conv { standardize, .. } = only_conv(&g) else {
        unreachable!()
    };
    let want = Standardize {
        eps: 1e-8,
        gain: false,
        scale: 1.0,
    };
    assert_eq!(standardize.as_ref(), Some(&want));
    assert_eq!(g.param_count(), (OUT * IN * 9) as u64);
    assert_eq!(
        g.shape_of(&g.loss.input).unwrap().to_string(),
        "[B, 4, 6, 6]"
    );
}

#[test]
fn nfnet_gain_times_a_constant_is_a_learned_gain_and_a_scale() {
    let g = onnx::parse(&std_conv(Some(0.25), 1e-5).bytes()).unwrap();
    let node = g.nodes.iter().find(|n| n.op.name() == "conv2d").unwrap();
    let Op::Conv { standardize, .. } = &node.op else {
        unreachable!()
    };
    let want = Standardize {
        eps: 1e-5,
        gain: true,
        scale: 0.25,
    };
    assert_eq!(standardize.as_ref(), Some(&want));
    // The raw weight and the gain, as PyTorch counts them.
    assert_eq!(g.param_count(), (OUT * IN * 9 + OUT) as u64);
    let weights = node.weights.as_ref().expect("the file's values");
    assert_eq!(weights[1], vec![1.0, 2.0, 0.5, 1.0]);
}

#[test]
fn a_standardised_weight_read_otherwise_is_refused_by_node() {
    // Read by something other than the Reshape back.
    let mut n = std_conv(None, 1e-6);
    n.node("Relu", "/odd", &["ws"], &["r"], vec![]);
    n.output("r");
    let e = onnx::parse(&n.bytes()).unwrap_err().to_string();
    assert!(
        e.contains("/conv/BatchNormalization") && e.contains("Reshape"),
        "{e}"
    );
    // Reshaped to another shape than the weight's.
    let mut n = std_conv(None, 1e-6);
    n.init(int64s("other", &[OUT, IN * 9]));
    let reshape =
        n.g.node
            .iter_mut()
            .find(|m| m.name == "/conv/Reshape_2")
            .unwrap();
    reshape.input[1] = "other".into();
    let e = onnx::parse(&n.bytes()).unwrap_err().to_string();
    assert!(
        e.contains("/conv/Reshape_2") && e.contains("back to its shape"),
        "{e}"
    );
}

/// A constant's batch normalisation that is not of a weight stays refused by node.
#[test]
fn batch_normalisation_of_a_plain_constant_is_refused() {
    let mut n = std_conv(None, 1e-6);
    let bn =
        n.g.node
            .iter_mut()
            .find(|m| m.op_type == "BatchNormalization")
            .unwrap();
    bn.input[0] = "zeros3".into();
    let t: TensorProto = zeros("zeros3", &[1, OUT, IN * 9]);
    n.init(t);
    // `zeros3` is an initializer too: a learned tensor, but not a convolution's weight
    // (no `[O, ...]` tensor it is all of in that shape), so it is refused.
    let e = onnx::parse(&n.bytes()).unwrap_err().to_string();
    assert!(e.contains("/conv/BatchNormalization"), "{e}");
}
