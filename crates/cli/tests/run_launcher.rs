//! `batchfit run --launcher` against a stand-in torchrun
//! (tests/fixtures/fake_launcher.sh: N copies with RANK, LOCAL_RANK, ... set,
//! each in a session of its own, as torchrun starts them) running the
//! stand-in trainer, which reports its steps with its rank.

mod common;

use common::{batchfit, document, fixture};
use serde_json::Value;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `batchfit run --launcher torchrun --nproc-per-node N --launcher-cmd STAND-IN FLAGS
/// --json -- sh fake_trainer.sh {batch}` with `env`; the parsed document.
fn run_json(n: u32, flags: &[&str], env: &[(&str, &str)]) -> Value {
    document(
        batchfit()
            .args(["run", "--launcher", "torchrun", "--nproc-per-node"])
            .arg(n.to_string())
            .arg("--launcher-cmd")
            .arg(fixture("fake_launcher.sh"))
            .args(flags)
            .args(["--json", "--", "sh", &fixture("fake_trainer.sh"), "{batch}"])
            .envs(env.iter().copied())
            .output()
            .unwrap(),
    )
}

fn trial(doc: &Value, batch: u64) -> &Value {
    doc["trials"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|t| t["batch"] == batch)
        .unwrap_or_else(|| panic!("no trial at {batch}: {doc}"))
}

#[test]
fn every_rank_is_measured_and_the_slowest_sets_the_step() {
    let doc = run_json(
        3,
        &["--batches", "8,64"],
        &[("FAKE_SLOW_RANK", "1"), ("FAKE_SLEEP", "0.4")],
    );
    assert_eq!(doc["world_size"], 3);
    let launched = doc["launch_command"].as_str().unwrap();
    assert!(
        launched.contains("fake_launcher.sh --nproc-per-node 3 --no-python sh ")
            && launched.ends_with("fake_trainer.sh {batch}"),
        "{launched}"
    );
    for b in [8u64, 64] {
        let t = trial(&doc, b);
        assert_eq!(t["outcome"], "ran", "{t}");
        let ranks = t["ranks"].as_array().unwrap();
        let ids: Vec<u64> = ranks.iter().map(|r| r["rank"].as_u64().unwrap()).collect();
        assert_eq!(ids, [0, 1, 2], "{t}");
        let fast = (2000.0 + 10.0 * b as f64) * 1e-6;
        for r in ranks {
            assert_eq!(r["steps"], 8, "{r}");
            assert!(r["peak_host_bytes"].as_u64().unwrap() > 0, "{r}");
            let own = if r["rank"] == 1 { 3.0 * fast } else { fast };
            assert!(
                (r["median_step_s"].as_f64().unwrap() - own).abs() < 1e-12,
                "{r}"
            );
        }
        // The slowest rank's step; every rank's micro-batch in the throughput.
        let median = t["steps"]["step_time"]["median"].as_f64().unwrap();
        assert!((median - 3.0 * fast).abs() < 1e-12, "{t}");
        let rate = t["steps"]["samples_per_s"].as_f64().unwrap();
        assert!(
            (rate - 3.0 * b as f64 / (3.0 * fast)).abs() < 1e-6 * rate,
            "{t}"
        );
        // The tree holds the ranks (and the launcher): at least their sum.
        let sum: u64 = ranks
            .iter()
            .map(|r| r["peak_host_bytes"].as_u64().unwrap())
            .sum();
        assert!(t["peak_host_bytes"].as_u64().unwrap() >= sum / 2, "{t}");
    }
}

#[test]
fn out_of_memory_on_one_rank_is_the_trials_and_the_search_stays_exact() {
    let doc = run_json(2, &[], &[("FAKE_OOM_RANK", "1"), ("FAKE_OOM_ABOVE", "100")]);
    assert_eq!(doc["max_batch"], 100);
    assert_eq!(doc["smallest_failure"], 101);
    let t = trial(&doc, 101);
    assert_eq!(t["outcome"], "out_of_memory", "{t}");
    // The stand-in's summary pushed the rank's message out of the kept tail.
    assert!(
        t["detail"].as_str().unwrap().contains("out of memory"),
        "{t}"
    );
    assert_eq!(trial(&doc, 100)["outcome"], "ran");
}

#[test]
fn a_crash_of_one_rank_is_a_crash() {
    let doc = run_json(2, &[], &[("FAKE_CRASH_RANK", "1"), ("FAKE_CRASH_AT", "8")]);
    let t = trial(&doc, 8);
    assert_eq!(t["outcome"], "crashed", "{t}");
    let detail = t["detail"].as_str().unwrap();
    assert!(
        detail.contains("exit status 1") && detail.contains("rank      : 1"),
        "{detail}"
    );
    assert_eq!(doc["stopped_at"], 8);
    assert_eq!(doc["max_batch"], 4);
    assert!(doc["smallest_failure"].is_null());
}

#[test]
fn the_table_shows_the_slowest_rank_and_the_largest_rank_peak() {
    let out = batchfit()
        .args(["run", "--batches", "8", "--launcher", "torchrun"])
        .args(["--nproc-per-node", "2", "--launcher-cmd"])
        .arg(fixture("fake_launcher.sh"))
        .args(["--", "sh", &fixture("fake_trainer.sh"), "{batch}"])
        .env("FAKE_SLEEP", "0.3")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    for want in [
        "--nproc-per-node 2 --no-python sh",
        "world size 2",
        "step (slowest rank)",
        "max rank host",
    ] {
        assert!(text.contains(want), "{want}: {text}");
    }
}

#[test]
fn ranks_in_their_own_sessions_are_ended_at_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pids");
    let started = Instant::now();
    let doc = run_json(
        2,
        &["--batches", "2", "--timeout", "1s"],
        &[
            ("FAKE_HANG_AT", "1"),
            ("FAKE_PIDS", pid_file.to_str().unwrap()),
        ],
    );
    assert!(started.elapsed() < Duration::from_secs(30));
    assert_eq!(trial(&doc, 2)["outcome"], "timed_out");
    let pids: Vec<u32> = std::fs::read_to_string(&pid_file)
        .unwrap()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    assert_eq!(pids.len(), 4, "{pids:?}"); // two ranks and their children
    let alive = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| !s[s.rfind(')').unwrap() + 2..].starts_with('Z'))
    };
    let waited = Instant::now();
    while pids.iter().any(|&p| alive(p)) && waited.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(pids.iter().all(|&p| !alive(p)), "left running: {pids:?}");
}

#[test]
fn on_the_second_node_the_ranks_are_its_own_and_the_world_counts_both() {
    let doc = run_json(
        2,
        &[
            "--batches",
            "16",
            "--nnodes",
            "2",
            "--node-rank",
            "1",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            "29600",
        ],
        &[("FAKE_SLEEP", "0.3")],
    );
    assert_eq!(doc["world_size"], 4);
    assert!(
        doc["launch_command"].as_str().unwrap().contains(
            "--nproc-per-node 2 --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 --master-port 29600 --no-python"
        ),
        "{doc}"
    );
    let t = trial(&doc, 16);
    let ids: Vec<u64> = t["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["rank"].as_u64().unwrap())
        .collect();
    assert_eq!(ids, [2, 3], "{t}");
    // Four ranks of 16 samples per step, though only two are on this node.
    let step = (2000.0 + 10.0 * 16.0) * 1e-6;
    let rate = t["steps"]["samples_per_s"].as_f64().unwrap();
    assert!((rate - 64.0 / step).abs() < 1e-6 * rate, "{t}");
}

#[test]
fn interrupting_ends_every_rank() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pids");
    let mut child = Command::new(env!("CARGO_BIN_EXE_batchfit"))
        .args(["run", "--launcher", "torchrun", "--nproc-per-node", "2"])
        .arg("--launcher-cmd")
        .arg(fixture("fake_launcher.sh"))
        .args(["--", "sh", &fixture("fake_trainer.sh"), "{batch}"])
        .env("FAKE_HANG_AT", "1")
        .env("FAKE_PIDS", &pid_file)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pids = || -> Vec<u32> {
        std::fs::read_to_string(&pid_file)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    };
    let waited = Instant::now();
    // Both ranks and their children started, and a sample has seen them.
    while pids().len() < 4 {
        assert!(
            waited.elapsed() < Duration::from_secs(60),
            "ranks never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: signals the batchfit process this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    assert_eq!(child.wait().unwrap().code(), Some(130));
    let alive = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| !s[s.rfind(')').unwrap() + 2..].starts_with('Z'))
    };
    let p = pids();
    let waited = Instant::now();
    while p.iter().any(|&pid| alive(pid)) && waited.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(p.iter().all(|&pid| !alive(pid)), "left running: {p:?}");
}

#[test]
fn bad_launcher_flags_are_refused_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pids");
    let launcher = fixture("fake_launcher.sh");
    let trainer = fixture("fake_trainer.sh");
    let cases: &[(&[&str], &str)] = &[
        (&["--nproc-per-node", "2"], "--launcher"),
        (&["--launcher", "torchrun"], "--nproc-per-node"),
        (&["--launcher", "mpirun", "--nproc-per-node", "2"], "mpirun"),
        (&["--launcher", "torchrun", "--nproc-per-node", "0"], "0"),
        (
            &[
                "--launcher",
                "torchrun",
                "--nproc-per-node",
                "2",
                "--nnodes",
                "2",
            ],
            "--master-addr",
        ),
        (
            &[
                "--launcher",
                "torchrun",
                "--nproc-per-node",
                "2",
                "--nnodes",
                "2",
                "--node-rank",
                "2",
                "--master-addr",
                "10.0.0.1",
            ],
            "--node-rank 2",
        ),
        (
            &[
                "--launcher",
                "deepspeed",
                "--num-gpus",
                "2",
                "--nnodes",
                "2",
                "--master-addr",
                "10.0.0.1",
            ],
            "hostfile",
        ),
        (
            &[
                "--launcher",
                "torchrun",
                "--nproc-per-node",
                "2",
                "--launcher-cmd",
                "/nonexistent/torchrun",
            ],
            "/nonexistent/torchrun",
        ),
    ];
    for (flags, says) in cases {
        let mut cmd = batchfit();
        cmd.arg("run").args(*flags);
        if !flags.contains(&"--launcher-cmd") {
            cmd.args(["--launcher-cmd", &launcher]);
        }
        let out = cmd
            .args(["--", "sh", &trainer, "{batch}"])
            .env("FAKE_PIDS", &pid_file)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {err}");
        assert!(err.contains(says), "{flags:?}: {err}");
        assert!(!pid_file.exists(), "{flags:?}: the command ran");
    }
}

#[test]
fn reports_two_ranks_print_at_once_are_all_read() {
    // torchrun's `python -u` workers write each print's text and newline
    // apart, so two ranks' reports share a line; every one is still a step.
    let dir = tempfile::tempdir().unwrap();
    let doc = run_json(
        2,
        &["--batches", "8"],
        &[
            ("FAKE_INTERLEAVE", dir.path().to_str().unwrap()),
            ("FAKE_STEPS", "6"),
        ],
    );
    let t = trial(&doc, 8);
    assert_eq!(t["outcome"], "ran", "{t}");
    assert_eq!(t["bad_step_lines"], 0, "{t}");
    let steps: Vec<u64> = t["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["steps"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, [6, 6], "{t}");
    // The stand-in did interleave: both ranks' turns left their markers.
    assert!(dir.path().join("c.6").exists());
}
