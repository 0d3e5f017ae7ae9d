//! The wire format documented next to its emitter: every key `docs/json.md`
//! shows for a command appears in that command's real `--json` output.

mod common;

use common::{QUICK_ADVISE, json};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::PathBuf;

/// The code block under `## \`batchfit CMD --json\``.
fn documented_block(command: &str) -> String {
    let doc = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/json.md"),
    )
    .unwrap();
    let heading = format!("## `batchfit {command} --json`");
    let section = doc
        .split("\n## ")
        .find(|s| format!("## {s}").starts_with(&heading))
        .unwrap_or_else(|| panic!("docs/json.md has no section {heading}"));
    section
        .split("```")
        .nth(1)
        .unwrap_or_else(|| panic!("{heading} has no code block"))
        .to_string()
}

/// The keys (`"name":`) in `text`.
fn keys_in(text: &str) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    let mut rest = text;
    while let Some(start) = rest.find('"') {
        let after = &rest[start + 1..];
        let Some(end) = after.find('"') else { break };
        let word = &after[..end];
        let tail = after[end + 1..].trim_start();
        if tail.starts_with(':')
            && !word.is_empty()
            && word
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        {
            keys.insert(word.to_string());
        }
        rest = &after[end + 1..];
    }
    keys
}

/// The keys documented for `command`.
fn documented_keys(command: &str) -> BTreeSet<String> {
    let keys = keys_in(&documented_block(command));
    assert!(!keys.is_empty(), "{command}: no keys found");
    keys
}

/// Keys documented only inside the entries of a `"findings": [...]` array: what a
/// run finds depends on its measurements, so they can only be checked when the
/// output has a finding.
fn finding_only_keys(command: &str) -> BTreeSet<String> {
    let block = documented_block(command);
    let mut inside = String::new();
    let mut outside = block.clone();
    while let Some(at) = outside.find("\"findings\": [") {
        let open = at + "\"findings\": [".len();
        let close = outside[open..]
            .find(']')
            .map_or(outside.len(), |e| open + e);
        inside.push_str(&outside[open..close]);
        outside.replace_range(at..close, "");
    }
    let (inside, outside) = (keys_in(&inside), keys_in(&outside));
    inside.difference(&outside).cloned().collect()
}

/// Whether any `findings` array in `v` has an entry.
fn has_finding(v: &Value) -> bool {
    match v {
        Value::Object(m) => m.iter().any(|(k, x)| {
            (k == "findings" && x.as_array().is_some_and(|a| !a.is_empty())) || has_finding(x)
        }),
        Value::Array(a) => a.iter().any(has_finding),
        _ => false,
    }
}

/// Every object key anywhere in `v`.
fn keys_of(v: &Value, into: &mut BTreeSet<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                into.insert(k.clone());
                keys_of(x, into);
            }
        }
        Value::Array(a) => a.iter().for_each(|x| keys_of(x, into)),
        _ => {}
    }
}

fn check(command: &str, args: &[&str]) {
    let mut documented = documented_keys(command);
    let out = json(args);
    if !has_finding(&out) {
        documented = documented
            .difference(&finding_only_keys(command))
            .cloned()
            .collect();
    }
    let mut present = BTreeSet::new();
    keys_of(&out, &mut present);
    let missing: Vec<&String> = documented.difference(&present).collect();
    assert!(
        missing.is_empty(),
        "`batchfit {}` --json lacks keys docs/json.md documents: {missing:?}",
        args.join(" ")
    );
}

#[test]
fn plan_json_has_every_documented_key() {
    check(
        "plan",
        &["plan", "zoo:seed2-dual", "--device-preset", "gtx1060-6gb"],
    );
}

#[test]
fn probe_json_has_every_documented_key() {
    check(
        "probe",
        &[
            "probe",
            "--batches",
            "4,8",
            "--memory-limit",
            "64MiB",
            "--time-cap",
            "0.2",
            "--warmup",
            "1",
        ],
    );
}

#[test]
fn noise_json_has_every_documented_key() {
    check(
        "noise",
        &[
            "noise",
            "--steps",
            "20",
            "--ref-batch",
            "32",
            "--ref-lr",
            "1e-3",
        ],
    );
}

#[test]
fn sweep_json_has_every_documented_key() {
    check(
        "sweep",
        &[
            "sweep",
            "--seeds",
            "2",
            "--batches",
            "16,64",
            "--epochs",
            "2",
        ],
    );
}

#[test]
fn advise_json_has_every_documented_key() {
    check(
        "advise",
        &[
            "advise",
            "--gpus",
            "1,2,4",
            "--noise-steps",
            "60",
            "--batches",
            "8,32",
            "--time-cap",
            "0.2",
            "--warmup",
            "1",
        ],
    );
}

#[test]
fn schedule_json_has_every_documented_key() {
    check("schedule", &[&["schedule"], QUICK_ADVISE].concat());
}

#[cfg(unix)]
#[test]
fn run_json_has_every_documented_key() {
    let trainer = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/fake_trainer.sh")
        .display()
        .to_string();
    let documented = documented_keys("run");
    let out = common::batchfit()
        .args([
            "run",
            "--max-batch",
            "64",
            "--ref-lr",
            "0.001",
            "--json",
            "--",
            "sh",
            &trainer,
            "{batch}",
            "1",
            "--lr={lr}",
        ])
        .env("FAKE_OOM_ABOVE", "20")
        .env("FAKE_NOISE", "1")
        .output()
        .unwrap();
    let mut present = BTreeSet::new();
    keys_of(&common::document(out), &mut present);
    let missing: Vec<&String> = documented.difference(&present).collect();
    assert!(missing.is_empty(), "run --json lacks {missing:?}");
}

/// `run --verify`: every key its section documents, on a stand-in run checked
/// by two short trainings.
#[cfg(unix)]
#[test]
fn run_verify_json_has_every_documented_key() {
    let trainer = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/fake_trainer.sh")
        .display()
        .to_string();
    let dir = tempfile::tempdir().unwrap();
    let advice = dir.path().join("run.json");
    let tail = ["--", "sh", &trainer, "{batch}", "--lr={lr}"];
    let run = |flags: &[&str], steps: &str| {
        common::document(
            common::batchfit()
                .arg("run")
                .args(flags)
                .args(["--ref-lr", "0.001", "--json"])
                .args(tail)
                .env("FAKE_NOISE", "1")
                .env("FAKE_SCALED_LOSS", "1")
                .env("FAKE_STEPS", steps)
                .output()
                .unwrap(),
        )
    };
    std::fs::write(&advice, run(&["--batches", "128,256"], "40").to_string()).unwrap();
    let doc = run(
        &["--verify", advice.to_str().unwrap(), "--seeds", "1"],
        "200",
    );
    let mut present = BTreeSet::new();
    keys_of(&doc, &mut present);
    let documented = documented_keys("run --verify RUN.json");
    let missing: Vec<&String> = documented.difference(&present).collect();
    assert!(missing.is_empty(), "run --verify --json lacks {missing:?}");
}

/// Under a launcher too (the stand-in torchrun): the same keys, every rank listed.
#[cfg(unix)]
#[test]
fn run_json_under_a_launcher_has_every_documented_key() {
    let fixture = |name: &str| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name)
            .display()
            .to_string()
    };
    let documented = documented_keys("run");
    let out = common::batchfit()
        .args(["run", "--max-batch", "64", "--launcher", "torchrun"])
        .args(["--nproc-per-node", "2", "--launcher-cmd"])
        .arg(fixture("fake_launcher.sh"))
        .args(["--ref-lr", "0.001", "--json", "--", "sh"])
        .args([&fixture("fake_trainer.sh"), "{batch}", "1", "--lr={lr}"])
        .env("FAKE_OOM_ABOVE", "20")
        .env("FAKE_NOISE", "1")
        .env("FAKE_SLEEP", "0.2")
        .output()
        .unwrap();
    let mut present = BTreeSet::new();
    keys_of(&common::document(out), &mut present);
    let missing: Vec<&String> = documented.difference(&present).collect();
    assert!(
        missing.is_empty(),
        "run --launcher --json lacks {missing:?}"
    );
}

/// Only a finding's own keys are excused when a run finds nothing: `rule` also names
/// the learning-rate rule elsewhere in `advise`, so it is still required there.
#[test]
fn only_a_findings_own_keys_depend_on_the_measurements() {
    let excused: Vec<String> = finding_only_keys("advise").into_iter().collect();
    // `code`: the data findings' (`data_profile.findings`), which depend on the data.
    assert_eq!(excused, ["code", "message"]);
    assert!(finding_only_keys("plan").is_empty());
}
