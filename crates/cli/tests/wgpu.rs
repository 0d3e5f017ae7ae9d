//! The GPU column through the real binary, on a wgpu device. Built only with
//! `--features wgpu`; CI runs it on lavapipe (Mesa's Vulkan driver on the CPU):
//! timings there say nothing about a GPU, but the device path is the real one.
#![cfg(feature = "wgpu")]

mod common;

use common::json;

const FAST: &[&str] = &["--time-cap", "0.2", "--warmup", "1"];

#[test]
fn probe_measures_the_cpu_and_a_wgpu_device_side_by_side() {
    let mut args = vec![
        "probe",
        "zoo:seed2-dual",
        "--device",
        "cpu,wgpu:0",
        "--batches",
        "8,32",
    ];
    args.extend(FAST);
    let v = json(&args);
    let devices = v["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 2);
    assert_eq!(devices[1]["device"], "wgpu:0");
    for d in devices {
        let pts = d["points"].as_array().unwrap();
        assert_eq!(pts.len(), 2, "{}", d["device"]);
        for p in pts {
            assert!(p["failure"].is_null(), "{p}");
            assert!(p["step_time_s"].as_f64().unwrap() > 0.0);
            assert!(p["planned_bytes"].as_u64().unwrap() > 0);
        }
        // On the device the plan is CubeCL's pages for the step's tensors.
        if d["device"] == "wgpu:0" {
            for p in pts {
                let err = p["plan_error_pct"].as_f64().unwrap();
                assert!(err.abs() <= 10.0, "planned vs reserved {err:+.1} %: {p}");
            }
        }
        // Device memory grows with the batch: the runtime's pools were read.
        let peak = |i: usize| pts[i]["peak_bytes"].as_u64().unwrap();
        assert!(
            peak(1) > peak(0),
            "{}: {} then {}",
            d["device"],
            peak(0),
            peak(1)
        );
    }
}

/// `--memory-limit` holds on the device: the largest batch the search finds
/// runs under the limit, and 1.1x of it does not.
#[test]
fn the_memory_limit_holds_on_the_wgpu_device() {
    let limit = "48MiB";
    let probe = |batches: &str| {
        let mut args = vec![
            "probe",
            "zoo:mnist-mlp",
            "--device",
            "wgpu:0",
            "--batches",
            batches,
            "--memory-limit",
            limit,
        ];
        args.extend(FAST);
        json(&args)
    };
    let v = probe("8");
    let d = &v["devices"][0];
    let max = d["max_batch"].as_u64().expect("a batch fits under 48 MiB");
    let above = (max as f64 * 1.1).ceil() as u64;
    let v = probe(&format!("{max},{above}"));
    let pts = v["devices"][0]["points"].as_array().unwrap();
    assert!(pts[0]["failure"].is_null(), "{max} fits: {}", pts[0]);
    assert!(
        pts[0]["peak_bytes"].as_u64().unwrap() <= 48 << 20,
        "{}",
        pts[0]
    );
    assert!(
        pts[1]["failure"]
            .as_str()
            .unwrap()
            .contains("out of memory"),
        "{above} does not fit: {}",
        pts[1]
    );
}

/// `sweep --device cpu,wgpu:0` trains every run on both devices and compares
/// seconds to the common target per batch.
#[test]
fn sweep_trains_on_the_cpu_and_a_wgpu_device() {
    let v = json(&[
        "sweep",
        "--device",
        "cpu,wgpu:0",
        "--batches",
        "64,256",
        "--seeds",
        "1",
        "--epochs",
        "2",
        "--no-noise",
    ]);
    assert_eq!(v["settings"]["device"], "cpu,wgpu:0");
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 4);
    let by = v["by_device"].as_array().unwrap();
    assert_eq!(by.len(), 2);
    for (dev, name) in by.iter().zip(["cpu", "wgpu:0"]) {
        assert_eq!(dev["device"], name);
        assert_eq!(
            runs.iter().filter(|r| r["device"] == name).count(),
            2,
            "{name}"
        );
        for b in dev["per_batch"].as_array().unwrap() {
            assert_eq!(b["reached"], 1, "{name}: {b}");
            assert!(b["seconds_mean"].as_f64().unwrap() > 0.0, "{name}: {b}");
        }
    }
    // The fits and the quality verdict are the first device's.
    assert_eq!(v["per_batch"][0]["runs"], 1);
}
