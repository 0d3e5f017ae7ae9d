//! Baseline of every report on stand-in evidence (before the house moves).

#![cfg(unix)]

use batchfit_engine::DeviceSpec;
use batchfit_pipeline::NoProgress;
use batchfit_pipeline::advise::{Evidence, decide, prediction_basis};
use batchfit_pipeline::probe::{MeasureConfig, Target, probe_device};
use batchfit_plan::plan::{CpuHost, GemmKernel, plan_on};
use batchfit_plan::{Bytes, Optimizer, TrainOptions};
use batchfit_report::advise::{AdviceInputs, AdviseDocument, ScheduleDocument};
use batchfit_report::noise::{LrAdvice, NoiseDocument};
use batchfit_report::probe::{DeviceProbe, MaxBatchSearch, ProbeBudget, ProbePoint};
use batchfit_tune::lr::LrRule;
use batchfit_tune::noise::NoiseRecord;
use batchfit_tune::search::{TrialRecord, Verdict};
use batchfit_tune::stats::summarize;
use std::os::unix::fs::PermissionsExt;

fn host() -> CpuHost {
    CpuHost {
        threads: 2,
        l2_bytes: 1 << 20,
        gemm_kernel: GemmKernel::AVX512,
    }
}

fn point(b: u64, step: f64, jitter: f64) -> ProbePoint {
    let s = [
        step * (1.0 - jitter),
        step,
        step * (1.0 + jitter),
        step,
        step,
    ];
    ProbePoint::measured(
        b,
        &summarize(&s),
        Some(1_000_000 + 4_000 * b),
        Some(30_000_000 + 4_000 * b),
        Some(Bytes(1_020_000 + 4_000 * b)),
    )
}

fn cpu_probe() -> DeviceProbe {
    let points: Vec<ProbePoint> = [8u64, 16, 32, 64, 128, 256, 512, 1024]
        .iter()
        .map(|&b| point(b, 2e-4 + 2e-6 * b as f64, 0.02))
        .collect();
    DeviceProbe {
        device: "cpu".into(),
        threads: Some(2),
        knee_range: batchfit_tune::knee::knee_range(
            &batchfit_report::probe::curve_with_errors(&points),
            0.9,
        ),
        points,
        max_batch: None,
        knee_batch: Some(512),
        efficiency: 0.9,
        search_trials: 0,
        search: None,
        seconds: 12.5,
        budget: Some(ProbeBudget {
            budget_s: 180.0,
            not_measured: vec![2048, 4096],
            predicted_step_s: Some(8.4e-3),
        }),
    }
}

fn gpu_probe() -> DeviceProbe {
    let mut points: Vec<ProbePoint> = [8u64, 16, 32, 64, 128]
        .iter()
        .map(|&b| point(b, 1e-3 + 1e-6 * b as f64, 0.3))
        .collect();
    points.push(ProbePoint::failed(
        256,
        Some(Bytes(2_044_000)),
        "out of memory (memory allocation of 1073741824 bytes failed)".into(),
    ));
    DeviceProbe {
        device: "wgpu:0".into(),
        threads: None,
        points,
        max_batch: Some(150),
        knee_batch: Some(128),
        knee_range: None,
        efficiency: 0.9,
        search_trials: 4,
        search: Some(MaxBatchSearch {
            budget_bytes: Bytes(1_600_000),
            max_batch: Some(150),
            smallest_failure: Some(160),
            planned_limit: Some(145),
            predicted_limit: 152,
            stopped_at: None,
            stop_reason: None,
            trials: vec![
                TrialRecord {
                    batch: 36,
                    reason: "calibration",
                    verdict: Verdict::fits(Bytes(1_144_000)),
                },
                TrialRecord {
                    batch: 72,
                    reason: "calibration",
                    verdict: Verdict::fits(Bytes(1_288_000)),
                },
                TrialRecord {
                    batch: 152,
                    reason: "prediction",
                    verdict: Verdict::OutOfMemory,
                },
                TrialRecord {
                    batch: 150,
                    reason: "bisection",
                    verdict: Verdict::fits(Bytes(1_600_000)),
                },
            ],
            seconds: 3.25,
        }),
        seconds: 9.0,
        budget: None,
    }
}

/// A noise run whose stretches have a noise scale growing from 60 to 400 as
/// the loss falls from 2.3 to 0.1, trained with Adam at batch 128.
fn noise_doc() -> NoiseDocument {
    let steps = 200;
    let history: Vec<NoiseRecord> = (0..steps)
        .map(|i| {
            let t = i as f64 / steps as f64;
            let loss = 0.1 + 2.2 * (-4.0 * t).exp();
            let b = 60.0 + 340.0 * t;
            NoiseRecord {
                step: i,
                loss: loss * (1.0 + 0.05 * ((i * 7 % 11) as f64 / 11.0 - 0.5)),
                train_loss: (i % 10 == 0 || i == steps - 1).then_some(loss),
                b_simple: (i > 3).then_some(b * 0.9),
                b_simple_low: (i > 3).then_some(b * 0.6),
                b_simple_high: (i > 20).then_some(b * 1.3),
                g2: Some(1.0 / (1.0 + t)),
                trace: Some(b / (1.0 + t)),
                g2_raw: 1.0 / (1.0 + t),
                trace_raw: 0.8 * b / (1.0 + t),
                g2_raw_preconditioned: Some(2.0 / (1.0 + t)),
                trace_raw_preconditioned: Some(2.0 * b / (1.0 + t)),
                epoch: i * 128 / 1617,
            }
        })
        .collect();
    NoiseDocument {
        schema_version: batchfit_report::SCHEMA_VERSION,
        kind: "noise",
        model: "digits-mlp".into(),
        data: "builtin:digits".into(),
        rows: 1797,
        b_small: 16,
        b_big: 128,
        lr: 1e-3 * 8f64.sqrt(),
        optimizer: "adam".into(),
        steps,
        b_simple: Some(360.0),
        b_simple_low: Some(240.0),
        b_simple_high: Some(520.0),
        critical_batch: Some(360),
        history,
        predictions: batchfit_tune::noise::predict(360.0, &[16, 64, 256, 1024]),
        lr_advice: Some(LrAdvice {
            rule: LrRule::Sqrt,
            source: LrRule::Sqrt.source().into(),
            ref_batch: 16,
            ref_lr: 1e-3,
            per_batch: vec![(16, 1e-3), (64, 2e-3), (256, 4e-3), (1024, 8e-3)],
        }),
    }
}

fn advise_doc() -> AdviseDocument {
    let graph = batchfit_graph::load("zoo:digits-mlp").unwrap();
    let plan_cpu = plan_on(&graph, &TrainOptions::default(), host());
    let probes = vec![cpu_probe(), gpu_probe()];
    let noise = noise_doc();
    let d = decide(&Evidence {
        probes: &probes,
        plan_cpu: &plan_cpu,
        host_memory: Some(Bytes(24 << 30)),
        noise: Some(&noise),
        measured: None,
        rule: LrRule::Sqrt,
        reference: (16, 1e-3),
        input_seconds: &|b| Some(1e-5 + 1e-8 * b as f64),
    });
    AdviseDocument {
        schema_version: batchfit_report::SCHEMA_VERSION,
        kind: "advise",
        model: graph.name.clone(),
        parameters: graph.param_count(),
        command: "batchfit advise".into(),
        inputs: AdviceInputs {
            model: None,
            data: None,
            labels: None,
            label_col: None,
            loss: None,
            optimizer: "adam".into(),
        },
        machine: "stand-in (2 cores), 24.0 GiB RAM".into(),
        data: Some("builtin:digits".into()),
        plan: plan_cpu,
        devices: probes,
        noise: Some(noise),
        recommendations: d.recommendations,
        time_to_target: d.time_to_target,
        target_loss: d.target_loss,
        prediction: d.basis,
        schedules: d.schedules,
        findings: d.findings,
        budgets: vec![("wgpu:0".into(), Bytes(1_600_000))],
        world_sizes: None,
        devices_not_used: vec!["cuda: not in this build (rebuild with --features cuda)".into()],
    }
}

#[test]
fn advise_schedule_noise_probe_plan() {
    let doc = advise_doc();
    insta::assert_snapshot!("advise_text", batchfit_report::advise::render(&doc));
    insta::assert_snapshot!("advise_json", serde_json::to_string_pretty(&doc).unwrap());
    let sch = ScheduleDocument::of(&doc).unwrap();
    insta::assert_snapshot!(
        "schedule_text",
        batchfit_report::advise::render_schedule(&sch)
    );
    insta::assert_snapshot!("schedule_json", serde_json::to_string_pretty(&sch).unwrap());
    insta::assert_snapshot!(
        "noise_text",
        batchfit_report::noise::render(doc.noise.as_ref().unwrap())
    );
    insta::assert_snapshot!(
        "probe_text",
        batchfit_report::probe::render("digits-mlp", &doc.devices)
    );
    let graph = batchfit_graph::load("zoo:seed2-dual").unwrap();
    let p = plan_on(&graph, &TrainOptions::default(), host());
    let budgets = vec![batchfit_report::plan::BudgetFit::new(
        &p,
        "gtx1060-6gb",
        Bytes(6 << 30),
    )];
    insta::assert_snapshot!("plan_text", batchfit_report::plan::render(&p, &budgets));
    let basis = prediction_basis(doc.noise.as_ref().unwrap(), LrRule::Sqrt, (16, 1e-3)).unwrap();
    insta::assert_snapshot!("basis_json", serde_json::to_string_pretty(&basis).unwrap());
}

fn record(b: u64, seed: u64, s_min: f64, b_noise: f64) -> batchfit_tune::sweep::RunRecord {
    use batchfit_tune::sweep::{CurvePoint, EpochRecord, RunRecord, RunStatus};
    let need = s_min * (1.0 + b_noise / b as f64) * (1.0 + 0.04 * seed as f64);
    let step_s = 2e-4 + 2e-6 * b as f64;
    let curve: Vec<CurvePoint> = (0..=20)
        .map(|i| {
            let step = (need * 1.5 * i as f64 / 20.0).round() as u64;
            CurvePoint {
                step,
                seconds: step as f64 * step_s,
                samples: step * b,
                loss: 2.0 * (-(step as f64) / need * 3.0f64.ln() * 2.0).exp(),
            }
        })
        .collect();
    let target = 2.0 / 9.0;
    let reached = batchfit_tune::sweep::first_reach(&curve, target);
    let last = *curve.last().unwrap();
    RunRecord {
        batch: b,
        seed,
        lr: 1e-3 * (b as f64 / 16.0).sqrt(),
        warmup_steps: 0,
        target_loss: Some(target),
        status: RunStatus::Reached,
        steps_to_target: reached.map(|r| r.0),
        epochs_to_target: reached.map(|r| r.2 / 1617.0),
        samples_to_target: reached.map(|r| r.2),
        seconds_to_target: reached.map(|r| r.1),
        steps: last.step,
        seconds: last.seconds,
        curve,
        epochs: vec![EpochRecord {
            epoch: 1,
            step: last.step,
            seconds: last.seconds,
            train_loss: 0.3,
            val_loss: 0.25 + 0.01 * seed as f64,
            val_accuracy: Some(0.93 - 0.002 * b as f64 / 64.0 + 0.003 * seed as f64),
        }],
        final_val_loss: Some(0.25 + 0.01 * seed as f64),
        final_val_accuracy: Some(0.93 - 0.002 * b as f64 / 64.0 + 0.003 * seed as f64),
        schedule: None,
    }
}

#[test]
fn sweep_and_verify() {
    use batchfit_report::sweep::{SweepRun, SweepSettings};
    let settings = SweepSettings {
        model: "digits-mlp".into(),
        data: "builtin:digits".into(),
        device: "cpu".into(),
        train_rows: 1617,
        val_rows: 180,
        val_split: 0.1,
        split_seed: 0,
        batches: vec![64, 128, 256],
        seeds: vec![0, 1],
        optimizer: "adam".into(),
        lr_rule: "sqrt".into(),
        ref_batch: 16,
        ref_lr: 1e-3,
        lr_cap: Some(300),
        schedule: None,
        warmup_epochs: 0.0,
        target_loss: Some(2.0 / 9.0),
        max_epochs: 20,
    };
    let runs: Vec<SweepRun> = [64u64, 128, 256]
        .iter()
        .flat_map(|&b| (0..2).map(move |s| (b, s)))
        .map(|(b, s)| SweepRun {
            device: "cpu".into(),
            resumed: false,
            steps_to_target: None,
            seconds_to_target: None,
            samples_to_target: None,
            record: record(b, s, 40.0, 300.0),
        })
        .collect();
    let mut doc = batchfit_pipeline::sweep::document(
        settings,
        runs,
        Some((310.0, 200.0, f64::INFINITY)),
        std::time::Instant::now(),
        "cpu",
    );
    doc.seconds = 0.0;
    let advice_json = serde_json::to_string_pretty(&advise_doc()).unwrap();
    let advice =
        batchfit_pipeline::verify::parse_advice(std::path::Path::new("advice.json"), &advice_json)
            .unwrap();
    let of_first: Vec<SweepRun> = doc.runs.clone();
    doc.verify = Some(batchfit_pipeline::verify::report(
        &advice,
        &doc.per_batch,
        &of_first,
    ));
    insta::assert_snapshot!("sweep_text", batchfit_report::sweep::render(&doc));
    insta::assert_snapshot!("sweep_json", serde_json::to_string_pretty(&doc).unwrap());
}

fn trial(
    batch: u64,
    reason: &'static str,
    oom: bool,
    noise: bool,
) -> batchfit_report::run::RunTrial {
    use batchfit_exec::protocol::{NoiseReport, StepReport, step_stats};
    use batchfit_exec::{Outcome, TrialResult};
    let reports: Vec<StepReport> = if oom {
        Vec::new()
    } else {
        (1..=30u64)
            .map(|i| StepReport {
                step: Some(i),
                samples: Some(batch),
                seconds: (2e-3 + 1e-5 * batch as f64) * if i == 1 { 5.0 } else { 1.0 },
                loss: Some(2.0 * (-(i as f64) / 15.0).exp()),
                noise: (noise && batch >= 16 && i % 2 == 0).then(|| NoiseReport {
                    b_small: (batch / 8) as f64,
                    g_small_sq: 1.0 + 256.0 / (batch / 8) as f64 * (1.0 + 0.1 * (i % 3) as f64),
                    b_big: batch as f64,
                    g_big_sq: 1.0 + 256.0 / batch as f64,
                }),
                rank: None,
            })
            .collect()
    };
    let steps = step_stats(&reports, batch, 2);
    batchfit_report::run::RunTrial {
        reason,
        result: TrialResult {
            batch,
            outcome: if oom {
                Outcome::OutOfMemory("torch.OutOfMemoryError: CUDA out of memory".into())
            } else {
                Outcome::Ran
            },
            wall_s: 0.5,
            steps,
            bad_step_lines: 0,
            peak_host_bytes: Some(50_000_000 + 100_000 * batch),
            peak_vm_bytes: None,
            peak_gpu_bytes: None,
            gpu_util_mean_pct: None,
            gpu_util_max_pct: None,
            gpu_device: None,
            reports,
            ranks: Vec::new(),
        },
    }
}

#[test]
fn run_on_stand_in_trials() {
    use batchfit_report::run::RunDocument;
    let mut trials = Vec::new();
    for (b, why) in [
        (1, "start"),
        (2, "doubling"),
        (4, "doubling"),
        (8, "doubling"),
    ] {
        trials.push(trial(b, why, false, true));
    }
    for b in [16, 32, 64, 128, 256] {
        trials.push(trial(b, "doubling", false, true));
    }
    trials.push(trial(512, "doubling", true, false));
    trials.push(trial(384, "bisection", true, false));
    trials.push(trial(320, "bisection", false, true));
    trials.push(trial(161, "knee refinement", false, true));
    trials.push(trial(203, "knee refinement", false, true));
    let mut points: Vec<ProbePoint> = Vec::new();
    for t in &trials {
        let r = &t.result;
        points.retain(|p| p.batch != r.batch);
        points.push(match &r.steps {
            Some(s) => {
                let mut p = ProbePoint::measured(
                    r.batch,
                    &s.step_time,
                    r.peak_host_bytes,
                    r.peak_host_bytes,
                    None,
                );
                p.samples_per_s = s.samples_per_s;
                p
            }
            None => ProbePoint::failed(r.batch, None, r.outcome.to_string()),
        });
    }
    points.sort_by_key(|p| p.batch);
    let device = DeviceProbe {
        knee_range: batchfit_tune::knee::knee_range(
            &batchfit_report::probe::curve_with_errors(&points),
            0.9,
        ),
        device: "host".into(),
        threads: None,
        points,
        max_batch: Some(320),
        knee_batch: Some(203),
        efficiency: 0.9,
        search_trials: 11,
        search: None,
        seconds: 7.0,
        budget: None,
    };
    let (noise, target_loss) = batchfit_pipeline::run_advice::noise_of(&trials);
    let advice =
        batchfit_pipeline::run_advice::advise_run(&device, &trials, noise.as_ref(), LrRule::Sqrt);
    let doc = RunDocument {
        schema_version: batchfit_report::SCHEMA_VERSION,
        kind: "run",
        command: "python train.py --batch-size {batch}".into(),
        launch_command: None,
        world_size: 1,
        devices: vec![device],
        noise,
        recommendation: advice.recommendation,
        time_to_target: advice.time_to_target,
        target_loss,
        findings: advice.findings,
        trials,
        max_batch: Some(320),
        smallest_failure: Some(384),
        stopped_at: None,
        capped: false,
        search_trials: 11,
        memory_limit_bytes: None,
        batch_with_margin: None,
        seconds: 7.0,
    };
    insta::assert_snapshot!("run_text", batchfit_report::run::render(&doc));
    insta::assert_snapshot!("run_json", serde_json::to_string_pretty(&doc).unwrap());
}

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
