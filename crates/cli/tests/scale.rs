//! `batchfit plan --gpus`: memory per device under DDP, ZeRO and FSDP, the global-batch
//! table and the launch configurations, through the real binary (docs/scale.md).

mod common;

use common::{batchfit, document, json};
use predicates::str::contains;
use serde_json::Value;

/// The rows of `plan ARGS --json`'s distributed section.
fn rows(args: &[&str]) -> (u64, Vec<Value>) {
    let v = json(args);
    let params = v["parameters"].as_u64().unwrap();
    (params, v["distributed"]["rows"].as_array().unwrap().clone())
}

fn row<'a>(rows: &'a [Value], strategy: &str) -> &'a Value {
    rows.iter().find(|r| r["strategy"] == strategy).unwrap()
}

/// The issue's check: ZeRO-3 on 64 GPUs keeps 16 x parameters / 64 bytes of model states.
#[test]
fn zero3_on_64_gpus_keeps_a_64th_of_16_bytes_per_parameter() {
    let (p, rows) = rows(&[
        "plan",
        "zoo:rnn-tutorial",
        "--precision",
        "fp16-mixed",
        "--gpus",
        "64",
        "--strategy",
        "zero3",
    ]);
    assert_eq!(rows.len(), 1);
    let r = &rows[0];
    assert_eq!(r["world_size"], 64);
    assert_eq!(r["stage"], 3);
    let states = r["model_state_bytes"].as_u64().unwrap() as f64;
    let want = 16.0 * p as f64 / 64.0;
    assert!(
        (states - want).abs() / want < 0.01,
        "{states} vs 16 x {p} / 64 = {want}"
    );
}

/// Stage 1: 2 + 2 + 12/N, stage 2: 2 + (2 + 12)/N, DDP: 16 bytes per parameter per device.
#[test]
fn each_stage_shards_what_zero_says() {
    let (p, rows) = rows(&[
        "plan",
        "zoo:rnn-tutorial",
        "--precision",
        "fp16-mixed",
        "--gpus",
        "64",
        "--strategy",
        "ddp,zero1,zero2,zero3,fsdp",
    ]);
    let n = 64.0;
    let per_param =
        |s: &str| row(&rows, s)["model_state_bytes"].as_u64().unwrap() as f64 / p as f64;
    for (s, want) in [
        ("ddp", 16.0),
        ("zero1", 2.0 + 2.0 + 12.0 / n),
        ("zero2", 2.0 + (2.0 + 12.0) / n),
        ("zero3", 16.0 / n),
        ("fsdp", 16.0 / n),
    ] {
        let got = per_param(s);
        assert!((got - want).abs() / want < 0.01, "{s}: {got} vs {want}");
        let reported = row(&rows, s)["model_state_bytes_per_param"]
            .as_f64()
            .unwrap();
        assert!((reported - got).abs() < 1e-9);
    }
    // fp32 Adam: 4 + 4 + 8 under DDP, from the plan's own per-parameter facts.
    let (p, fp32) = self::rows(&[
        "plan",
        "zoo:rnn-tutorial",
        "--gpus",
        "4",
        "--strategy",
        "ddp",
    ]);
    assert_eq!(fp32[0]["model_state_bytes"].as_u64().unwrap(), 16 * p);
}

/// A budget gives the largest micro-batch per device; sharding more leaves room for more.
#[test]
fn a_budget_gives_micro_batches_and_the_global_batch() {
    let (_, rows) = rows(&[
        "plan",
        "zoo:rnn-tutorial",
        "--gpus",
        "8",
        "--device-preset",
        "gtx1060-6gb",
        "--global-batch",
        "2000",
    ]);
    assert_eq!(rows.len(), 5);
    let micro = |s: &str| row(&rows, s)["max_micro_batch"].as_u64().unwrap();
    assert!(micro("ddp") <= micro("zero1"));
    assert!(micro("zero1") <= micro("zero2"));
    for r in &rows {
        let (m, a, g) = (
            r["micro_batch"].as_u64().unwrap(),
            r["accumulation"].as_u64().unwrap(),
            r["global_batch"].as_u64().unwrap(),
        );
        assert!(m <= r["max_micro_batch"].as_u64().unwrap());
        assert_eq!(g, 8 * m * a);
        assert!(g >= 2000);
        assert!(r["peak_bytes"].as_u64().unwrap() <= 6 << 30);
    }
}

/// A step time and a link give communication and update times; one device communicates
/// nothing, two nodes are bounded by the link between them.
#[test]
fn step_time_and_links_give_update_times() {
    let v = json(&[
        "plan",
        "zoo:rnn-tutorial",
        "--gpus",
        "1,8",
        "--nodes",
        "2",
        "--link",
        "ib100",
        "--strategy",
        "ddp",
        "--micro-batch",
        "16",
        "--step-time",
        "0.5",
    ]);
    let d = &v["distributed"];
    assert_eq!(d["link"]["bytes_per_s"].as_f64().unwrap(), 12.5e9);
    let rows = d["rows"].as_array().unwrap();
    assert_eq!(rows[1]["world_size"], 16);
    for r in rows {
        let step = r["step_s"].as_f64().unwrap();
        let exposed = r["comm"]["exposed_s"].as_f64().unwrap();
        assert!((step - 0.5 - exposed).abs() < 1e-12);
        assert!(r["comm"]["seconds"].as_f64().unwrap() >= exposed);
    }
    // DDP moves 2 (W-1)/W of the gradients (fp32: 4 bytes a parameter).
    let p = v["parameters"].as_f64().unwrap();
    let moved = rows[1]["comm"]["bytes_per_device"].as_f64().unwrap();
    assert!((moved - 2.0 * 15.0 / 16.0 * 4.0 * p).abs() < 1.0);
}

#[test]
fn emit_deepspeed_writes_the_config() {
    let out = batchfit()
        .args([
            "plan",
            "zoo:rnn-tutorial",
            "--gpus",
            "8",
            "--strategy",
            "zero2",
            "--device-preset",
            "gtx1060-6gb",
            "--precision",
            "bf16-mixed",
            "--global-batch",
            "4096",
            "--emit",
            "deepspeed",
        ])
        .output()
        .unwrap();
    let c = document(out);
    let micro = c["train_micro_batch_size_per_gpu"].as_u64().unwrap();
    let acc = c["gradient_accumulation_steps"].as_u64().unwrap();
    assert_eq!(c["train_batch_size"].as_u64().unwrap(), 8 * micro * acc);
    assert_eq!(c["zero_optimization"]["stage"], 2);
    assert_eq!(c["bf16"]["enabled"], true);
    assert_eq!(c["fp16"]["enabled"], false);
}

#[test]
fn emit_torchrun_writes_the_launch_line() {
    batchfit()
        .args([
            "plan",
            "zoo:rnn-tutorial",
            "--gpus",
            "4",
            "--nodes",
            "2",
            "--strategy",
            "fsdp",
            "--micro-batch",
            "24",
            "--emit",
            "torchrun",
        ])
        .assert()
        .success()
        .stdout(contains("torchrun --nnodes 2 --nproc-per-node 4"))
        .stdout(contains("train.py --batch-size 24"));
}

/// Bad flags: a clear message and exit code 2.
#[test]
fn bad_distributed_flags_exit_2() {
    let cases: [(&[&str], &str); 5] = [
        (&["--strategy", "zero3"], "needs --gpus"),
        (&["--gpus", "8", "--emit", "torchrun"], "one --strategy"),
        (
            &[
                "--gpus",
                "8",
                "--strategy",
                "fsdp",
                "--micro-batch",
                "4",
                "--emit",
                "deepspeed",
            ],
            "no FSDP",
        ),
        (&["--gpus", "8", "--step-time", "0.1"], "--micro-batch"),
        (&["--gpus", "8", "--strategy", "zero4"], "zero4"),
    ];
    for (args, message) in cases {
        batchfit()
            .args(["plan", "zoo:mnist-mlp"])
            .args(args)
            .assert()
            .code(2)
            .stderr(contains(message));
    }
}

/// The terminal table names every strategy.
#[test]
fn the_table_prints() {
    batchfit()
        .args(["plan", "zoo:mnist-mlp", "--gpus", "2", "--memory", "1GiB"])
        .assert()
        .success()
        .stdout(contains("DATA PARALLEL"))
        .stdout(contains("zero3"))
        .stdout(contains("fsdp"));
}

/// Every key docs/json.md shows for the distributed section is in a real document.
#[test]
fn distributed_json_has_every_documented_key() {
    let doc = std::fs::read_to_string(
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/json.md"),
    )
    .unwrap();
    let section = doc
        .split("### `distributed` (with `--gpus`)")
        .nth(1)
        .expect("docs/json.md documents the distributed section");
    let block = section.split("```").nth(1).unwrap();
    let mut documented = std::collections::BTreeSet::new();
    let mut rest = block;
    while let Some(start) = rest.find('"') {
        let after = &rest[start + 1..];
        let Some(end) = after.find('"') else { break };
        let word = &after[..end];
        if after[end + 1..].trim_start().starts_with(':')
            && word.chars().all(|c| c.is_ascii_lowercase() || c == '_')
        {
            documented.insert(word.to_string());
        }
        rest = &after[end + 1..];
    }
    let v = json(&[
        "plan",
        "zoo:mnist-mlp",
        "--gpus",
        "8",
        "--memory",
        "1GiB",
        "--micro-batch",
        "16",
        "--step-time",
        "0.05",
        "--global-batch",
        "1024",
    ]);
    fn keys(v: &Value, into: &mut std::collections::BTreeSet<String>) {
        match v {
            Value::Object(m) => m.iter().for_each(|(k, x)| {
                into.insert(k.clone());
                keys(x, into);
            }),
            Value::Array(a) => a.iter().for_each(|x| keys(x, into)),
            _ => {}
        }
    }
    let mut present = std::collections::BTreeSet::new();
    keys(&v, &mut present);
    let missing: Vec<_> = documented.difference(&present).collect();
    assert!(missing.is_empty(), "missing {missing:?}");
    assert!(documented.contains("exposed_s"));
}
