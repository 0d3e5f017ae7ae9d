//! `batchfit noise` through the real binary: the noise scale on real and generated data.

mod common;

use common::{batchfit, document, json};
use predicates::prelude::PredicateBooleanExt;
use predicates::str::contains;
use std::io::Write;
use std::path::Path;

/// A minimal .npy writer (format version 1.0, little-endian f32, C order).
fn write_npy(path: &Path, shape: &[usize], values: &[f32]) {
    let shape_txt = match shape {
        [n] => format!("({n},)"),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape_txt}, }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(b"\x93NUMPY\x01\x00").unwrap();
    f.write_all(&(header.len() as u16).to_le_bytes()).unwrap();
    f.write_all(header.as_bytes()).unwrap();
    for v in values {
        f.write_all(&v.to_le_bytes()).unwrap();
    }
}

const TINY_CLASSIFIER: &str = "[[input]]\nname = \"x\"\nshape = [4]\n[[layer]]\nname = \"fc\"\nop = \"linear\"\nout_features = 3\n[loss]\nkind = \"cross_entropy\"\n";

#[test]
fn digits_noise_scale_grows_as_the_loss_falls() {
    let v = json(&["noise", "--steps", "240", "--seed", "1"]);
    let hist = v["history"].as_array().unwrap();
    let b = |r: &serde_json::Value| r["b_simple"].as_f64();
    let mean = |rs: &[serde_json::Value]| {
        let xs: Vec<f64> = rs.iter().filter_map(b).collect();
        xs.iter().sum::<f64>() / xs.len() as f64
    };
    let loss = |rs: &[serde_json::Value]| {
        rs.iter().map(|r| r["loss"].as_f64().unwrap()).sum::<f64>() / rs.len() as f64
    };
    // Early window skips the first steps, whose estimate rests on a few samples.
    let (early, late) = (&hist[20..60], &hist[200..240]);
    assert!(loss(late) < 0.5 * loss(early), "the run trains");
    assert!(
        mean(late) > 1.5 * mean(early),
        "B_simple {} -> {}",
        mean(early),
        mean(late)
    );
    assert!(v["critical_batch"].as_u64().unwrap() > 0);
    assert_eq!(v["predictions"].as_array().unwrap().len(), 11);
    // The data as read: the shipped digits, scaled to 0..1, three pixels never inked.
    let data = &v["data_profile"];
    assert_eq!(
        (data["rows"].as_u64(), data["features"].as_u64()),
        (Some(1797), Some(64))
    );
    assert_eq!(data["max_abs"].as_f64(), Some(1.0));
    let codes: Vec<&str> = data["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["code"].as_str().unwrap())
        .collect();
    assert_eq!(codes, ["constant_features"]);
}

#[test]
fn learning_rates_scale_with_the_rule_for_the_optimizer() {
    let v = json(&[
        "noise",
        "--steps",
        "20",
        "--ref-batch",
        "32",
        "--ref-lr",
        "0.001",
        "--batches",
        "32,128",
    ]);
    let lr = &v["lr_advice"];
    assert_eq!(lr["rule"], "sqrt");
    assert!((lr["per_batch"][1][1].as_f64().unwrap() - 0.002).abs() < 1e-12);
    let v = json(&[
        "noise",
        "--steps",
        "20",
        "--optimizer",
        "sgd",
        "--lr",
        "0.1",
        "--ref-batch",
        "32",
        "--ref-lr",
        "0.1",
        "--batches",
        "128",
    ]);
    assert_eq!(v["lr_advice"]["rule"], "linear");
    assert!((v["lr_advice"]["per_batch"][0][1].as_f64().unwrap() - 0.4).abs() < 1e-12);
}

#[test]
fn bad_data_exits_2_naming_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let d = |name: &str| dir.path().join(name);
    let model = d("tiny.toml");
    std::fs::write(&model, TINY_CLASSIFIER).unwrap();
    std::fs::write(d("fake.npz"), "this is not a zip archive").unwrap();
    std::fs::write(d("fake.npy"), "nor an array").unwrap();
    std::fs::write(d("wide.csv"), "1,2,3,4,5,0\n1,2,3,4,5,1\n").unwrap();
    std::fs::write(d("labels.csv"), "1,2,3,4,0\n1,2,3,4,7\n").unwrap();
    std::fs::write(d("nan.csv"), "1,2,3,4,0\n1,nan,3,4,1\n").unwrap();
    let names = "1,2,3,4,a\n1,2,3,4,b\n1,2,3,4,c\n1,2,3,4,d\n";
    std::fs::write(d("names.csv"), names).unwrap();
    let sex = "w,sex,h,l,species\n1,male,3,4,a\n1,female,3,4,b\n";
    std::fs::write(d("sex.csv"), sex).unwrap();
    let label_first = "label,p1,p2,p3,p4\n1,0,0,0,0\n2,0,0,0,0\n";
    std::fs::write(d("label-first.csv"), label_first).unwrap();
    std::fs::write(d("missing.csv"), "1,2,3,4,0\n1,?,3,4,1\n").unwrap();
    std::fs::write(d("from-one.csv"), "1,2,3,4,1\n1,2,3,4,3\n1,2,3,4,2\n").unwrap();
    let regression = "[[input]]\nname = \"x\"\nshape = [4]\n[[layer]]\nname = \"fc\"\nop = \"linear\"\nout_features = 1\n[loss]\nkind = \"mse\"\n";
    std::fs::write(d("reg.toml"), regression).unwrap();
    write_npy(&d("x.npy"), &[2, 5], &[0.0; 10]);
    write_npy(&d("y.npy"), &[2], &[0.0, 1.0]);
    write_npy(&d("x4.npy"), &[2, 4], &[0.0; 8]);
    let m = model.to_str().unwrap();
    let p = |n: &str| d(n).to_str().unwrap().to_string();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec![p("fake.npz")], "not a valid .npz"),
        (vec![p("fake.npy")], "not a valid .npy"),
        (vec![p("wide.csv")], "expected rows of shape [4]"),
        (vec![p("labels.csv")], "row 2: label 7 is not a class"),
        (vec![p("nan.csv")], "row 2: value NaN is not finite"),
        (vec![p("x.npy"), "--labels".into(), p("y.npy")], "found [5]"),
        (vec![p("x4.npy")], "no `target` array"),
        (
            vec![p("names.csv")],
            "the label column names 4 classes (a, b, c, d), the model predicts 3",
        ),
        (
            vec![p("label-first.csv")],
            "the header names column 1 `label`, but the label is read from the last column",
        ),
        (
            vec![p("label-first.csv"), "--label-col".into(), "kind".into()],
            "--label-col kind: the first row names no column so (it reads label, p1, p2, p3, p4)",
        ),
        (
            vec![p("from-one.csv")],
            "the labels run from 1 to 3: number the classes from 0 (subtract 1)",
        ),
        (
            vec![p("missing.csv")],
            "row 2, column 2: `?` marks a missing value",
        ),
        (
            vec![p("sex.csv")],
            "row 1 (line 2), column 2 (`sex`): `male` is not a number (a category: encode it",
        ),
    ];
    for (data, msg) in cases {
        let mut args = vec![
            "noise".to_string(),
            m.to_string(),
            "--steps".into(),
            "2".into(),
            "--data".into(),
        ];
        args.extend(data);
        batchfit()
            .args(&args)
            .assert()
            .code(2)
            .stderr(contains(msg));
    }
    // Class names for a model that predicts values.
    batchfit()
        .args([
            "noise",
            &p("reg.toml"),
            "--steps",
            "2",
            "--data",
            &p("names.csv"),
        ])
        .assert()
        .code(2)
        .stderr(contains(
            "holds class names (a, b, c, d), but the model's loss is not cross-entropy",
        ));
    // A model other than the default needs data.
    batchfit()
        .args(["noise", m])
        .assert()
        .code(2)
        .stderr(contains("--data"));
}

/// A label column of names (as UCI's iris ships, with a header): the classes
/// are numbered in sorted order, the report and the JSON name them.
#[test]
fn class_names_in_a_csv_are_the_classes() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.toml");
    std::fs::write(&model, TINY_CLASSIFIER).unwrap();
    let names = ["virginica", "setosa", "versicolor"];
    let rows: String = (0..192)
        .map(|i| {
            // setosa in 4 rows of 192: a rare class, named as such.
            let c = if i % 48 == 1 { 1 } else { [0, 2][i % 2] };
            let x = |k: usize| (c * 4 + k) as f64 * 0.1 + (i % 7) as f64 * 0.01;
            format!("{},{},{},{},{}\n", x(0), x(1), x(2), x(3), names[c])
        })
        .collect();
    let data = dir.path().join("iris.csv");
    std::fs::write(&data, format!("sl,sw,pl,pw,species\n{rows}")).unwrap();
    let args = [
        "noise",
        model.to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
        "--steps",
        "8",
    ];
    let v = json(&args);
    let profile = &v["data_profile"];
    assert_eq!(profile["rows"], 192);
    assert_eq!(
        profile["class_names"],
        serde_json::json!(["setosa", "versicolor", "virginica"])
    );
    // Counted by name: setosa 4, versicolor 92, virginica 96.
    assert_eq!(profile["targets"]["counts"], serde_json::json!([4, 92, 96]));
    let rare = &profile["findings"][0];
    assert_eq!(rare["code"], "rare_class");
    assert!(
        rare["message"]
            .as_str()
            .unwrap()
            .starts_with("class 0 (setosa) holds 2.1 %"),
        "{rare}"
    );
    batchfit().args(args).assert().success().stdout(contains(
        "classes named in the label column, numbered in sorted order: 0 setosa, 1 versicolor, 2 virginica",
    ));
}

#[test]
fn a_diverging_run_stops_and_names_the_step() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("reg.toml");
    std::fs::write(&model, "[[input]]\nname = \"x\"\nshape = [2]\n[[layer]]\nname = \"fc\"\nop = \"linear\"\nout_features = 1\n").unwrap();
    let data = dir.path().join("reg.csv");
    let rows: String = (0..64)
        .map(|i| format!("{},{},{}\n", i, 2 * i, 1000 * i))
        .collect();
    std::fs::write(&data, rows).unwrap();
    batchfit()
        .args([
            "noise",
            model.to_str().unwrap(),
            "--data",
            data.to_str().unwrap(),
        ])
        .args([
            "--optimizer",
            "sgd",
            "--lr",
            "10",
            "--steps",
            "50",
            "--b-small",
            "4",
            "--k",
            "4",
        ])
        .assert()
        .code(2)
        .stderr(contains("the loss became"))
        .stderr(contains("at step"));
}

/// Deterministic N(0, 1) draws (splitmix64 + Box-Muller), so the test needs no RNG crate.
struct Normal(u64);

impl Normal {
    fn uniform(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }

    fn next(&mut self) -> f64 {
        let (u, v) = (self.uniform().max(1e-300), self.uniform());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
}

/// An ONNX model `y = x W^T` (Gemm, transB = 1, no bias) whose weight is all zeros.
fn zero_linear_onnx(path: &Path, d: usize) {
    use batchfit_graph::onnx::proto::tensor_shape_proto::{Dimension, dimension};
    use batchfit_graph::onnx::proto::{
        AttributeProto, AttributeType, DataType, GraphProto, Message, ModelProto, NodeProto,
        OperatorSetIdProto, TensorProto, TensorShapeProto, TypeProto, ValueInfoProto, type_proto,
    };
    let info = |name: &str, dims: Vec<dimension::Value>| ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: DataType::Float as i32,
                shape: Some(TensorShapeProto {
                    dim: dims
                        .into_iter()
                        .map(|v| Dimension {
                            value: Some(v),
                            ..Default::default()
                        })
                        .collect(),
                }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    };
    let graph = GraphProto {
        name: "linreg".into(),
        input: vec![info(
            "x",
            vec![
                dimension::Value::DimParam("batch".into()),
                dimension::Value::DimValue(d as i64),
            ],
        )],
        output: vec![info(
            "y",
            vec![
                dimension::Value::DimParam("batch".into()),
                dimension::Value::DimValue(1),
            ],
        )],
        initializer: vec![TensorProto {
            name: "w".into(),
            dims: vec![1, d as i64],
            data_type: DataType::Float as i32,
            raw_data: vec![0; 4 * d],
            ..Default::default()
        }],
        node: vec![NodeProto {
            op_type: "Gemm".into(),
            name: "fc".into(),
            input: vec!["x".into(), "w".into()],
            output: vec!["y".into()],
            attribute: vec![AttributeProto {
                name: "transB".into(),
                i: 1,
                r#type: AttributeType::Int as i32,
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
    };
    let model = ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 17,
        }],
        graph: Some(graph),
        ..Default::default()
    };
    std::fs::write(path, model.encode_to_vec()).unwrap();
}

/// Linear regression without bias, y = w*.x + e, x ~ N(0, I_d), e ~ N(0, s^2), at
/// w = 0: per-sample gradients -2 x y have |G|^2 = 4|w*|^2 and
/// tr(Sigma) = 4((d + 1)|w*|^2 + d s^2), so B_simple = (d + 1) + d s^2 / |w*|^2,
/// 201 for d = 100, |w*| = 1, s = 1.
#[test]
fn noise_scale_of_linear_regression_at_zero_is_201() {
    let (d, n) = (100usize, 16384usize);
    let mut rng = Normal(42);
    let w: Vec<f64> = {
        let raw: Vec<f64> = (0..d).map(|_| rng.next()).collect();
        let norm = raw.iter().map(|v| v * v).sum::<f64>().sqrt();
        raw.iter().map(|v| v / norm).collect()
    };
    let mut x = Vec::with_capacity(n * d);
    let mut y = Vec::with_capacity(n);
    for _ in 0..n {
        let row: Vec<f64> = (0..d).map(|_| rng.next()).collect();
        y.push((row.iter().zip(&w).map(|(a, b)| a * b).sum::<f64>() + rng.next()) as f32);
        x.extend(row.into_iter().map(|v| v as f32));
    }
    let dir = tempfile::tempdir().unwrap();
    let (model, xs, ys) = (
        dir.path().join("linreg.onnx"),
        dir.path().join("x.npy"),
        dir.path().join("y.npy"),
    );
    zero_linear_onnx(&model, d);
    write_npy(&xs, &[n, d], &x);
    write_npy(&ys, &[n, 1], &y);
    let v = json(&[
        "noise",
        model.to_str().unwrap(),
        "--data",
        xs.to_str().unwrap(),
        "--labels",
        ys.to_str().unwrap(),
        "--loss",
        "mse",
        "--lr",
        "0",
        "--steps",
        "400",
        "--b-small",
        "32",
        "--k",
        "8",
    ]);
    let b = v["b_simple"].as_f64().unwrap();
    eprintln!("linear regression at w = 0: B_simple = {b:.1} (exact: 201)");
    assert!(
        (b - 201.0).abs() < 20.1,
        "B_simple = {b}, expected 201 within 10 %"
    );
    assert!(
        v["b_simple_low"].as_f64().unwrap() < 201.0
            && 201.0 < v["b_simple_high"].as_f64().unwrap_or(f64::INFINITY)
    );
}

/// A 1x1 convolution labelling each pixel of a 3x4x4 image with one of 3 classes.
const TINY_SEGMENTER: &str = "[[input]]\nname = \"x\"\nshape = [3, 4, 4]\n[[layer]]\nname = \"logits\"\nop = \"conv2d\"\nout_channels = 3\nkernel = 1\n";

#[test]
fn a_segmentation_trains_on_per_pixel_labels_with_loss_ce() {
    let dir = tempfile::tempdir().unwrap();
    let d = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    std::fs::write(d("seg.toml"), TINY_SEGMENTER).unwrap();
    // 32 images whose pixel class is the channel with the largest value.
    let (n, pixels) = (32, 16);
    let mut x = Vec::with_capacity(n * 3 * pixels);
    let mut y = Vec::with_capacity(n * pixels);
    for i in 0..n {
        let class = |p: usize| (i + p) % 3;
        for c in 0..3 {
            x.extend((0..pixels).map(|p| if class(p) == c { 1.0 } else { -1.0 }));
        }
        y.extend((0..pixels).map(|p| class(p) as f32));
    }
    write_npy(Path::new(&d("x.npy")), &[n, 3, 4, 4], &x);
    write_npy(Path::new(&d("y.npy")), &[n, 4, 4], &y);
    let args = |extra: &[&str]| {
        let mut a: Vec<String> = ["noise", &d("seg.toml"), "--steps", "6", "--b-small", "4"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        a.extend(["--data", &d("x.npy"), "--labels", &d("y.npy")].map(String::from));
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    // By its shape the output is an image to regress: a mask of 16 labels is not its target.
    batchfit()
        .args(args(&[]))
        .assert()
        .code(2)
        .stderr(contains("48 values per row"));
    // Asked for, the classes are the first axis and every pixel has a label.
    let v = document(
        batchfit()
            .args(args(&["--loss", "ce", "--json"]))
            .output()
            .unwrap(),
    );
    let first = v["history"][0]["loss"].as_f64().unwrap();
    assert!(
        (first - 3f64.ln()).abs() < 1.0,
        "a cross-entropy over 3 classes starts near ln 3, got {first}"
    );
}

#[test]
fn a_ctc_model_trains_on_padded_label_sequences() {
    let dir = tempfile::tempdir().unwrap();
    let d = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    // Twelve frames of 4 features to 5 classes a frame, blank 4 (Keras's last).
    std::fs::write(
        d("speech.toml"),
        "[[input]]\nname = \"x\"\nshape = [12, 4]\n[[layer]]\nname = \"fc\"\n\
         op = \"linear\"\nout_features = 5\n",
    )
    .unwrap();
    let n = 32;
    let x: Vec<f32> = (0..n * 48).map(|i| ((i * 7) % 11) as f32 / 11.0).collect();
    // One to three labels a row, padded with -1.
    let y: Vec<f32> = (0..n)
        .flat_map(|r| {
            let len = 1 + r % 3;
            (0..3).map(move |k| if k < len { ((r + k) % 4) as f32 } else { -1.0 })
        })
        .collect();
    write_npy(Path::new(&d("x.npy")), &[n, 12, 4], &x);
    write_npy(Path::new(&d("y.npy")), &[n, 3], &y);
    let (model, x, y) = (d("speech.toml"), d("x.npy"), d("y.npy"));
    let noise = |extra: &[&str]| {
        let mut a = vec!["noise", &model, "--steps", "6", "--b-small", "4"];
        a.extend(["--data", &x, "--labels", &y]);
        a.extend(extra);
        a.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    let v = document(
        batchfit()
            .args(noise(&["--loss", "ctc", "--blank", "4", "--json"]))
            .output()
            .unwrap(),
    );
    assert!(v["history"][0]["loss"].as_f64().unwrap().is_finite());
    assert_eq!(v["data_profile"]["targets"]["kind"], "labels");
    assert_eq!(v["data_profile"]["targets"]["blank"], 4);
    // With the blank at 0 (the default), the labels 0 in the rows are refused.
    batchfit()
        .args(noise(&["--loss", "ctc"]))
        .assert()
        .code(2)
        .stderr(contains("is the blank"));
}

/// Input that would reach a training only to panic there is refused first,
/// with exit 2 naming what is wrong: a loss that depends on no trainable
/// parameter, a drop probability out of range, a duration no timer holds.
#[test]
fn untrainable_models_and_flags_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let d = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let no_weights = "[[input]]\nname = \"x\"\nshape = [1]\n[[layer]]\nname = \"r\"\nop = \"relu\"\n[loss]\nkind = \"mse\"\n";
    std::fs::write(d("none.toml"), no_weights).unwrap();
    let rows: String = (0..50)
        .map(|i| format!("{},{}\n", i as f64 / 10.0, i as f64 / 5.0))
        .collect();
    std::fs::write(d("p.csv"), format!("a,y\n{rows}")).unwrap();
    let drop_path = TINY_CLASSIFIER.replace(
        "[loss]",
        "[[layer]]\nname = \"d\"\nop = \"drop_path\"\np = 2.0\n[loss]",
    );
    std::fs::write(d("dp.toml"), drop_path).unwrap();
    std::fs::write(d("tiny.toml"), TINY_CLASSIFIER).unwrap();
    let four: String = (0..60).map(|i| format!("{i},1,2,3,{}\n", i % 3)).collect();
    std::fs::write(d("c.csv"), format!("a,b,c,d,y\n{four}")).unwrap();
    let small = ["--steps", "5", "--b-small", "4", "--k", "2"];
    batchfit()
        .args(["noise", &d("none.toml"), "--data", &d("p.csv")])
        .args(small)
        .assert()
        .code(2)
        .stderr(contains("none.toml").and(contains("no trainable parameter")));
    batchfit()
        .args(["noise", &d("dp.toml"), "--data", &d("c.csv")])
        .args(small)
        .assert()
        .code(2)
        .stderr(contains("node `d`").and(contains("drop probability")));
    // A flag the data cannot use is refused, not ignored.
    batchfit()
        .args([
            "noise",
            &d("tiny.toml"),
            "--data",
            &d("c.csv"),
            "--labels",
            &d("p.csv"),
        ])
        .args(small)
        .assert()
        .code(2)
        .stderr(contains("--labels"));
    batchfit()
        .args(["noise", "--beta", "NaN"])
        .assert()
        .code(2)
        .stderr(contains("--beta"));
    batchfit()
        .args(["probe", "--batches", "8", "--timeout", "1e30"])
        .assert()
        .code(2)
        .stderr(contains("--timeout"));
    // A report in the data's place: refused before any work, the data kept.
    let data = std::fs::read_to_string(d("c.csv")).unwrap();
    batchfit()
        .args([
            "sweep",
            &d("tiny.toml"),
            "--data",
            &d("c.csv"),
            "--html",
            &d("c.csv"),
        ])
        .args([
            "--batches",
            "8",
            "--seeds",
            "1",
            "--epochs",
            "1",
            "--no-noise",
        ])
        .assert()
        .code(2)
        .stderr(contains("--html").and(contains("not an HTML report")));
    assert_eq!(std::fs::read_to_string(d("c.csv")).unwrap(), data);
}
