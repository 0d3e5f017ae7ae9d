//! ONNX import, end to end: each test writes an ONNX model with the proto
//! messages, parses it, and checks the IR's ops, shapes and parameter counts.

use batchfit_graph::onnx::proto::tensor_shape_proto::{Dimension, dimension};
use batchfit_graph::onnx::proto::{
    AttributeProto, AttributeType, DataType, GraphProto, ModelProto, NodeProto, OperatorSetIdProto,
    TensorProto, TensorShapeProto, TypeProto, ValueInfoProto, type_proto,
};
use batchfit_graph::{Cell, Dim, GraphError, LossKind, Op, PoolKind, RnnBias, Shape, onnx, zoo};
use prost::Message;
use std::path::PathBuf;

// ----- model writing helpers ------------------------------------------------

/// A graph under construction.
#[derive(Default)]
struct Net {
    g: GraphProto,
}

impl Net {
    fn new(name: &str) -> Net {
        let mut net = Net::default();
        net.g.name = name.into();
        net
    }

    /// A graph input; `dims` like "batch,26,9,9" (numbers are sizes, words are symbolic).
    fn input(&mut self, name: &str, dims: &str) -> &mut Self {
        self.input_of(name, dims, DataType::Float)
    }

    fn input_of(&mut self, name: &str, dims: &str, elem: DataType) -> &mut Self {
        self.g.input.push(value_info(name, dims, elem));
        self
    }

    fn output(&mut self, name: &str) -> &mut Self {
        self.g.output.push(ValueInfoProto {
            name: name.into(),
            ..Default::default()
        });
        self
    }

    /// A float initializer of zeros.
    fn weight(&mut self, name: &str, dims: &[i64]) -> &mut Self {
        self.g.initializer.push(zeros(name, dims));
        self
    }

    fn init(&mut self, t: TensorProto) -> &mut Self {
        self.g.initializer.push(t);
        self
    }

    fn node(
        &mut self,
        op: &str,
        name: &str,
        inputs: &[&str],
        outputs: &[&str],
        attrs: Vec<AttributeProto>,
    ) -> &mut Self {
        self.g.node.push(NodeProto {
            op_type: op.into(),
            name: name.into(),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outputs.iter().map(|s| s.to_string()).collect(),
            attribute: attrs,
            ..Default::default()
        });
        self
    }

    fn bytes(&self) -> Vec<u8> {
        model_bytes(self.g.clone(), 17)
    }
}

fn model_bytes(graph: GraphProto, opset: i64) -> Vec<u8> {
    ModelProto {
        ir_version: 8,
        producer_name: "batchfit-tests".into(),
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: opset,
        }],
        graph: Some(graph),
        ..Default::default()
    }
    .encode_to_vec()
}

fn value_info(name: &str, dims: &str, elem: DataType) -> ValueInfoProto {
    let dim = dims
        .split(',')
        .map(|d| Dimension {
            value: Some(match d.trim().parse::<i64>() {
                Ok(v) => dimension::Value::DimValue(v),
                Err(_) => dimension::Value::DimParam(d.trim().into()),
            }),
            ..Default::default()
        })
        .collect();
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: elem as i32,
                shape: Some(TensorShapeProto { dim }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn zeros(name: &str, dims: &[i64]) -> TensorProto {
    let n: i64 = dims.iter().product();
    TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: DataType::Float as i32,
        raw_data: vec![0; 4 * n as usize],
        ..Default::default()
    }
}

fn int64s(name: &str, values: &[i64]) -> TensorProto {
    TensorProto {
        name: name.into(),
        dims: vec![values.len() as i64],
        data_type: DataType::Int64 as i32,
        int64_data: values.to_vec(),
        ..Default::default()
    }
}

fn scalar(name: &str, v: f32) -> TensorProto {
    TensorProto {
        name: name.into(),
        data_type: DataType::Float as i32,
        float_data: vec![v],
        ..Default::default()
    }
}

fn attr(name: &str, kind: AttributeType) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: kind as i32,
        ..Default::default()
    }
}

fn int(name: &str, v: i64) -> AttributeProto {
    AttributeProto {
        i: v,
        ..attr(name, AttributeType::Int)
    }
}

fn ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto {
        ints: v.to_vec(),
        ..attr(name, AttributeType::Ints)
    }
}

fn string(name: &str, v: &str) -> AttributeProto {
    AttributeProto {
        s: v.as_bytes().to_vec(),
        ..attr(name, AttributeType::String)
    }
}

fn tensor(name: &str, t: TensorProto) -> AttributeProto {
    AttributeProto {
        t: Some(t),
        ..attr(name, AttributeType::Tensor)
    }
}

/// A fresh temporary directory for this test.
fn temp_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("batchfit-onnx-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

// ----- models ---------------------------------------------------------------

/// Seed 2's network as MATLAB's exportONNXNetwork would write it, with node
/// names equal to the zoo's and tensor names different from them.
fn seed2() -> Net {
    let mut n = Net::new("seed2-dual");
    n.input("image", "batch,26,9,9")
        .input("features", "batch,8");
    n.weight("conv.W", &[26, 26, 3, 3]).weight("conv.B", &[26]);
    n.node(
        "Conv",
        "conv",
        &["image", "conv.W", "conv.B"],
        &["t_conv"],
        vec![
            ints("kernel_shape", &[3, 3]),
            ints("pads", &[1, 1, 1, 1]),
            ints("strides", &[1, 1]),
        ],
    );
    n.node("Relu", "relu", &["t_conv"], &["t_relu"], vec![]);
    n.node(
        "AveragePool",
        "avgpool2d",
        &["t_relu"],
        &["t_pool"],
        vec![ints("kernel_shape", &[3, 3]), ints("strides", &[3, 3])],
    );
    n.node(
        "Flatten",
        "flatten",
        &["t_pool"],
        &["t_flat"],
        vec![int("axis", 1)],
    );
    let fc = |n: &mut Net, name: &str, x: &str, out: &str, k: i64, m: i64| {
        let (w, b) = (format!("{name}.W"), format!("{name}.B"));
        n.weight(&w, &[m, k]).weight(&b, &[m]);
        n.node("Gemm", name, &[x, &w, &b], &[out], vec![int("transB", 1)]);
    };
    fc(&mut n, "fc", "t_flat", "t_fc", 234, 26);
    n.node("Relu", "relu_3", &["t_fc"], &["t_relu3"], vec![]);
    n.node(
        "Concat",
        "concat",
        &["t_relu3", "features"],
        &["t_cat"],
        vec![int("axis", 1)],
    );
    fc(&mut n, "fc_1", "t_cat", "t_fc1", 34, 256);
    n.node("Relu", "relu_1", &["t_fc1"], &["t_relu1"], vec![]);
    fc(&mut n, "fc_2", "t_relu1", "t_fc2", 256, 256);
    n.node("Relu", "relu_2", &["t_fc2"], &["t_relu2"], vec![]);
    fc(&mut n, "fc_3", "t_relu2", "prediction", 256, 1);
    n.output("prediction");
    n
}

// ----- tests ----------------------------------------------------------------

#[test]
fn seed2_from_onnx_equals_the_zoo_model() {
    let g = onnx::parse(&seed2().bytes()).unwrap();
    let z = zoo::build("seed2-dual").unwrap();
    assert_eq!(g.param_count(), 87_229);
    assert_eq!(g.param_count(), z.param_count());
    assert_eq!(g.inputs, z.inputs);
    let shapes = |g: &batchfit_graph::Graph| -> Vec<(String, String)> {
        g.nodes
            .iter()
            .map(|n| (n.name.clone(), n.shape.to_string()))
            .collect()
    };
    assert_eq!(shapes(&g), shapes(&z));
    assert!(
        g.nodes
            .iter()
            .all(|n| n.weights.is_some() == (n.op.param_count() > 0)),
        "the initializers' values are attached to every layer"
    );
    let mut nodes = g.nodes.clone();
    nodes.iter_mut().for_each(|n| n.weights = None);
    assert_eq!(nodes, z.nodes, "same ops, attributes and inputs");
    assert_eq!(g.loss, z.loss);
    assert_eq!(g.name, "seed2-dual");
}

#[test]
fn cnn_with_batchnorm_plans_with_hand_computed_shapes() {
    let mut n = Net::new("small-cnn");
    n.input("x", "N,3,32,32");
    n.weight("c1.W", &[16, 3, 3, 3]);
    n.node(
        "Conv",
        "conv1",
        &["x", "c1.W"],
        &["a1"],
        vec![
            string("auto_pad", "SAME_UPPER"),
            ints("kernel_shape", &[3, 3]),
        ],
    );
    for (bn, c) in [("bn1", 16), ("bn2", 32)] {
        for p in ["scale", "B", "mean", "var"] {
            n.weight(&format!("{bn}.{p}"), &[c]);
        }
    }
    let bn_inputs = |x: &'static str, bn: &str| -> Vec<String> {
        let mut v = vec![x.to_string()];
        v.extend(["scale", "B", "mean", "var"].map(|p| format!("{bn}.{p}")));
        v
    };
    let i1 = bn_inputs("a1", "bn1");
    let i1: Vec<&str> = i1.iter().map(String::as_str).collect();
    n.node("BatchNormalization", "bn1", &i1, &["b1"], vec![]);
    n.node("Relu", "relu1", &["b1"], &["r1"], vec![]);
    n.node(
        "MaxPool",
        "pool1",
        &["r1"],
        &["p1"],
        vec![ints("kernel_shape", &[2, 2]), ints("strides", &[2, 2])],
    );
    n.weight("c2.W", &[32, 16, 3, 3]).weight("c2.B", &[32]);
    n.node(
        "Conv",
        "conv2",
        &["p1", "c2.W", "c2.B"],
        &["a2"],
        vec![ints("strides", &[2, 2]), ints("pads", &[1, 1, 1, 1])],
    );
    let i2 = bn_inputs("a2", "bn2");
    let i2: Vec<&str> = i2.iter().map(String::as_str).collect();
    n.node("BatchNormalization", "bn2", &i2, &["b2"], vec![]);
    n.node("Relu", "relu2", &["b2"], &["r2"], vec![]);
    n.node("GlobalAveragePool", "gap", &["r2"], &["g"], vec![]);
    n.node("Flatten", "flatten", &["g"], &["f"], vec![]);
    n.weight("fc.W", &[10, 32]).weight("fc.B", &[10]);
    n.node(
        "Gemm",
        "fc",
        &["f", "fc.W", "fc.B"],
        &["logits"],
        vec![int("transB", 1)],
    );
    n.node(
        "Softmax",
        "prob",
        &["logits"],
        &["probs"],
        vec![int("axis", -1)],
    );
    n.output("probs");

    let g = onnx::parse(&n.bytes()).unwrap();
    let shapes: Vec<(&str, String)> = g
        .nodes
        .iter()
        .map(|n| (n.name.as_str(), n.shape.to_string()))
        .collect();
    let expect = [
        ("conv1", "[B, 16, 32, 32]"),
        ("bn1", "[B, 16, 32, 32]"),
        ("relu1", "[B, 16, 32, 32]"),
        ("pool1", "[B, 16, 16, 16]"),
        ("conv2", "[B, 32, 8, 8]"),
        ("bn2", "[B, 32, 8, 8]"),
        ("relu2", "[B, 32, 8, 8]"),
        ("gap", "[B, 32, 1, 1]"),
        ("flatten", "[B, 32]"),
        ("fc", "[B, 10]"),
    ];
    let expect: Vec<(&str, String)> = expect.iter().map(|(a, b)| (*a, b.to_string())).collect();
    assert_eq!(
        shapes, expect,
        "the final softmax is removed for cross-entropy"
    );
    // conv1 3*16*9 (no bias); bn1 2*16; conv2 16*32*9 + 32; bn2 2*32; fc 32*10 + 10
    assert_eq!(g.param_count(), 432 + 32 + 4_640 + 64 + 330);
    assert_eq!(g.loss.kind, LossKind::CrossEntropy);
    assert_eq!(g.loss.input, "fc");
    match &g.nodes[0].op {
        Op::Conv { window, bias, .. } => {
            assert_eq!(window.padding, vec![[1, 1], [1, 1]]);
            assert!(!bias);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(g.nodes[1].op.buffer_elements(), 32);

    // With an MSE loss the softmax stays.
    let g = onnx::parse_with_loss(&n.bytes(), Some(LossKind::Mse)).unwrap();
    assert_eq!(g.output().name, "prob");
    assert_eq!(g.output().op, Op::Softmax { axis: -1 });
}

/// PyTorch style: Conv without bias plus a separate Add, ceil-mode pooling,
/// `view(-1, n)` as Reshape, and a linear layer as MatMul + Add.
#[test]
fn biases_fold_into_conv_and_matmul() {
    let mut n = Net::new("torch-cnn");
    n.input("x", "batch_size,1,28,28");
    n.weight("c.W", &[4, 1, 3, 3])
        .weight("c.bias", &[1, 4, 1, 1]);
    n.node("Conv", "/c/Conv", &["x", "c.W"], &["/c/Conv_out"], vec![]);
    n.node(
        "Add",
        "/c/Add",
        &["/c/Conv_out", "c.bias"],
        &["/c/Add_out"],
        vec![],
    );
    n.node("Relu", "/relu", &["/c/Add_out"], &["r"], vec![]);
    n.node(
        "MaxPool",
        "/pool",
        &["r"],
        &["p"],
        vec![
            ints("kernel_shape", &[3, 3]),
            ints("strides", &[2, 2]),
            int("ceil_mode", 1),
        ],
    );
    n.init(int64s("flat_shape", &[-1, 4 * 13 * 13]));
    n.node("Reshape", "/view", &["p", "flat_shape"], &["v"], vec![]);
    n.weight("fc.W", &[676, 10]).weight("fc.bias", &[10]);
    n.node("MatMul", "/fc/MatMul", &["v", "fc.W"], &["mm"], vec![]);
    n.node("Add", "/fc/Add", &["fc.bias", "mm"], &["logits"], vec![]);
    n.output("logits");

    let g = onnx::parse(&n.bytes()).unwrap();
    let names: Vec<&str> = g.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["/c/Conv", "/relu", "/pool", "/view", "/fc/MatMul"]);
    assert!(matches!(g.nodes[0].op, Op::Conv { bias: true, .. }));
    // 28 - 3 + 1 = 26; (26 - 3) / 2 + 1 = 12.5 rounds up to 13 in ceil mode
    assert_eq!(g.shape_of("/pool").unwrap().to_string(), "[B, 4, 13, 13]");
    assert_eq!(g.nodes[3].op, Op::Reshape { shape: vec![676] });
    assert_eq!(
        g.nodes[4].op,
        Op::Linear {
            in_features: 676,
            out_features: 10,
            bias: true
        }
    );
    assert_eq!(g.param_count(), 36 + 4 + 6_760 + 10);
    assert_eq!(g.loss.kind, LossKind::CrossEntropy);
}

/// `x.view(x.size(0), -1)` exported with a dynamic batch: the target shape is
/// computed from `Shape`, and its batch entry means "keep the batch".
#[test]
fn reshape_to_a_shape_computed_from_the_batch() {
    let mut n = Net::new("dynamic-view");
    n.input("x", "batch,8,3,3");
    n.node("Shape", "/Shape", &["x"], &["shape"], vec![]);
    n.init(TensorProto {
        dims: vec![],
        ..int64s("zero", &[0])
    });
    n.node(
        "Gather",
        "/Gather",
        &["shape", "zero"],
        &["b"],
        vec![int("axis", 0)],
    );
    n.init(int64s("axes", &[0]));
    n.node("Unsqueeze", "/Unsqueeze", &["b", "axes"], &["b1"], vec![]);
    n.init(int64s("minus_one", &[-1]));
    n.node(
        "Concat",
        "/Concat",
        &["b1", "minus_one"],
        &["target"],
        vec![int("axis", 0)],
    );
    n.node("Reshape", "/Reshape", &["x", "target"], &["flat"], vec![]);
    n.weight("fc.W", &[4, 72]).weight("fc.B", &[4]);
    n.node(
        "Gemm",
        "/fc/Gemm",
        &["flat", "fc.W", "fc.B"],
        &["y"],
        vec![int("transB", 1)],
    );
    n.output("y");

    let g = onnx::parse(&n.bytes()).unwrap();
    let names: Vec<&str> = g.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(
        names,
        ["/Reshape", "/fc/Gemm"],
        "shape arithmetic leaves no IR nodes"
    );
    assert_eq!(g.nodes[0].op, Op::Reshape { shape: vec![-1] });
    assert_eq!(g.nodes[0].shape, Shape::fixed(&[72]));
    assert_eq!(g.param_count(), 72 * 4 + 4);
}

#[test]
fn bidirectional_lstm_with_batch_first_layout() {
    let (i, h) = (20, 16);
    let mut n = Net::new("bilstm");
    n.input("x", "batch,seq,20");
    n.weight("W", &[2, 4 * h, i])
        .weight("R", &[2, 4 * h, h])
        .weight("B", &[2, 8 * h]);
    n.node(
        "LSTM",
        "lstm",
        &["x", "W", "R", "B", "", ""],
        &["y", "y_h", "y_c"],
        vec![
            int("hidden_size", h),
            string("direction", "bidirectional"),
            int("layout", 1),
        ],
    );
    n.init(int64s("merge_shape", &[0, 0, -1]));
    n.node("Reshape", "merge", &["y", "merge_shape"], &["y2"], vec![]);
    n.weight("fc.W", &[2 * h, 29]).weight("fc.B", &[29]);
    n.node("MatMul", "fc", &["y2", "fc.W"], &["mm"], vec![]);
    n.node("Add", "fc_bias", &["mm", "fc.B"], &["logits"], vec![]);
    n.output("logits").output("y_h");

    let g = onnx::parse(&n.bytes()).unwrap();
    assert_eq!(g.inputs[0].shape, Shape(vec![Dim::Seq, Dim::Fixed(20)]));
    assert_eq!(g.default_seq_len, Some(batchfit_graph::DEFAULT_SEQ_LEN));
    let names: Vec<&str> = g.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["lstm", "fc"], "the layout reshape is an alias");
    assert_eq!(
        g.nodes[0].op,
        Op::Rnn {
            cell: Cell::Lstm,
            input_size: 20,
            hidden: 16,
            bidirectional: true,
            bias: RnnBias::Double,
        }
    );
    assert_eq!(g.nodes[0].shape, Shape(vec![Dim::Seq, Dim::Fixed(32)]));
    assert_eq!(g.nodes[1].inputs, ["lstm"]);
    // LSTM 2 * (4*16*20 + 4*16*16 + 2*4*16); fc 32*29 + 29
    assert_eq!(g.param_count(), 2 * (1_280 + 1_024 + 128) + 957);
    assert_eq!(g.loss.kind, LossKind::CrossEntropyPerFrame);
    assert_eq!(g.loss.input, "fc");

    // Feeding Y [B, T, dirs, H] straight into another op is an error naming the node.
    let mut bad = Net::new("bad");
    bad.g = n.g.clone();
    bad.g.node.truncate(1);
    bad.node("Relu", "act", &["y"], &["out"], vec![]);
    bad.g.output = vec![];
    bad.output("out");
    let err = onnx::parse(&bad.bytes()).unwrap_err().to_string();
    assert!(err.contains("node `act`") && err.contains("lstm"), "{err}");
}

/// PyTorch's export of `nn.GRU(10, 8, batch_first=True)` with an initial
/// state: time-major ONNX layout 0 between layout-only transposes.
#[test]
fn gru_in_pytorch_layout_with_initial_state() {
    let (i, h) = (10, 8);
    let mut n = Net::new("main_graph");
    n.input("x", "N,time,10").input("h0", "1,N,8");
    n.node(
        "Transpose",
        "/gru/Transpose",
        &["x"],
        &["xt"],
        vec![ints("perm", &[1, 0, 2])],
    );
    n.weight("W", &[1, 3 * h, i])
        .weight("R", &[1, 3 * h, h])
        .weight("B", &[1, 6 * h]);
    n.node(
        "GRU",
        "/gru/GRU",
        &["xt", "W", "R", "B", "", "h0"],
        &["gy", "gh"],
        vec![int("hidden_size", h), int("linear_before_reset", 1)],
    );
    n.init(int64s("axes", &[1]));
    n.node("Squeeze", "/gru/Squeeze", &["gy", "axes"], &["gs"], vec![]);
    n.node(
        "Transpose",
        "/gru/Transpose_1",
        &["gs"],
        &["gb"],
        vec![ints("perm", &[1, 0, 2])],
    );
    n.weight("head.W", &[h, 1]);
    n.node("MatMul", "head", &["gb", "head.W"], &["out"], vec![]);
    n.output("out");

    let g = onnx::parse(&n.bytes()).unwrap();
    assert_eq!(g.inputs.len(), 1, "h0 only sets the initial state");
    assert_eq!(g.inputs[0].shape, Shape(vec![Dim::Seq, Dim::Fixed(10)]));
    let names: Vec<&str> = g.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["/gru/GRU", "head"]);
    assert_eq!(
        g.nodes[0].op,
        Op::Rnn {
            cell: Cell::Gru,
            input_size: 10,
            hidden: 8,
            bidirectional: false,
            bias: RnnBias::Double,
        }
    );
    assert_eq!(g.nodes[0].inputs, ["x"]);
    assert_eq!(g.nodes[1].inputs, ["/gru/GRU"]);
    // GRU 3*8*10 + 3*8*8 + 2*3*8; head 8*1
    assert_eq!(g.param_count(), 240 + 192 + 48 + 8);
    assert_eq!(g.loss.kind, LossKind::Mse);
}

/// Two stacked LSTMs as PyTorch exports `num_layers=2, bidirectional=True`:
/// the second layer reads the first one's merged time-major output.
#[test]
fn stacked_bidirectional_lstm_in_layout_0() {
    let (i, h) = (6, 5);
    let mut n = Net::new("stack");
    n.input("x", "batch,frames,6");
    n.node(
        "Transpose",
        "t_in",
        &["x"],
        &["xt"],
        vec![ints("perm", &[1, 0, 2])],
    );
    n.weight("W0", &[2, 4 * h, i])
        .weight("R0", &[2, 4 * h, h])
        .weight("B0", &[2, 8 * h]);
    let bi = || vec![int("hidden_size", 5), string("direction", "bidirectional")];
    n.node("LSTM", "lstm0", &["xt", "W0", "R0", "B0"], &["y0"], bi());
    n.node(
        "Transpose",
        "t0",
        &["y0"],
        &["y0t"],
        vec![ints("perm", &[0, 2, 1, 3])],
    );
    n.init(int64s("shape", &[0, 0, -1]));
    n.node("Reshape", "m0", &["y0t", "shape"], &["y0m"], vec![]);
    n.weight("W1", &[2, 4 * h, 2 * h])
        .weight("R1", &[2, 4 * h, h])
        .weight("B1", &[2, 8 * h]);
    n.node("LSTM", "lstm1", &["y0m", "W1", "R1", "B1"], &["y1"], bi());
    n.node(
        "Transpose",
        "t1",
        &["y1"],
        &["y1t"],
        vec![ints("perm", &[0, 2, 1, 3])],
    );
    n.node("Reshape", "m1", &["y1t", "shape"], &["y1m"], vec![]);
    n.node(
        "Transpose",
        "t_out",
        &["y1m"],
        &["y"],
        vec![ints("perm", &[1, 0, 2])],
    );
    n.weight("fc.W", &[2 * h, 3]);
    n.node("MatMul", "fc", &["y", "fc.W"], &["out"], vec![]);
    n.output("out");

    let g = onnx::parse(&n.bytes()).unwrap();
    let names: Vec<&str> = g.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["lstm0", "lstm1", "fc"]);
    assert_eq!(g.nodes[1].inputs, ["lstm0"]);
    assert!(matches!(
        g.nodes[1].op,
        Op::Rnn {
            input_size: 10,
            hidden: 5,
            ..
        }
    ));
    let lstm = |i: i64| 2 * (4 * h * i + 4 * h * h + 8 * h);
    assert_eq!(g.param_count(), (lstm(6) + lstm(10) + 10 * 3) as u64);
}

#[test]
fn weights_and_values_from_constant_nodes() {
    let mut n = Net::new("constants");
    n.input("x", "batch,4");
    n.node(
        "Constant",
        "w1c",
        &[],
        &["w1"],
        vec![tensor("value", zeros("", &[3, 4]))],
    );
    n.node(
        "Constant",
        "b1c",
        &[],
        &["b1"],
        vec![tensor("value", zeros("", &[3]))],
    );
    n.node(
        "Gemm",
        "fc1",
        &["x", "w1", "b1"],
        &["h"],
        vec![int("transB", 1)],
    );
    n.node(
        "Constant",
        "shape",
        &[],
        &["s"],
        vec![ints("value_ints", &[0, 3, 1])],
    );
    n.node("Reshape", "r", &["h", "s"], &["hr"], vec![]);
    n.node("Flatten", "f", &["hr"], &["hf"], vec![]);
    n.node(
        "Constant",
        "lo",
        &[],
        &["min"],
        vec![tensor("value", scalar("", 0.0))],
    );
    n.node(
        "Constant",
        "hi",
        &[],
        &["max"],
        vec![tensor("value", scalar("", 6.0))],
    );
    n.node("Clip", "relu6", &["hf", "min", "max"], &["c"], vec![]);
    n.node("Identity", "id", &["c"], &["c2"], vec![]);
    n.weight("fc2.W", &[1, 3]).weight("fc2.B", &[1]);
    n.node(
        "Gemm",
        "fc2",
        &["c2", "fc2.W", "fc2.B"],
        &["y"],
        vec![int("transB", 1)],
    );
    n.output("y");

    let g = onnx::parse(&n.bytes()).unwrap();
    let names: Vec<&str> = g.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["fc1", "r", "f", "relu6", "fc2"]);
    assert_eq!(g.nodes[1].op, Op::Reshape { shape: vec![3, 1] });
    assert_eq!(g.nodes[3].op, Op::ClippedRelu { max: 6.0 });
    assert_eq!(g.nodes[4].inputs, ["relu6"], "Identity is an alias");
    assert_eq!(g.param_count(), 12 + 3 + 3 + 1);
    assert_eq!(g.loss.kind, LossKind::Mse);
}

/// Nodes out of order (ONNX forbids it, some files do it anyway) and a weight
/// transposed in the graph, as old PyTorch exports of `Linear(bias=False)` have.
#[test]
fn unordered_nodes_and_transposed_weights() {
    let mut n = Net::new("unordered");
    n.input("x", "batch,4");
    n.weight("W", &[3, 4]);
    n.node("Relu", "act", &["h"], &["out"], vec![]);
    n.node("MatMul", "fc", &["x", "Wt"], &["h"], vec![]);
    n.node(
        "Transpose",
        "t",
        &["W"],
        &["Wt"],
        vec![ints("perm", &[1, 0])],
    );
    n.output("out");

    let g = onnx::parse(&n.bytes()).unwrap();
    let names: Vec<&str> = g.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["fc", "act"]);
    assert_eq!(
        g.nodes[0].op,
        Op::Linear {
            in_features: 4,
            out_features: 3,
            bias: false
        }
    );

    // A cycle is no model.
    n.g.node[2].input = vec!["out".into()];
    let msg = onnx::parse(&n.bytes()).unwrap_err().to_string();
    assert!(
        msg.contains("not a valid ONNX model") && msg.contains("cycle"),
        "{msg}"
    );
}

#[test]
fn token_inputs_feed_embeddings() {
    let mut n = Net::new("tagger");
    n.input_of("ids", "batch,seq_len", DataType::Int64);
    n.weight("emb", &[1000, 32]);
    n.node("Gather", "embed", &["emb", "ids"], &["e"], vec![]);
    n.weight("W", &[1, 64, 32])
        .weight("R", &[1, 64, 16])
        .weight("B", &[1, 128]);
    n.node(
        "LSTM",
        "lstm",
        &["e", "W", "R", "B"],
        &["y"],
        vec![int("hidden_size", 16), int("layout", 1)],
    );
    n.init(int64s("axes", &[2]));
    n.node("Squeeze", "sq", &["y", "axes"], &["ys"], vec![]);
    n.weight("fc.W", &[16, 5]).weight("fc.B", &[5]);
    n.node("MatMul", "fc", &["ys", "fc.W"], &["mm"], vec![]);
    n.node("Add", "fc_add", &["mm", "fc.B"], &["tags"], vec![]);
    n.node(
        "LogSoftmax",
        "logp",
        &["tags"],
        &["out"],
        vec![int("axis", 2)],
    );
    n.output("out");

    let g = onnx::parse(&n.bytes()).unwrap();
    assert_eq!(
        g.inputs[0].kind,
        batchfit_graph::InputKind::Tokens { vocab: 1000 }
    );
    assert_eq!(g.inputs[0].shape, Shape(vec![Dim::Seq]));
    assert_eq!(
        g.nodes[0].op,
        Op::Embedding {
            vocab: 1000,
            dim: 32
        }
    );
    assert_eq!(g.loss.kind, LossKind::CrossEntropyPerFrame);
    assert_eq!(g.loss.input, "fc");
    assert_eq!(
        g.param_count(),
        32_000 + 4 * 16 * (32 + 16) + 128 + 16 * 5 + 5
    );
}

#[test]
fn garbage_and_truncated_files_name_the_path() {
    let dir = temp_dir("garbage");
    let bytes = seed2().bytes();
    let cases = [
        ("truncated.onnx", bytes[..bytes.len() / 2].to_vec()),
        ("text.onnx", b"this is not an onnx model\n".to_vec()),
        ("empty-graph.onnx", model_bytes(GraphProto::default(), 17)),
    ];
    for (file, content) in cases {
        let path = dir.join(file);
        std::fs::write(&path, content).unwrap();
        let err = onnx::load(&path).unwrap_err();
        let shown = path.display().to_string();
        assert!(
            matches!(&err, GraphError::InFile { path: p, .. } if *p == path),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains(&shown) && msg.contains("not a valid ONNX model"),
            "{file}: {msg}"
        );
    }
    let missing = dir.join("missing.onnx");
    let msg = batchfit_graph::load(missing.to_str().unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("missing.onnx") && msg.contains("cannot read"),
        "{msg}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn unknown_op_names_node_and_type() {
    let mut n = Net::new("detector");
    n.input("boxes", "batch,100,4")
        .input("scores", "batch,1,100");
    n.node(
        "NonMaxSuppression",
        "nms",
        &["boxes", "scores"],
        &["selected"],
        vec![],
    );
    n.output("selected");
    let err = onnx::parse(&n.bytes()).unwrap_err();
    match &err {
        GraphError::Unsupported { node, op_type, .. } => {
            assert_eq!(node, "nms");
            assert_eq!(op_type, "NonMaxSuppression");
        }
        other => panic!("{other:?}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains("`nms`") && msg.contains("NonMaxSuppression") && msg.contains("Gemm"),
        "{msg}"
    );
}

#[test]
fn unfoldable_constants_and_batch_reshapes_are_errors() {
    // x * 2: arithmetic with a constant that is no bias.
    let mut n = Net::new("scale");
    n.input("x", "batch,8");
    n.init(scalar("two", 2.0));
    n.node("Mul", "scale", &["x", "two"], &["y"], vec![]);
    n.weight("W", &[1, 8]);
    n.node("Gemm", "fc", &["y", "W"], &["out"], vec![int("transB", 1)]);
    n.output("out");
    let msg = onnx::parse(&n.bytes()).unwrap_err().to_string();
    assert!(
        msg.contains("node `scale`") && msg.contains("constant"),
        "{msg}"
    );

    // Adding zeros is an alias.
    n.g.initializer[0] = scalar("two", 0.0);
    n.g.node[0].op_type = "Add".into();
    let g = onnx::parse(&n.bytes()).unwrap();
    assert_eq!(g.nodes.len(), 1);

    // Reshape that folds the time axis into the batch.
    let mut n = Net::new("fold");
    n.input("x", "batch,4,8");
    n.init(int64s("s", &[32, 8]));
    n.node("Reshape", "fold", &["x", "s"], &["y"], vec![]);
    n.node("Relu", "act", &["y"], &["out"], vec![]);
    n.output("out");
    let msg = onnx::parse(&n.bytes()).unwrap_err().to_string();
    assert!(
        msg.contains("node `fold`") && msg.contains("batch"),
        "{msg}"
    );

    // Clip that is not a ReLU.
    let mut n = Net::new("clip");
    n.input("x", "batch,8");
    n.init(scalar("lo", -1.0)).init(scalar("hi", 1.0));
    n.node("Clip", "hardtanh", &["x", "lo", "hi"], &["out"], vec![]);
    n.output("out");
    let msg = onnx::parse(&n.bytes()).unwrap_err().to_string();
    assert!(
        msg.contains("node `hardtanh`") && msg.contains("Clip"),
        "{msg}"
    );
}

#[test]
fn onnx_file_loads_through_the_crate_entry_point() {
    let dir = temp_dir("load");
    let path = dir.join("seed2.onnx");
    let mut net = seed2();
    net.g.name = "main_graph".into(); // PyTorch's default: the file name is used instead
    std::fs::write(&path, net.bytes()).unwrap();
    let g = batchfit_graph::load(path.to_str().unwrap()).unwrap();
    assert_eq!(g.param_count(), 87_229);
    assert_eq!(g.name, "seed2");
    assert_eq!(g.output().shape.to_string(), "[B, 1]");
    assert!(matches!(
        g.nodes[2].op,
        Op::Pool {
            pool: PoolKind::Avg,
            ..
        }
    ));
    std::fs::remove_dir_all(dir).unwrap();
}

// ----- trained weights ------------------------------------------------------

/// A float initializer with these values in `float_data`.
fn floats(name: &str, dims: &[i64], values: &[f32]) -> TensorProto {
    TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: DataType::Float as i32,
        float_data: values.to_vec(),
        ..Default::default()
    }
}

/// A float initializer with these values little-endian in `raw_data`.
fn raw_floats(name: &str, dims: &[i64], values: &[f32]) -> TensorProto {
    TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: DataType::Float as i32,
        raw_data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ..Default::default()
    }
}

fn float(name: &str, v: f32) -> AttributeProto {
    AttributeProto {
        f: v,
        ..attr(name, AttributeType::Float)
    }
}

/// Gemm (both `transB`, `alpha`/`beta`, a broadcast bias), MatMul with a
/// double weight and a folded bias, a weight transposed in the graph: every
/// weight lands in the IR's `[out, in]` layout; an f16 weight is not read.
#[test]
fn linear_weights_land_in_ir_layout() {
    let mut n = Net::new("linear-weights");
    n.input("x", "batch,3");
    // B [in = 3, out = 2]
    n.init(raw_floats("g1.B", &[3, 2], &[1., 2., 3., 4., 5., 6.]))
        .init(floats("g1.C", &[2], &[0.5, -0.5]));
    n.node("Gemm", "g1", &["x", "g1.B", "g1.C"], &["h1"], vec![]);
    // B [out = 2, in = 2], scaled by alpha; scalar C scaled by beta
    n.init(floats("g2.B", &[2, 2], &[1., 2., 3., 4.]))
        .init(floats("g2.C", &[1], &[1.0]));
    n.node(
        "Gemm",
        "g2",
        &["h1", "g2.B", "g2.C"],
        &["h2"],
        vec![int("transB", 1), float("alpha", 2.0), float("beta", 3.0)],
    );
    n.init(TensorProto {
        name: "m.W".into(),
        dims: vec![2, 2],
        data_type: DataType::Double as i32,
        raw_data: [1f64, 2., 3., 4.]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        ..Default::default()
    })
    .init(floats("m.b", &[1, 2], &[7., 8.]));
    n.node("MatMul", "m", &["h2", "m.W"], &["h3"], vec![]);
    n.node("Add", "m_bias", &["h3", "m.b"], &["h4"], vec![]);
    // W [out = 3, in = 2] transposed in the graph to [in, out] for a MatMul.
    n.init(floats("t.W", &[3, 2], &[1., 2., 3., 4., 5., 6.]));
    n.node(
        "Transpose",
        "t_w",
        &["t.W"],
        &["t.Wt"],
        vec![ints("perm", &[1, 0])],
    );
    n.node("MatMul", "t", &["h4", "t.Wt"], &["h5"], vec![]);
    n.init(TensorProto {
        name: "half.B".into(),
        dims: vec![2, 3],
        data_type: DataType::Float16 as i32,
        int32_data: vec![0x3c00; 6], // 1.0
        ..Default::default()
    });
    n.node(
        "Gemm",
        "half",
        &["h5", "half.B"],
        &["y"],
        vec![int("transB", 1)],
    );
    n.output("y");

    let g = onnx::parse(&n.bytes()).unwrap();
    let names: Vec<&str> = g.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["g1", "g2", "m", "t", "half"]);
    let w = |k: usize| g.nodes[k].weights.clone();
    assert_eq!(
        w(0),
        Some(vec![vec![1., 3., 5., 2., 4., 6.], vec![0.5, -0.5]]),
        "transB = 0: B transposed"
    );
    assert_eq!(
        w(1),
        Some(vec![vec![2., 4., 6., 8.], vec![3., 3.]]),
        "transB = 1: B as is, times alpha; C broadcast, times beta"
    );
    assert_eq!(
        w(2),
        Some(vec![vec![1., 3., 2., 4.], vec![7., 8.]]),
        "MatMul weight transposed, double converted, folded bias"
    );
    assert_eq!(w(3), Some(vec![vec![1., 2., 3., 4., 5., 6.]]));
    assert_eq!(w(4), None, "f16 values are not read");
    for node in &g.nodes[..4] {
        let params = node.op.params();
        let weights = node.weights.as_ref().unwrap();
        for (p, v) in params.iter().zip(weights) {
            assert_eq!(p.elements() as usize, v.len(), "{}.{}", node.name, p.name);
        }
    }
}

/// ONNX gate blocks (LSTM i, o, f, c; GRU z, r, h) come out in PyTorch's order
/// (i, f, g, o; r, z, n), `B` splits into input and recurrent biases per
/// direction, and a missing `B` is zeros.
#[test]
fn lstm_and_gru_weights_in_pytorch_gate_order() {
    let mut n = Net::new("rnn-weights");
    n.input("x", "batch,seq,2");
    // LSTM, hidden 1, input 2: rows i, o, f, c.
    n.init(floats("l.W", &[1, 4, 2], &[1., 2., 3., 4., 5., 6., 7., 8.]))
        .init(floats("l.R", &[1, 4, 1], &[10., 20., 30., 40.]))
        .init(raw_floats(
            "l.B",
            &[1, 8],
            &[0.1, 0.2, 0.3, 0.4, 1., 2., 3., 4.],
        ));
    n.node(
        "LSTM",
        "lstm",
        &["x", "l.W", "l.R", "l.B"],
        &["ly"],
        vec![int("hidden_size", 1), int("layout", 1)],
    );
    n.init(int64s("merge", &[0, 0, -1]));
    n.node("Reshape", "l_merge", &["ly", "merge"], &["l"], vec![]);
    // Bidirectional GRU, hidden 1, input 1, no B: rows z, r, h per direction.
    n.init(floats("g.W", &[2, 3, 1], &[1., 2., 3., 4., 5., 6.]))
        .init(floats("g.R", &[2, 3, 1], &[10., 20., 30., 40., 50., 60.]));
    n.node(
        "GRU",
        "gru",
        &["l", "g.W", "g.R"],
        &["gy"],
        vec![
            int("hidden_size", 1),
            int("layout", 1),
            string("direction", "bidirectional"),
            int("linear_before_reset", 1),
        ],
    );
    n.node("Reshape", "g_merge", &["gy", "merge"], &["y"], vec![]);
    n.output("y");

    let g = onnx::parse(&n.bytes()).unwrap();
    let names: Vec<&str> = g.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["lstm", "gru"]);
    let lstm = g.nodes[0].weights.clone().unwrap();
    assert_eq!(
        lstm,
        vec![
            vec![1., 2., 5., 6., 7., 8., 3., 4.], // weight_ih [4, 2]: i, f, g, o
            vec![10., 30., 40., 20.],             // weight_hh [4, 1]
            vec![0.1, 0.3, 0.4, 0.2],             // bias_ih
            vec![1., 3., 4., 2.],                 // bias_hh
        ]
    );
    let gru = g.nodes[1].weights.clone().unwrap();
    let z = vec![0.0; 3];
    assert_eq!(
        gru,
        vec![
            vec![2., 1., 3.],
            vec![20., 10., 30.],
            z.clone(),
            z.clone(),
            vec![5., 4., 6.],
            vec![50., 40., 60.],
            z.clone(),
            z,
        ]
    );
    let names: Vec<String> = g.nodes[1].op.params().into_iter().map(|p| p.name).collect();
    assert_eq!(
        names,
        [
            "weight_ih",
            "weight_hh",
            "bias_ih",
            "bias_hh",
            "weight_ih_reverse",
            "weight_hh_reverse",
            "bias_ih_reverse",
            "bias_hh_reverse"
        ]
    );
}
