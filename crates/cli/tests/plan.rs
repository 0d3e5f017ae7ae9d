//! `batchfit plan` driven as a user would, through the real binary.

mod common;

use common::{batchfit, json};
use predicates::str::contains;

#[test]
fn default_model_plans_without_arguments() {
    batchfit()
        .arg("plan")
        .assert()
        .success()
        .stdout(contains("digits-mlp"))
        .stdout(contains("gtx1060-6gb"))
        .stdout(contains("memory(B) ="));
}

#[test]
fn json_has_the_documented_fields() {
    let v = json(&["plan", "zoo:seed2-dual", "--memory", "6GiB"]);
    assert_eq!(v["parameters"], 87_229);
    assert_eq!(v["kind"], "plan");
    let fixed = v["memory"]["fixed_bytes"].as_u64().unwrap();
    let per = v["memory"]["per_sample_bytes"].as_u64().unwrap();
    let max = v["max_batch"].as_u64().unwrap();
    assert!(fixed + per * max <= 6 << 30);
    assert!(fixed + per * (max + 1) > 6 << 30);
    assert_eq!(v["layers"].as_array().unwrap().len(), 12);
    assert_eq!(v["layers"][0]["name"], "conv");
}

#[test]
fn a_budget_too_small_for_one_sample_gives_null() {
    let v = json(&["plan", "zoo:rnn-tutorial", "--memory", "1MiB"]);
    assert!(v["max_batch"].is_null());
}

#[test]
fn the_toml_spec_plans_like_the_zoo_model() {
    let spec = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/seed2-dual.toml"
    );
    let a = json(&["plan", spec, "--memory", "4GiB"]);
    let b = json(&["plan", "zoo:seed2-dual", "--memory", "4GiB"]);
    assert_eq!(a["memory"], b["memory"]);
    assert_eq!(a["max_batch"], b["max_batch"]);
}

#[test]
fn bad_input_exits_2_with_one_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let bad_toml = dir.path().join("bad.toml");
    std::fs::write(
        &bad_toml,
        "[[input]]\nname = \"x\"\nshape = [8]\n[[layer]]\nname = \"a\"\nop = \"linear\"\nout_features = 4\n[[layer]]\nname = \"b\"\nop = \"add\"\ninputs = [\"a\", \"x\"]\n",
    )
    .unwrap();
    let bad_toml = bad_toml.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["plan", "zoo:nope"], "unknown zoo model `nope`"),
        (&["plan", bad_toml], "node `b`"),
        (&["plan", "model.h5"], "not a model"),
        (&["plan", "--memory", "0"], "positive size"),
        (&["plan", "--memory=-2GiB"], "--memory"),
        (
            &["plan", "--device-preset", "gtx9999"],
            "unknown device preset `gtx9999`",
        ),
        (&["plan", "--optimizer", "lion"], "lion"),
        (&["plan", "--micro-batch", "0"], "positive integer"),
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
fn missing_file_is_named() {
    batchfit()
        .args(["plan", "/nonexistent/model.onnx"])
        .assert()
        .code(2)
        .stderr(contains("/nonexistent/model.onnx"));
}

#[test]
fn loss_flags_read_the_output_by_its_layout_and_refuse_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("speech.toml");
    // A 1-d convolution to [B, 29, 50]: 29 classes first, 50 frames.
    std::fs::write(
        &model,
        "[[input]]\nname = \"x\"\nshape = [8, 50]\n[[layer]]\nname = \"logits\"\n\
         op = \"conv1d\"\nout_channels = 29\nkernel = 1\n",
    )
    .unwrap();
    let m = model.to_str().unwrap();
    let plan = |extra: &[&str]| {
        let mut args = vec!["plan", m, "--memory", "1GiB"];
        args.extend(extra);
        json(&args)
    };
    // Without a loss, by the layout (docs/model-spec.md), as for an ONNX
    // export: [B, 29, 50] reads as 29 frames of 50 classes, which --loss and
    // --class-axis correct.
    assert_eq!(plan(&[])["loss"]["kind"], "cross_entropy_per_frame");
    let ctc = plan(&["--loss", "ctc", "--class-axis", "1", "--blank", "28"]);
    assert_eq!(ctc["loss"]["kind"], "ctc");
    assert_eq!(ctc["loss"]["blank"], 28);
    // Refused, with exit code 2: the batch as the class axis, a blank of another
    // loss, a loss the output cannot feed.
    for (extra, says) in [
        (&["--loss", "ce", "--class-axis", "0"][..], "`logits`"),
        (&["--loss", "ce", "--blank", "3"][..], "--blank"),
        (
            &["--loss", "ctc", "--class-axis", "1", "--blank", "29"][..],
            "blank 29",
        ),
        (&["--class-axis", "1"][..], "--loss"),
    ] {
        batchfit()
            .args(["plan", m])
            .args(extra)
            .assert()
            .code(2)
            .stderr(contains(says));
    }
}
