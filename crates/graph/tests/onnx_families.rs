//! ONNX import of the model families people export with `torch.onnx.export`
//! (training mode, no constant folding), each as a small instance written with
//! the proto messages: MobileNetV3's hard swish and squeeze-excite, EfficientNet's
//! stochastic depth, classic GoogLeNet's LRN and ResNet's variadic `Sum`, RNN
//! heads indexed, sliced and pooled, and weights rearranged in the graph.

use batchfit_graph::{LossKind, Op, ReduceKind, onnx};

mod common;
use common::*;

/// A conv, its BatchNorm and the initializers both need.
fn conv_bn(n: &mut Net, name: &str, x: &str, cin: i64, cout: i64, k: i64, out: &str) {
    n.weight(&format!("{name}.W"), &[cout, cin, k, k]);
    let pad = (k - 1) / 2;
    n.node(
        "Conv",
        &format!("{name}/Conv"),
        &[x, &format!("{name}.W")],
        &[&format!("{name}.c")],
        vec![
            ints("kernel_shape", &[k, k]),
            ints("pads", &[pad, pad, pad, pad]),
        ],
    );
    for p in ["scale", "B", "mean", "var"] {
        n.weight(&format!("{name}.bn.{p}"), &[cout]);
    }
    let c = format!("{name}.c");
    let inputs: Vec<String> = [c.clone()]
        .into_iter()
        .chain(["scale", "B", "mean", "var"].map(|p| format!("{name}.bn.{p}")))
        .collect();
    let refs: Vec<&str> = inputs.iter().map(String::as_str).collect();
    n.node(
        "BatchNormalization",
        &format!("{name}/BatchNormalization"),
        &refs,
        &[out],
        vec![],
    );
}

#[test]
fn mobilenet_v3_block_with_hard_swish_and_squeeze_excite() {
    let mut n = Net::new("mbv3-block");
    n.input("x", "batch,8,8,8");
    conv_bn(&mut n, "expand", "x", 8, 16, 1, "e");
    n.node("HardSwish", "/hs", &["e"], &["h"], vec![]);
    // Squeeze-excite: pool, two 1x1 convs, a hard sigmoid gate multiplied back.
    n.node("GlobalAveragePool", "/se/pool", &["h"], &["s"], vec![]);
    n.weight("se1.W", &[4, 16, 1, 1]).weight("se1.B", &[4]);
    n.node("Conv", "/se/fc1", &["s", "se1.W", "se1.B"], &["s1"], vec![]);
    n.node("Relu", "/se/relu", &["s1"], &["s2"], vec![]);
    n.weight("se2.W", &[16, 4, 1, 1]).weight("se2.B", &[16]);
    n.node(
        "Conv",
        "/se/fc2",
        &["s2", "se2.W", "se2.B"],
        &["s3"],
        vec![],
    );
    n.node(
        "HardSigmoid",
        "/se/gate",
        &["s3"],
        &["g"],
        vec![float("alpha", 1.0 / 6.0)],
    );
    n.node("Mul", "/se/Mul", &["h", "g"], &["y"], vec![]);
    n.node("GlobalAveragePool", "/pool", &["y"], &["p"], vec![]);
    n.node("Flatten", "/flat", &["p"], &["f"], vec![]);
    n.weight("fc.W", &[10, 16]).weight("fc.B", &[10]);
    n.node(
        "Gemm",
        "/fc",
        &["f", "fc.W", "fc.B"],
        &["logits"],
        vec![int("transB", 1)],
    );
    n.output("logits");

    let g = onnx::parse(&n.bytes()).unwrap();
    let op = |name: &str| &g.nodes.iter().find(|x| x.name == name).unwrap().op;
    assert_eq!(op("/hs"), &Op::HardSwish);
    assert_eq!(
        op("/se/gate"),
        &Op::HardSigmoid {
            alpha: 1.0 / 6.0,
            beta: 0.5
        }
    );
    assert_eq!(g.shape_of("/se/Mul").unwrap().to_string(), "[B, 16, 8, 8]");
    // expand conv 16*8 + BN 2*16, SE 4*16+4 + 16*4+16, fc 16*10+10.
    assert_eq!(g.param_count(), 128 + 32 + 68 + 80 + 170);
}

/// torchvision's `StochasticDepth("row")` in training mode, as torch.onnx.export writes it.
#[test]
fn efficientnet_stochastic_depth_is_one_op() {
    let mut n = Net::new("stochastic-depth");
    n.input("x", "batch,4,6,6");
    conv_bn(&mut n, "block", "x", 4, 4, 3, "b");
    n.node("Shape", "/sd/Shape", &["b"], &["shape"], vec![]);
    n.init(int64s("zero", &[0]));
    n.node(
        "Gather",
        "/sd/Gather",
        &["shape", "zero"],
        &["batch"],
        vec![],
    );
    n.init(int64s("ones", &[1, 1, 1]));
    n.node(
        "Concat",
        "/sd/Concat",
        &["batch", "ones"],
        &["size"],
        vec![int("axis", 0)],
    );
    n.node(
        "ConstantOfShape",
        "/sd/ConstantOfShape",
        &["size"],
        &["filled"],
        vec![],
    );
    n.node(
        "RandomUniformLike",
        "/sd/RandomUniformLike",
        &["filled"],
        &["noise"],
        vec![int("dtype", 1)],
    );
    n.init(scalar("survival", 0.8));
    n.node(
        "Less",
        "/sd/Less",
        &["noise", "survival"],
        &["keep"],
        vec![],
    );
    n.node(
        "Cast",
        "/sd/Cast",
        &["keep"],
        &["keepf"],
        vec![int("to", 1)],
    );
    n.node("Div", "/sd/Div", &["keepf", "survival"], &["mask"], vec![]);
    n.node("Mul", "/sd/Mul", &["b", "mask"], &["dropped"], vec![]);
    n.node("Add", "/residual", &["dropped", "x"], &["y"], vec![]);
    n.node("GlobalAveragePool", "/pool", &["y"], &["p"], vec![]);
    n.node("Flatten", "/flat", &["p"], &["logits"], vec![]);
    n.output("logits");

    let g = onnx::parse(&n.bytes()).unwrap();
    let names: Vec<(&str, &str)> = g
        .nodes
        .iter()
        .map(|x| (x.name.as_str(), x.op.name()))
        .collect();
    assert_eq!(
        names,
        [
            ("block/Conv", "conv2d"),
            ("block/BatchNormalization", "batchnorm"),
            ("/sd/Mul", "drop_path"),
            ("/residual", "add"),
            ("/pool", "global_avgpool"),
            ("/flat", "flatten"),
        ]
    );
    let Op::DropPath { p } = g.nodes[2].op else {
        unreachable!()
    };
    assert!((p - 0.2).abs() < 1e-6, "{p}");

    // A mask not scaled by 1 / keep is named, not trained as something else.
    let mut bad = n.clone();
    let div = bad.g.node.iter_mut().find(|x| x.name == "/sd/Div").unwrap();
    div.op_type = "Mul".into();
    let err = onnx::parse(&bad.bytes()).unwrap_err().to_string();
    assert!(err.contains("/sd/Mul") && err.contains("1 / keep"), "{err}");
}

/// Classic ONNX-zoo exports: GoogLeNet v1's LRN, ResNet's variadic `Sum`, a `Mean`.
#[test]
fn classic_lrn_and_variadic_sum_and_mean() {
    let mut n = Net::new("classic");
    n.input("x", "N,3,8,8");
    n.weight("c.W", &[6, 3, 3, 3]).weight("c.B", &[6]);
    n.node(
        "Conv",
        "conv",
        &["x", "c.W", "c.B"],
        &["c"],
        vec![ints("pads", &[1, 1, 1, 1])],
    );
    n.node(
        "LRN",
        "norm",
        &["c"],
        &["l"],
        vec![int("size", 5), float("alpha", 1e-4), float("beta", 0.75)],
    );
    n.node("Relu", "r1", &["l"], &["a"], vec![]);
    n.node("Sigmoid", "s1", &["l"], &["b"], vec![]);
    n.node("Sum", "sum3", &["a", "b", "l"], &["s"], vec![]);
    n.node("Mean", "mean2", &["s", "a"], &["m"], vec![]);
    n.node("GlobalAveragePool", "pool", &["m"], &["p"], vec![]);
    n.node("Flatten", "flat", &["p"], &["logits"], vec![]);
    n.output("logits");

    let g = onnx::parse(&n.bytes()).unwrap();
    let ops: Vec<&Op> = g.nodes.iter().map(|x| &x.op).collect();
    assert_eq!(
        ops[1],
        &Op::Lrn {
            size: 5,
            alpha: 1e-4,
            beta: 0.75,
            bias: 1.0
        }
    );
    // Sum of three: two adds; Mean of two: an add and a scale by 1/2.
    let kinds: Vec<&str> = g.nodes.iter().map(|x| x.op.name()).collect();
    assert_eq!(
        kinds,
        [
            "conv2d",
            "lrn",
            "relu",
            "sigmoid",
            "add",
            "add",
            "add",
            "scale",
            "global_avgpool",
            "flatten"
        ]
    );
    assert_eq!(ops[7], &Op::Scale { factor: 0.5 });
    assert_eq!(g.nodes.last().unwrap().shape.to_string(), "[B, 6]");
}

/// A GRU exported without constant folding (its weights are slices of PyTorch's gate
/// blocks, concatenated in ONNX's order) with a classifier on the last step `y[:, -1]`.
#[test]
fn gru_last_step_with_weights_rearranged_in_the_graph() {
    let (f, h) = (3i64, 2i64);
    let mut n = Net::new("gru-last");
    n.input("x", "batch,5,3");
    // PyTorch's W_ih [3H, F] in r, z, n order, values 0..18; ONNX wants z, r, n.
    let w_ih: Vec<f32> = (0..3 * h * f).map(|v| v as f32).collect();
    n.init(floats("rnn.weight_ih_l0", &[3 * h, f], &w_ih));
    n.init(floats(
        "rnn.weight_hh_l0",
        &[3 * h, h],
        &vec![0.5; (3 * h * h) as usize],
    ));
    let block = |n: &mut Net, w: &str, k: i64, out: &str| {
        let (s, e) = (format!("{out}.s"), format!("{out}.e"));
        n.init(int64s(&s, &[k * h]))
            .init(int64s(&e, &[(k + 1) * h]));
        n.init(int64s(&format!("{out}.a"), &[0]));
        n.node(
            "Slice",
            out,
            &[w, &s, &e, &format!("{out}.a")],
            &[out],
            vec![],
        );
    };
    for w in ["rnn.weight_ih_l0", "rnn.weight_hh_l0"] {
        block(&mut n, w, 1, &format!("{w}.z"));
        block(&mut n, w, 0, &format!("{w}.r"));
        block(&mut n, w, 2, &format!("{w}.n"));
        n.node(
            "Concat",
            &format!("{w}.cat"),
            &[&format!("{w}.z"), &format!("{w}.r"), &format!("{w}.n")],
            &[&format!("{w}.zrn")],
            vec![int("axis", 0)],
        );
        n.init(int64s(&format!("{w}.ax"), &[0]));
        n.node(
            "Unsqueeze",
            &format!("{w}.unsq"),
            &[&format!("{w}.zrn"), &format!("{w}.ax")],
            &[&format!("{w}.onnx")],
            vec![],
        );
    }
    n.node(
        "Transpose",
        "/rnn/Transpose",
        &["x"],
        &["xt"],
        vec![ints("perm", &[1, 0, 2])],
    );
    n.node(
        "GRU",
        "/rnn/GRU",
        &["xt", "rnn.weight_ih_l0.onnx", "rnn.weight_hh_l0.onnx"],
        &["y", "h_n"],
        vec![int("hidden_size", h), int("linear_before_reset", 1)],
    );
    n.init(int64s("dir_axis", &[1]));
    n.node(
        "Squeeze",
        "/rnn/Squeeze",
        &["y", "dir_axis"],
        &["ys"],
        vec![],
    );
    n.node(
        "Transpose",
        "/rnn/Transpose_1",
        &["ys"],
        &["yb"],
        vec![ints("perm", &[1, 0, 2])],
    );
    n.init(int64s("last", &[]).clone());
    let last = n.g.initializer.last_mut().unwrap();
    last.dims.clear();
    last.int64_data = vec![-1];
    n.node(
        "Gather",
        "/Gather",
        &["yb", "last"],
        &["y_last"],
        vec![int("axis", 1)],
    );
    // The mean over time of a slice of the steps, too.
    n.init(int64s("s0", &[1]))
        .init(int64s("s1", &[4]))
        .init(int64s("s_ax", &[1]));
    n.node(
        "Slice",
        "/Slice",
        &["yb", "s0", "s1", "s_ax"],
        &["y_mid"],
        vec![],
    );
    n.init(int64s("t_ax", &[1]));
    n.node(
        "ReduceMean",
        "/ReduceMean",
        &["y_mid", "t_ax"],
        &["y_mean"],
        vec![int("keepdims", 0)],
    );
    n.node("Add", "/Add", &["y_last", "y_mean"], &["feat"], vec![]);
    n.init(scalar("two", 2.0));
    n.node("Div", "/Div", &["feat", "two"], &["half"], vec![]);
    n.weight("fc.W", &[4, h]).weight("fc.B", &[4]);
    n.node(
        "Gemm",
        "/fc",
        &["half", "fc.W", "fc.B"],
        &["logits"],
        vec![int("transB", 1)],
    );
    n.output("logits");

    let g = onnx::parse(&n.bytes()).unwrap();
    let node = |name: &str| g.nodes.iter().find(|x| x.name == name).unwrap();
    // y[:, -1]: a slice of the last step, then the step axis dropped.
    assert_eq!(
        node("/Gather").op,
        Op::Slice {
            axis: 1,
            start: 4,
            end: 5
        }
    );
    assert_eq!(node("/Gather").inputs, ["/rnn/GRU"]);
    assert_eq!(node("/Gather_2").op, Op::Reshape { shape: vec![2] });
    assert_eq!(
        node("/Slice").op,
        Op::Slice {
            axis: 1,
            start: 1,
            end: 4
        }
    );
    assert_eq!(
        node("/ReduceMean").op,
        Op::Reduce {
            reduce: ReduceKind::Mean,
            axes: vec![1],
            keep_dims: false
        }
    );
    assert_eq!(node("/ReduceMean").shape.to_string(), "[B, 2]");
    assert_eq!(node("/Div").op, Op::Scale { factor: 0.5 });
    assert_eq!(g.loss.kind, LossKind::CrossEntropy);
    // Folded back into the IR's PyTorch gate order: W_ih is 0..18 again.
    let w = node("/rnn/GRU").weights.as_ref().expect("weights attached");
    assert_eq!(w[0], w_ih);
}

/// An indexing still missing (a reversing slice) is named with its node.
#[test]
fn an_unsupported_indexing_names_its_node() {
    let mut n = Net::new("reversed");
    n.input("x", "batch,6,4");
    n.init(int64s("s0", &[-1]))
        .init(int64s("s1", &[i64::MIN]))
        .init(int64s("ax", &[1]));
    n.init(int64s("st", &[-1]));
    n.node(
        "Slice",
        "/reversed",
        &["x", "s0", "s1", "ax", "st"],
        &["y"],
        vec![],
    );
    n.node("Flatten", "/flat", &["y"], &["logits"], vec![]);
    n.output("logits");
    let err = onnx::parse(&n.bytes()).unwrap_err().to_string();
    assert!(
        err.contains("/reversed") && err.contains("positive steps"),
        "{err}"
    );
}
