//! The probe reads how each measuring worker ended through the one runner and
//! the one outcome type: a worker that crashes is reported as a crash (never
//! as out of memory) and stops the max-batch search; one that prints an
//! out-of-memory error is out of memory. Stand-in workers are shell scripts,
//! so no framework step runs here.

#![cfg(unix)]

use batchfit_engine::DeviceSpec;
use batchfit_pipeline::NoProgress;
use batchfit_pipeline::probe::{MeasureConfig, Target, probe_device};
use batchfit_plan::{Bytes, Optimizer};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A stand-in worker: a script run as `WORKER __measure-worker REQUEST`.
fn worker(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

fn config(worker: PathBuf, limit: Option<Bytes>) -> MeasureConfig {
    MeasureConfig {
        batches: Vec::new(),
        memory_limit: limit,
        efficiency: 0.9,
        threads: Some(1),
        warmup: 1,
        time_cap_s: 1.0,
        min_time_s: 0.25,
        up_to: 64,
        optimizer: Optimizer::Adam,
        lr: 1e-3,
        seq_len: None,
        seed: 0,
        timeout: Duration::from_secs(20),
        worker,
        budget_s: None,
    }
}

#[test]
fn a_crashing_worker_is_a_crash_and_stops_the_search() {
    let dir = tempfile::tempdir().unwrap();
    let crash = worker(
        dir.path(),
        "crash.sh",
        "echo \"thread 'main' panicked at src/kernel.rs:12: index out of bounds\" >&2\nexit 101",
    );
    let graph = batchfit_graph::load("zoo:digits-mlp").unwrap();
    let target = Target {
        source: "zoo:digits-mlp".into(),
        loss: None,
        graph: &graph,
        seq_len: 1,
    };
    let cfg = config(crash, Some(Bytes(256 << 20)));
    let p = probe_device(&cfg, &target, DeviceSpec::Cpu, &NoProgress).unwrap();

    let search = p.search.as_ref().expect("a memory limit runs the search");
    assert_eq!(search.trials.len(), 1, "the first crash stops the search");
    assert!(search.stopped_at.is_some());
    assert_eq!(
        search.smallest_failure, None,
        "a crash is not a memory limit"
    );
    assert_eq!(search.max_batch, None);
    let reason = search.stop_reason.as_deref().unwrap();
    assert!(reason.starts_with("crashed"), "{reason}");
    assert!(reason.contains("index out of bounds"), "{reason}");

    // The throughput rows say crashed, and never out of memory.
    assert!(!p.points.is_empty());
    for point in &p.points {
        let why = point.failure.as_deref().expect("nothing ran");
        assert!(why.starts_with("crashed: exit status 101"), "{why}");
        assert!(!why.contains("out of memory"), "{why}");
    }
}

#[test]
fn an_out_of_memory_worker_is_out_of_memory() {
    let dir = tempfile::tempdir().unwrap();
    let oom = worker(
        dir.path(),
        "oom.sh",
        "echo 'memory allocation of 1073741824 bytes failed' >&2\nkill -ABRT $$",
    );
    let graph = batchfit_graph::load("zoo:digits-mlp").unwrap();
    let target = Target {
        source: "zoo:digits-mlp".into(),
        loss: None,
        graph: &graph,
        seq_len: 1,
    };
    let mut cfg = config(oom, None);
    cfg.batches = vec![8, 16];
    let p = probe_device(&cfg, &target, DeviceSpec::Cpu, &NoProgress).unwrap();
    assert_eq!(p.points.len(), 2, "listed batches all run");
    for point in &p.points {
        let why = point.failure.as_deref().unwrap();
        assert!(why.starts_with("out of memory"), "{why}");
    }
}

#[test]
fn a_worker_past_its_time_out_is_timed_out() {
    let dir = tempfile::tempdir().unwrap();
    let hang = worker(dir.path(), "hang.sh", "sleep 30");
    let graph = batchfit_graph::load("zoo:digits-mlp").unwrap();
    let target = Target {
        source: "zoo:digits-mlp".into(),
        loss: None,
        graph: &graph,
        seq_len: 1,
    };
    let mut cfg = config(hang, None);
    cfg.batches = vec![8];
    cfg.timeout = Duration::from_millis(300);
    let p = probe_device(&cfg, &target, DeviceSpec::Cpu, &NoProgress).unwrap();
    let why = p.points[0].failure.as_deref().unwrap();
    assert!(why.starts_with("timed out"), "{why}");
}

/// A stand-in whose first process at each batch runs 1.5x slow (a busy
/// neighbour) and whose repeats run clean: the batches that decide the knee
/// are measured again and take the mean of their processes, and the repeats'
/// disagreement widens the knee's range.
#[test]
fn the_batches_that_decide_the_knee_are_measured_again_and_pooled() {
    let dir = tempfile::tempdir().unwrap();
    let seen = dir.path().join("seen");
    std::fs::create_dir(&seen).unwrap();
    // Step time 1 ms + 10 us per sample; x1.5 the first time a batch runs.
    let body = format!(
        r#"b=$(echo "$2" | sed 's/.*"batch":\([0-9]*\).*/\1/')
if [ -e {seen}/$b ]; then slow=1; else slow=1.5; touch {seen}/$b; fi
echo $b >> {seen}/runs
t=$(awk "BEGIN {{ printf \"%.9f\", (0.001 + 0.00001 * $b) * $slow }}")
echo "BATCHFIT_WORKER {{\"Measured\":{{\"batch\":$b,\"step_times_s\":[$t,$t,$t,$t,$t],\"warmup_steps\":1,\"peak_bytes\":null,\"peak_rss_bytes\":null,\"first_loss\":1.0,\"last_loss\":0.5}}}}""#,
        seen = seen.display()
    );
    let stand_in = worker(dir.path(), "busy.sh", &body);
    let graph = batchfit_graph::load("zoo:digits-mlp").unwrap();
    let target = Target {
        source: "zoo:digits-mlp".into(),
        loss: None,
        graph: &graph,
        seq_len: 1,
    };
    let mut cfg = config(stand_in, None);
    cfg.up_to = 512;
    let p = probe_device(&cfg, &target, DeviceSpec::Cpu, &NoProgress).unwrap();
    let clean = |b: u64| 0.001 + 0.00001 * b as f64;
    // Sampled 1, 2, ..., 512, refined at 323 and 406. Clean throughput
    // B / (1 ms + 10 us B): 90 % of the best (512) first at 323, which the first
    // (uniformly slow) measurements also give; measured again: 323, the batch
    // below it and the fastest. The knee is then read off the step-time line
    // through clean and slow points alike, so it may move up one refinement.
    assert!(
        matches!(p.knee_batch, Some(323 | 406)),
        "{:?}",
        p.knee_batch
    );
    let runs = std::fs::read_to_string(seen.join("runs")).unwrap();
    for b in [256, 323, 512] {
        let n = runs.lines().filter(|l| *l == b.to_string()).count() as f64;
        assert!(n >= 2.0, "batch {b} timed {n} times");
        // One slow process (1.5x) and n - 1 clean ones.
        let mean = clean(b) * (1.5 + (n - 1.0)) / n;
        let point = p.points.iter().find(|q| q.batch == b).unwrap();
        assert!(
            (point.step_time_s - mean).abs() < 1e-9,
            "batch {b}: {} s kept, {mean} s the mean of {n} processes",
            point.step_time_s,
        );
    }
    // Every timed step of one process agrees, so only the repeats show the
    // 1.5x between processes: the range reaches below the knee.
    let range = p.knee_range.unwrap();
    assert!(range.low < 323 && range.high >= 323, "{range:?}");
    assert!(range.high >= p.knee_batch.unwrap(), "{range:?}");
}
