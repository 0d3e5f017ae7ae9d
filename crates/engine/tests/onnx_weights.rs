//! Training starts from an ONNX file's weights: a model written with the ONNX
//! proto messages, loaded like the CLI loads it, gives the forward output its
//! weights define (computed here by hand / by ONNX's equations), and starts
//! randomly when asked to.

use batchfit_engine::model::{Batch, Init, Program, Target, Value};
use batchfit_engine::{DeviceSpec, TrainConfig, Trainer};
use batchfit_graph::onnx::proto::tensor_shape_proto::{Dimension, dimension};
use batchfit_graph::onnx::proto::{
    AttributeProto, AttributeType, DataType, GraphProto, Message, ModelProto, NodeProto,
    OperatorSetIdProto, TensorProto, TensorShapeProto, TypeProto, ValueInfoProto, type_proto,
};
use batchfit_graph::{Graph, LossKind, onnx};
use batchfit_plan::Optimizer;
use burn::tensor::{Device, Tensor, TensorData};

// ----- model writing --------------------------------------------------------

fn value_info(name: &str, dims: &str) -> ValueInfoProto {
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
                elem_type: DataType::Float as i32,
                shape: Some(TensorShapeProto { dim }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn output(name: &str) -> ValueInfoProto {
    ValueInfoProto {
        name: name.into(),
        ..Default::default()
    }
}

/// A float initializer, little-endian in `raw_data` as exporters write it.
fn floats(name: &str, dims: &[i64], values: &[f32]) -> TensorProto {
    assert_eq!(dims.iter().product::<i64>() as usize, values.len());
    TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: DataType::Float as i32,
        raw_data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
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

fn int(name: &str, v: i64) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        i: v,
        r#type: AttributeType::Int as i32,
        ..Default::default()
    }
}

fn string(name: &str, v: &str) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        s: v.as_bytes().to_vec(),
        r#type: AttributeType::String as i32,
        ..Default::default()
    }
}

fn node(op: &str, inputs: &[&str], out: &str, attribute: Vec<AttributeProto>) -> NodeProto {
    NodeProto {
        op_type: op.into(),
        name: out.into(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![out.into()],
        attribute,
        ..Default::default()
    }
}

/// Writes the model to a temporary `.onnx` file and loads it as the CLI does.
fn load(test: &str, graph: GraphProto) -> Graph {
    let bytes = ModelProto {
        ir_version: 8,
        producer_name: "batchfit-tests".into(),
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 17,
        }],
        graph: Some(graph),
        ..Default::default()
    }
    .encode_to_vec();
    // One folder per test (tests run in parallel), removed with its file.
    let dir = std::env::temp_dir().join(format!(
        "batchfit-onnx-weights-{}-{test}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{test}.onnx"));
    std::fs::write(&path, bytes).unwrap();
    let g = onnx::load_with_loss(&path, Some(LossKind::Mse)).unwrap();
    std::fs::remove_file(&path).ok();
    std::fs::remove_dir(&dir).ok();
    g
}

// ----- running --------------------------------------------------------------

fn trainer(g: &Graph, seq_len: usize, init_random: bool) -> Trainer {
    Trainer::new(
        g,
        TrainConfig {
            optimizer: Optimizer::Sgd,
            lr: 0.01,
            seq_len,
            seed: 3,
            device: DeviceSpec::Cpu,
            init_random,
        },
    )
    .unwrap()
}

/// A batch of one float input `[b, elements]`, with a zero regression target.
fn batch(x: &[f32], b: usize, out_elems: usize, device: &Device) -> Batch {
    let elems = x.len() / b;
    Batch {
        inputs: vec![Value::Float(Tensor::from_data(
            TensorData::new(x.to_vec(), [b, elems]),
            device,
        ))],
        target: Target::Dense(Tensor::zeros([b, out_elems], device)),
        size: b,
    }
}

fn forward(t: &Trainer, batch: &Batch) -> Vec<f32> {
    t.program
        .forward(t.params(), batch, false)
        .into_data()
        .try_to_vec::<f32>()
        .unwrap()
}

fn assert_close(got: &[f32], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (f64::from(*g) - w).abs() < 1e-5,
            "{what}[{k}]: engine {g}, expected {w}\n engine {got:?}\n expected {want:?}"
        );
    }
}

/// Deterministic values in [-0.5, 0.5).
fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|k| ((k * 7 + seed * 13) % 19) as f32 / 19.0 - 0.5)
        .collect()
}

// ----- tests ----------------------------------------------------------------

/// PyTorch's export of `nn.Linear(3, 2)`: Gemm with `transB = 1`.
#[test]
fn linear_from_onnx_computes_its_weights() {
    let w = [0.5, -1.0, 2.0, 1.5, 0.25, -0.5]; // [out = 2, in = 3]
    let c = [0.1, -0.2];
    let graph = GraphProto {
        name: "linear".into(),
        input: vec![value_info("x", "batch,3")],
        output: vec![output("y")],
        initializer: vec![
            floats("fc.weight", &[2, 3], &w),
            floats("fc.bias", &[2], &c),
        ],
        node: vec![node(
            "Gemm",
            &["x", "fc.weight", "fc.bias"],
            "y",
            vec![int("transB", 1)],
        )],
        ..Default::default()
    };
    let g = load("linear", graph);
    assert!(g.nodes[0].weights.is_some());
    let x = [1.0, 2.0, 3.0, -1.0, 0.5, 2.0];
    // y = x W^T + b, by hand:
    // [0.5 - 2 + 6 + 0.1, 1.5 + 0.5 - 1.5 - 0.2] and [-0.5 - 0.5 + 4 + 0.1, -1.5 + 0.125 - 1 - 0.2]
    let want = [4.6, 0.3, 3.1, -2.575];

    let t = trainer(&g, 1, false);
    let b = batch(&x, 2, 2, &t.device);
    assert_close(&forward(&t, &b), &want, "from the file's weights");

    // Asked to, the engine ignores the weights.
    let r = trainer(&g, 1, true);
    let b = batch(&x, 2, 2, &r.device);
    let random = forward(&r, &b);
    assert!(
        random
            .iter()
            .zip(&want)
            .any(|(g, w)| (f64::from(*g) - w).abs() > 1e-3),
        "random init gave the file's output {random:?}"
    );
    // And Program::new says the same without a trainer.
    let device = batchfit_engine::device::BurnDevice::device(DeviceSpec::Cpu).unwrap();
    let (program, params) = Program::new(&g, 1, Init::FromGraph, &device).unwrap();
    let out = program
        .forward(&params, &batch(&x, 2, 2, &device), false)
        .into_data()
        .try_to_vec::<f32>()
        .unwrap();
    assert_close(&out, &want, "Program::new(Init::FromGraph)");

    // Training from the file's weights runs and moves them.
    let mut t = trainer(&g, 1, false);
    let b = batch(&x, 2, 2, &t.device);
    let first = t.step(&b);
    let second = t.step(&b);
    assert!(
        first.is_finite() && second < first,
        "loss {first} -> {second}"
    );
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// ONNX's LSTM (`i, o, f, c` gates) or GRU (`z, r, h`, `linear_before_reset = 1`)
/// over `x [T][I]` in one direction from zero state, from the ONNX tensors of
/// that direction: `w [G*H, I]`, `r [G*H, H]`, `b [2*G*H]`. Returns `[T][H]`.
fn onnx_rnn(
    lstm: bool,
    h: usize,
    x: &[Vec<f64>],
    w: &[f32],
    r: &[f32],
    b: &[f32],
    reverse: bool,
) -> Vec<Vec<f64>> {
    let gates = if lstm { 4 } else { 3 };
    let i_size = x[0].len();
    let mut hs = vec![vec![0.0; h]; x.len()];
    let (mut hp, mut cp) = (vec![0.0; h], vec![0.0; h]);
    let steps: Vec<usize> = if reverse {
        (0..x.len()).rev().collect()
    } else {
        (0..x.len()).collect()
    };
    for t in steps {
        // xw[k][j] = W_k x + Wb_k, hr[k][j] = R_k h + Rb_k
        let mut xw = vec![vec![0.0; h]; gates];
        let mut hr = vec![vec![0.0; h]; gates];
        for k in 0..gates {
            for j in 0..h {
                let row = k * h + j;
                xw[k][j] = (0..i_size)
                    .map(|i| f64::from(w[row * i_size + i]) * x[t][i])
                    .sum::<f64>()
                    + f64::from(b[row]);
                hr[k][j] = (0..h)
                    .map(|m| f64::from(r[row * h + m]) * hp[m])
                    .sum::<f64>()
                    + f64::from(b[gates * h + row]);
            }
        }
        let mut hn = vec![0.0; h];
        for j in 0..h {
            if lstm {
                let i = sigmoid(xw[0][j] + hr[0][j]);
                let o = sigmoid(xw[1][j] + hr[1][j]);
                let f = sigmoid(xw[2][j] + hr[2][j]);
                let c = (xw[3][j] + hr[3][j]).tanh();
                cp[j] = f * cp[j] + i * c;
                hn[j] = o * cp[j].tanh();
            } else {
                let z = sigmoid(xw[0][j] + hr[0][j]);
                let rg = sigmoid(xw[1][j] + hr[1][j]);
                let n = (xw[2][j] + rg * hr[2][j]).tanh();
                hn[j] = (1.0 - z) * n + z * hp[j];
            }
        }
        hp = hn.clone();
        hs[t] = hn;
    }
    hs
}

/// `x` of sample `s` as `[T][I]`.
fn sample(x: &[f32], s: usize, t: usize, i: usize) -> Vec<Vec<f64>> {
    (0..t)
        .map(|k| (0..i).map(|j| f64::from(x[(s * t + k) * i + j])).collect())
        .collect()
}

/// An LSTM exported with `layout = 1`: one step checked by hand, then two
/// steps against ONNX's equations on the file's tensors.
#[test]
fn lstm_from_onnx_matches_onnx_equations() {
    let (i, h) = (2usize, 2usize);
    let g4 = 4 * h;
    let (w, r, b) = (values(g4 * i, 1), values(g4 * h, 2), values(2 * g4, 3));
    let graph = GraphProto {
        name: "lstm".into(),
        input: vec![value_info("x", "batch,seq,2")],
        output: vec![output("y")],
        initializer: vec![
            floats("W", &[1, g4 as i64, i as i64], &w),
            floats("R", &[1, g4 as i64, h as i64], &r),
            floats("B", &[1, 2 * g4 as i64], &b),
            int64s("merge", &[0, 0, -1]),
        ],
        node: vec![
            node(
                "LSTM",
                &["x", "W", "R", "B"],
                "ly",
                vec![int("hidden_size", h as i64), int("layout", 1)],
            ),
            node("Reshape", &["ly", "merge"], "y", vec![]),
        ],
        ..Default::default()
    };
    let g = load("lstm", graph);

    // One step from zero state, by hand: h = o * tanh(i * c~), since f * c0 = 0
    // and R h0 = 0; each gate is W_k x + Wb_k + Rb_k with ONNX's rows i, o, f, c.
    let x1 = [0.3f32, -0.7, 1.1, 0.4];
    let t = trainer(&g, 1, false);
    let out = forward(&t, &batch(&x1, 2, h, &t.device));
    let mut want = Vec::new();
    for s in 0..2 {
        for j in 0..h {
            let gate = |k: usize| {
                let row = k * h + j;
                f64::from(w[row * i]) * f64::from(x1[s * i])
                    + f64::from(w[row * i + 1]) * f64::from(x1[s * i + 1])
                    + f64::from(b[row])
                    + f64::from(b[g4 + row])
            };
            let (ig, o, c) = (sigmoid(gate(0)), sigmoid(gate(1)), gate(3).tanh());
            want.push(o * (ig * c).tanh());
        }
    }
    assert_close(&out, &want, "one LSTM step");

    // Two steps: the recurrence and the cell state.
    let x2 = [0.3f32, -0.7, 0.9, 0.2, 1.1, 0.4, -0.5, -1.2];
    let t = trainer(&g, 2, false);
    let out = forward(&t, &batch(&x2, 2, 2 * h, &t.device));
    let want: Vec<f64> = (0..2)
        .flat_map(|s| onnx_rnn(true, h, &sample(&x2, s, 2, i), &w, &r, &b, false))
        .flatten()
        .collect();
    assert_close(&out, &want, "two LSTM steps");
}

/// A bidirectional GRU without `B` (zeros) as PyTorch exports it
/// (`linear_before_reset = 1`): both directions follow ONNX's equations.
#[test]
fn bidirectional_gru_from_onnx_matches_onnx_equations() {
    let (i, h, steps) = (3usize, 2usize, 3usize);
    let g3 = 3 * h;
    let (w, r) = (values(2 * g3 * i, 4), values(2 * g3 * h, 5));
    let graph = GraphProto {
        name: "gru".into(),
        input: vec![value_info("x", "batch,seq,3")],
        output: vec![output("y")],
        initializer: vec![
            floats("W", &[2, g3 as i64, i as i64], &w),
            floats("R", &[2, g3 as i64, h as i64], &r),
            int64s("merge", &[0, 0, -1]),
        ],
        node: vec![
            node(
                "GRU",
                &["x", "W", "R"],
                "gy",
                vec![
                    int("hidden_size", h as i64),
                    int("layout", 1),
                    int("linear_before_reset", 1),
                    string("direction", "bidirectional"),
                ],
            ),
            node("Reshape", &["gy", "merge"], "y", vec![]),
        ],
        ..Default::default()
    };
    let g = load("gru", graph);
    let x = values(2 * steps * i, 6)
        .into_iter()
        .map(|v| 2.0 * v)
        .collect::<Vec<_>>();
    let t = trainer(&g, steps, false);
    let out = forward(&t, &batch(&x, 2, steps * 2 * h, &t.device));
    let zeros = vec![0.0f32; 2 * g3];
    let mut want = Vec::new();
    for s in 0..2 {
        let xs = sample(&x, s, steps, i);
        let dir = |d: usize| {
            onnx_rnn(
                false,
                h,
                &xs,
                &w[d * g3 * i..(d + 1) * g3 * i],
                &r[d * g3 * h..(d + 1) * g3 * h],
                &zeros,
                d == 1,
            )
        };
        let (fwd, rev) = (dir(0), dir(1));
        for k in 0..steps {
            want.extend(&fwd[k]);
            want.extend(&rev[k]);
        }
    }
    assert_close(&out, &want, "bidirectional GRU");
}

/// PyTorch's `nn.ConvTranspose1d(2, 3, 3, stride=2, padding=1, output_padding=1)`:
/// its weight `[in, out, kernel]`, against the definition written out: input position
/// `t` adds `x[c, t] W[c, o, k]` to output position `t s + k - p`.
#[test]
fn a_transposed_convolution_from_onnx_computes_its_weights() {
    let (cin, cout, kernel, len, stride, pad) = (2, 3, 3, 4, 2, 1);
    let out_len = (len - 1) * stride - 2 * pad + kernel + 1;
    let w = values(cin * cout * kernel, 1);
    let bias = values(cout, 2);
    let ints = |name: &str, v: &[i64]| AttributeProto {
        name: name.into(),
        r#type: batchfit_graph::onnx::proto::AttributeType::Ints as i32,
        ints: v.to_vec(),
        ..Default::default()
    };
    let graph = GraphProto {
        name: "decoder".into(),
        input: vec![value_info("x", &format!("batch,{cin},{len}"))],
        output: vec![output("y")],
        initializer: vec![
            floats("up.weight", &[cin as i64, cout as i64, kernel as i64], &w),
            floats("up.bias", &[cout as i64], &bias),
        ],
        node: vec![NodeProto {
            op_type: "ConvTranspose".into(),
            name: "/up".into(),
            input: vec!["x".into(), "up.weight".into(), "up.bias".into()],
            output: vec!["y".into()],
            attribute: vec![
                ints("strides", &[stride as i64]),
                ints("pads", &[pad as i64, pad as i64]),
                ints("output_padding", &[1]),
            ],
            ..Default::default()
        }],
        ..Default::default()
    };
    let g = load("conv_transpose", graph);
    let x = values(2 * cin * len, 3);
    let mut want = vec![0.0f64; 2 * cout * out_len];
    for s in 0..2 {
        for o in 0..cout {
            for j in 0..out_len {
                want[(s * cout + o) * out_len + j] = f64::from(bias[o]);
            }
            for c in 0..cin {
                for t in 0..len {
                    for k in 0..kernel {
                        let Some(j) = (t * stride + k).checked_sub(pad).filter(|&j| j < out_len)
                        else {
                            continue;
                        };
                        want[(s * cout + o) * out_len + j] += f64::from(x[(s * cin + c) * len + t])
                            * f64::from(w[(c * cout + o) * kernel + k]);
                    }
                }
            }
        }
    }
    let t = trainer(&g, 1, false);
    let b = batch(&x, 2, cout * out_len, &t.device);
    assert_close(&forward(&t, &b), &want, "transposed convolution");
}

/// timm's `ScaledStdConv2d` as torch.onnx writes it (1-d here): the weight seen as
/// `[1, out, fan_in]`, batch-normalised in training mode with the learned gain times
/// a constant as its scale, reshaped back and convolved; the running statistics it
/// would update are computed and unread. The engine standardises the raw weight
/// every step: against the definition written out.
#[test]
fn a_standardized_convolution_from_onnx_computes_its_weights() {
    let (cin, cout, kernel, len) = (2usize, 2usize, 3usize, 4usize);
    let fan_in = cin * kernel;
    let (eps, factor) = (1e-5f32, 0.7f32);
    let w = values(cout * fan_in, 4);
    let gain = [1.5f32, -0.5];
    let bias = values(cout, 5);
    let attr = |name: &str, kind: AttributeType| AttributeProto {
        name: name.into(),
        r#type: kind as i32,
        ..Default::default()
    };
    let ints = |name: &str, v: &[i64]| AttributeProto {
        ints: v.to_vec(),
        ..attr(name, AttributeType::Ints)
    };
    let float = |name: &str, v: f32| AttributeProto {
        f: v,
        ..attr(name, AttributeType::Float)
    };
    let channel_mean = |x: &str, out: &str| {
        let axes = vec![ints("axes", &[0, 2]), int("keepdims", 0)];
        node("ReduceMean", &[x], out, axes)
    };
    let mut scale = floats("c", &[], &[factor]);
    scale.dims.clear();
    let mut bn = node(
        "BatchNormalization",
        &["wr", "g", "b0", "m", "v"],
        "ws",
        vec![int("training_mode", 1), float("epsilon", eps)],
    );
    bn.output.extend(["rm".to_string(), "rv".to_string()]);
    let graph = GraphProto {
        name: "std-conv".into(),
        input: vec![value_info("x", &format!("batch,{cin},{len}"))],
        output: vec![output("y")],
        initializer: vec![
            floats("conv.weight", &[cout as i64, cin as i64, kernel as i64], &w),
            floats("conv.gain", &[cout as i64, 1, 1], &gain),
            floats("conv.bias", &[cout as i64], &bias),
            floats("b0", &[cout as i64], &vec![0.0; cout]),
            scale,
            int64s("to_rows", &[1, cout as i64, -1]),
            int64s("flat", &[-1]),
        ],
        node: vec![
            node("Reshape", &["conv.weight", "to_rows"], "wr", vec![]),
            node("Mul", &["conv.gain", "c"], "gc", vec![]),
            node("Reshape", &["gc", "flat"], "g", vec![]),
            // The running statistics' inputs, as the exporter computes them.
            channel_mean("wr", "m"),
            node("Mul", &["wr", "wr"], "sq", vec![]),
            channel_mean("sq", "v"),
            bn,
            node("Shape", &["conv.weight"], "wshape", vec![]),
            node("Reshape", &["ws", "wshape"], "w2", vec![]),
            NodeProto {
                attribute: vec![ints("pads", &[1, 1])],
                ..node("Conv", &["x", "w2", "conv.bias"], "y", vec![])
            },
        ],
        ..Default::default()
    };
    let g = load("standardized_conv", graph);
    // The raw weight, the gain and the bias are the parameters.
    assert_eq!(g.param_count(), (cout * fan_in + 2 * cout) as u64);
    let mut std_w = vec![0.0f64; w.len()];
    for o in 0..cout {
        let row: Vec<f64> = w[o * fan_in..(o + 1) * fan_in]
            .iter()
            .map(|&v| f64::from(v))
            .collect();
        let mean = row.iter().sum::<f64>() / fan_in as f64;
        let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / fan_in as f64;
        let k = f64::from(gain[o]) * f64::from(factor) / (var + f64::from(eps)).sqrt();
        for (j, v) in row.iter().enumerate() {
            std_w[o * fan_in + j] = (v - mean) * k;
        }
    }
    let x = values(2 * cin * len, 6);
    let mut want = vec![0.0f64; 2 * cout * len];
    for s in 0..2 {
        for o in 0..cout {
            for t in 0..len {
                let mut acc = f64::from(bias[o]);
                for c in 0..cin {
                    for k in 0..kernel {
                        let Some(i) = (t + k).checked_sub(1).filter(|&i| i < len) else {
                            continue;
                        };
                        acc += f64::from(x[(s * cin + c) * len + i])
                            * std_w[(o * cin + c) * kernel + k];
                    }
                }
                want[(s * cout + o) * len + t] = acc;
            }
        }
    }
    let t = trainer(&g, 1, false);
    let b = batch(&x, 2, cout * len, &t.device);
    assert_close(&forward(&t, &b), &want, "standardized convolution");
}
