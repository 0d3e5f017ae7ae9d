//! `batchfit noise` through the real binary: the noise scale on real and generated data.

use assert_cmd::Command;
use predicates::str::contains;
use std::io::Write;
use std::path::Path;

fn batchfit() -> Command {
    Command::cargo_bin("batchfit").unwrap()
}

fn json(args: &[&str]) -> serde_json::Value {
    let out = batchfit().args(args).arg("--json").output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

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
    // A model other than the default needs data.
    batchfit()
        .args(["noise", m])
        .assert()
        .code(2)
        .stderr(contains("--data"));
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
