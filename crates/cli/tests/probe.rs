//! `batchfit probe` through the real binary, on models and limits small enough for CI.

mod common;

use common::{batchfit, json};
use predicates::str::contains;

const FAST: &[&str] = &["--time-cap", "0.2", "--warmup", "1"];

#[test]
fn probe_prints_a_row_per_batch_with_measured_and_planned_memory() {
    let mut args = vec!["probe", "zoo:seed2-dual", "--batches", "4,16"];
    args.extend(FAST);
    let v = json(&args);
    let pts = v["devices"][0]["points"].as_array().unwrap();
    assert_eq!(pts.len(), 2);
    for p in pts {
        assert!(p["step_time_s"].as_f64().unwrap() > 0.0);
        assert!(p["samples_per_s"].as_f64().unwrap() > 0.0);
        assert!(
            p["peak_bytes"].as_u64().unwrap() > 0,
            "the counting allocator saw the step"
        );
        assert!(p["planned_bytes"].as_u64().unwrap() > 0);
    }
    assert!(v["devices"][0]["knee_batch"].is_u64());
}

#[test]
fn out_of_memory_is_a_result_and_the_run_goes_on() {
    let mut args = vec![
        "probe",
        "zoo:mnist-mlp",
        "--batches",
        "8,200000,16",
        "--memory-limit",
        "48MiB",
    ];
    args.extend(FAST);
    let v = json(&args);
    let d = &v["devices"][0];
    let pts = d["points"].as_array().unwrap();
    let at = |b: u64| pts.iter().find(|p| p["batch"] == b).unwrap();
    assert!(at(8)["failure"].is_null());
    assert!(at(16)["failure"].is_null(), "measured after the failure");
    assert!(
        at(200000)["failure"]
            .as_str()
            .unwrap()
            .contains("out of memory")
    );
}

#[test]
fn search_finds_a_batch_that_fits_whose_next_size_up_does_not() {
    let mut args = vec![
        "probe",
        "zoo:mnist-mlp",
        "--batches",
        "8",
        "--memory-limit",
        "64MiB",
    ];
    args.extend(FAST);
    let v = json(&args);
    let d = &v["devices"][0];
    let max = d["max_batch"].as_u64().unwrap();
    let trials = d["search"]["trials"].as_array().unwrap();
    assert_eq!(d["search_trials"].as_u64().unwrap() as usize, trials.len());
    assert!(
        trials.len() <= 8,
        "predicted, not doubled: {} trials",
        trials.len()
    );
    // Check both sides independently, in fresh runs.
    let up = ((max as f64) * 1.1).ceil() as u64;
    let mut args = vec![
        "probe".to_string(),
        "zoo:mnist-mlp".into(),
        "--memory-limit".into(),
        "64MiB".into(),
    ];
    args.extend(["--batches".into(), format!("{max},{up}")]);
    args.extend(FAST.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // --batches with a limit still runs the search; the rows are what we check.
    let v = json(&args);
    let pts = v["devices"][0]["points"].as_array().unwrap();
    assert!(pts[0]["failure"].is_null(), "batch {max} fits");
    assert!(
        pts[1]["failure"]
            .as_str()
            .unwrap()
            .contains("out of memory"),
        "batch {up} does not"
    );
}

#[test]
fn bad_input_exits_2_and_says_what_to_do() {
    let cases: &[(&[&str], &str)] = &[
        (&["probe", "--batches", "0"], "positive integer"),
        (
            &["probe", "zoo:mnist-cnn", "--memory-limit", "1MiB"],
            "below the model's fixed memory",
        ),
        (&["probe", "--device", "tpu"], "unknown device `tpu`"),
        (&["probe", "--device", "cuda:0"], "--features cuda"),
        (&["probe", "--efficiency", "1.5"], "share"),
        (&["probe", "--min-time", "0"], "positive number of seconds"),
    ];
    for (args, msg) in cases {
        batchfit()
            .args(*args)
            .assert()
            .code(2)
            .stderr(contains(*msg));
    }
}

#[test]
fn each_worker_trains_the_loss_asked_for() {
    // Wav2Letter's raw [B, C, T] logits under CTC: the workers load the model
    // again and must read it as the parent did (classes first, blank 28). burn's
    // CTC keeps [T, 2T/4 + 1] tables per sample, so a worker that trained MSE
    // instead would peak far lower.
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("speech.toml");
    std::fs::write(
        &model,
        "[[input]]\nname = \"x\"\nshape = [8, 400]\n[[layer]]\nname = \"logits\"\n\
         op = \"conv1d\"\nout_channels = 29\nkernel = 1\n",
    )
    .unwrap();
    let peak = |loss: &[&str]| {
        let mut args = vec!["probe", model.to_str().unwrap(), "--batches", "4"];
        args.extend(loss);
        args.extend(FAST);
        let v = json(&args);
        let p = &v["devices"][0]["points"][0];
        assert!(p["failure"].is_null(), "{p}");
        (
            p["peak_bytes"].as_f64().unwrap(),
            p["planned_bytes"].as_f64().unwrap(),
        )
    };
    let (mse, mse_planned) = peak(&[]);
    let (ctc, ctc_planned) = peak(&["--loss", "ctc", "--class-axis", "1", "--blank", "28"]);
    assert!(ctc > 4.0 * mse, "CTC peaked at {ctc} bytes, MSE at {mse}");
    // The plan counts CTC's tables at the output's 400 frames too: its rise
    // from MSE to CTC is at least half the measured one (both plans hold the same
    // host-dependent packing buffers, threads x L2, so a ratio would not do).
    assert!(
        ctc_planned - mse_planned > 0.5 * (ctc - mse),
        "planned {ctc_planned} vs {mse_planned}, measured {ctc} vs {mse}"
    );
}
