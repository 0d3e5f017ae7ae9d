//! ONNX import of recurrent layers: LSTM and GRU in both layouts, the
//! layout-only nodes around them, and their weights in PyTorch's gate order.

use batchfit_graph::{Cell, Dim, LossKind, Op, RnnBias, Shape, onnx};

mod common;
use common::*;

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

    // Y [B, T, dirs, H] fed straight into another op is the LSTM output split by a
    // reshape (batch-first, so no transpose).
    let mut split = Net::new("split");
    split.g = n.g.clone();
    split.g.node.truncate(1);
    split.node("Relu", "act", &["y"], &["out"], vec![]);
    split.g.output = vec![];
    split.output("out");
    let g = onnx::parse(&split.bytes()).unwrap();
    assert_eq!(
        g.nodes[1].op,
        Op::Reshape {
            shape: vec![-1, 2, 16]
        }
    );
    assert_eq!(
        g.nodes[2].shape,
        Shape(vec![Dim::Seq, Dim::Fixed(2), Dim::Fixed(16)])
    );
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
