//! The probe's measuring loop on a stand-in worker (a shell script that
//! answers as the engine's worker does): which batches it measures, searches
//! and settles, pinned as JSON. No framework step runs here.

#![cfg(unix)]

use batchfit_engine::DeviceSpec;
use batchfit_pipeline::NoProgress;
use batchfit_pipeline::probe::{MeasureConfig, Target, probe_device};
use batchfit_plan::{Bytes, Optimizer};
use std::os::unix::fs::PermissionsExt;

/// A stand-in measuring worker: step 1 ms + 10 us per sample; peak 2 MB + 40 kB
/// per sample, out of memory above the request's limit.
fn stand_in_worker(dir: &std::path::Path) -> std::path::PathBuf {
    let body = r#"b=$(echo "$2" | sed 's/.*"batch":\([0-9]*\).*/\1/')
lim=$(echo "$2" | sed 's/.*"memory_limit":\([0-9a-z]*\).*/\1/')
peak=$((2000000 + 40000 * b))
if [ "$lim" != "null" ] && [ "$peak" -gt "$lim" ]; then echo "memory allocation of $peak bytes failed" >&2; kill -ABRT $$; fi
t=$(awk "BEGIN { printf \"%.9f\", 0.001 + 0.00001 * $b }")
echo "BATCHFIT_WORKER {\"Measured\":{\"batch\":$b,\"step_times_s\":[$t,$t,$t,$t,$t],\"warmup_steps\":1,\"peak_bytes\":$peak,\"peak_rss_bytes\":null,\"first_loss\":1.0,\"last_loss\":0.5}}""#;
    let path = dir.join("worker.sh");
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

#[test]
fn probe_loop_on_a_stand_in_worker() {
    let dir = tempfile::tempdir().unwrap();
    let graph = batchfit_graph::load("zoo:digits-mlp").unwrap();
    let target = Target {
        source: "zoo:digits-mlp".into(),
        loss: None,
        graph: &graph,
        seq_len: 1,
    };
    for (name, limit, batches) in [
        ("probe_sampled", None, vec![]),
        ("probe_limit", Some(Bytes(20_000_000)), vec![]),
        ("probe_listed", None, vec![3u64, 30, 300]),
    ] {
        let cfg = MeasureConfig {
            batches,
            memory_limit: limit,
            efficiency: 0.9,
            threads: Some(1),
            warmup: 1,
            time_cap_s: 1.0,
            min_time_s: 0.25,
            up_to: 512,
            optimizer: Optimizer::Adam,
            lr: 1e-3,
            seq_len: None,
            seed: 0,
            timeout: std::time::Duration::from_secs(20),
            worker: stand_in_worker(dir.path()),
            budget_s: None,
        };
        let mut p = probe_device(&cfg, &target, DeviceSpec::Cpu, &NoProgress).unwrap();
        if limit.is_some() {
            // The search starts from the plan, which is made for this CPU (its
            // L2 and gemm kernel size the packing buffers): which batches it
            // tries differs between machines, its answer does not. The stand-in
            // fits (20 MB - 2 MB) / 40 kB = 450 samples.
            let max = p.max_batch.unwrap();
            let search = p.search.as_ref().unwrap();
            let fail = search.smallest_failure.unwrap();
            assert!((409..=450).contains(&max), "{max}: {search:?}");
            assert!(fail > max && fail as f64 <= (max as f64 * 1.1).ceil() + 1.0);
            assert!(search.trials.len() <= 8, "{search:?}");
            continue;
        }
        p.seconds = 0.0;
        if let Some(s) = &mut p.search {
            s.seconds = 0.0;
            s.planned_limit = None;
        }
        let mut v = serde_json::to_value(&p).unwrap();
        for q in v["points"].as_array_mut().unwrap() {
            q["planned_bytes"] = serde_json::Value::Null;
            q["plan_error_pct"] = serde_json::Value::Null;
        }
        insta::assert_snapshot!(name, serde_json::to_string_pretty(&v).unwrap());
    }
}
