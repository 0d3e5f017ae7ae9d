//! The terminal and JSON output of plan, probe, noise, advise, schedule, run
//! and sweep, pinned on stand-in evidence: the decisions are `batchfit_tune`'s,
//! the words and the documents this crate's, and no process runs.

use batchfit_plan::plan::{CpuHost, GemmKernel, plan_on};
use batchfit_plan::{Bytes, Optimizer, TrainOptions};
use batchfit_report::advise::{AdviseDocument, ScheduleDocument};
use batchfit_report::noise::NoiseDocument;
use batchfit_tune::basis::prediction_basis;
use batchfit_tune::dataset::{DataProfile, TargetProfile};
use batchfit_tune::decide::{Advice, AdviceInputs, Evidence, SeedNoise, decide};
use batchfit_tune::device::DeviceSpec;
use batchfit_tune::lr::LrRule;
use batchfit_tune::noise::{LrAdvice, NoiseRecord, NoiseRun};
use batchfit_tune::probe::{
    DeviceProbe, MaxBatchSearch, ProbeBudget, ProbePoint, curve_with_errors,
};
use batchfit_tune::search::{TrialReason, TrialRecord, Verdict};
use batchfit_tune::stability::{RateCheck, RateVerdict};
use batchfit_tune::stats::summarize;
use batchfit_tune::trial::{FailureKind, RunTrial};

fn host() -> CpuHost {
    CpuHost {
        threads: 2,
        l2_bytes: 1 << 20,
        l2_ways: 8,
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
        device: DeviceSpec::Cpu,
        threads: Some(2),
        between_process_error: None,
        knee_range: batchfit_tune::knee::knee_range(&curve_with_errors(&points), 0.9),
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
        FailureKind::OutOfMemory,
        "out of memory (memory allocation of 1073741824 bytes failed)".into(),
    ));
    DeviceProbe {
        device: DeviceSpec::Wgpu(0),
        threads: None,
        between_process_error: None,
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
            stop_code: None,
            trials: vec![
                TrialRecord {
                    batch: 36,
                    reason: TrialReason::Calibration,
                    verdict: Verdict::fits(Bytes(1_144_000)),
                },
                TrialRecord {
                    batch: 72,
                    reason: TrialReason::Calibration,
                    verdict: Verdict::fits(Bytes(1_288_000)),
                },
                TrialRecord {
                    batch: 152,
                    reason: TrialReason::Prediction,
                    verdict: Verdict::OutOfMemory,
                },
                TrialRecord {
                    batch: 150,
                    reason: TrialReason::Bisection,
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
fn noise_doc() -> NoiseRun {
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
    NoiseRun {
        model: "digits-mlp".into(),
        data: "builtin:digits".into(),
        rows: 1797,
        b_small: 16,
        b_big: 128,
        lr: 1e-3 * 8f64.sqrt(),
        optimizer: Optimizer::Adam,
        steps,
        b_simple: Some(360.0),
        b_simple_low: Some(240.0),
        b_simple_high: Some(520.0),
        critical_batch: Some(360),
        history,
        predictions: batchfit_tune::noise::predict(360.0, &[16, 64, 256, 1024], None),
        lr_advice: Some(LrAdvice {
            rule: LrRule::Sqrt,
            source: LrRule::Sqrt.source(),
            ref_batch: 16,
            ref_lr: 1e-3,
            per_batch: vec![(16, 1e-3), (64, 2e-3), (256, 4e-3), (1024, 8e-3)],
        }),
    }
}

fn advice() -> Advice {
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
        rate_cap: None,
        data_rows: None,
        rate_failed_from: None,
        rate_unreached_to: None,
        checked_b_noise: None,
        checked_reference: None,
        prior_loss: Some(10f64.ln()),
    });
    Advice {
        model: graph.name.clone(),
        parameters: graph.param_count(),
        command: "batchfit advise".into(),
        inputs: AdviceInputs {
            model: None,
            data: None,
            labels: None,
            label_col: None,
            loss: None,
            class_axis: None,
            blank: None,
            optimizer: Optimizer::Adam,
            standardize: false,
            seed: 0,
        },
        machine: "stand-in (2 cores), 24.0 GiB RAM".into(),
        data: Some("builtin:digits".into()),
        plan: plan_cpu,
        devices: probes,
        noise: Some(noise),
        decision: d,
        budgets: vec![(DeviceSpec::Wgpu(0), Bytes(1_600_000))],
        world_sizes: None,
        devices_not_used: vec!["cuda: not in this build (rebuild with --features cuda)".into()],
        data_profile: Some(DataProfile {
            rows: 1797,
            features: 64,
            max_abs: 16.0,
            max_abs_feature: 2,
            constant_features: 3,
            first_constant: Some(0),
            targets: TargetProfile::Classes {
                counts: vec![178, 182, 177, 183, 181, 182, 181, 179, 174, 180],
            },
            standardized: false,
            class_names: Vec::new(),
        }),
        noise_seeds: vec![
            SeedNoise {
                seed: 0,
                b_noise: Some(330.0),
                recommended: vec![Some(64), Some(256)],
            },
            SeedNoise {
                seed: 1,
                b_noise: Some(390.0),
                recommended: vec![Some(128), Some(256)],
            },
        ],
        rate_checks: vec![
            rate_check(128, 2.83e-3, true, Some(182.0), 190.0, RateVerdict::Trains),
            rate_check(1024, 8e-3, true, None, 52.0, RateVerdict::Stalled),
            rate_check(1024, 4e-3, false, Some(58.0), 52.0, RateVerdict::Trains),
        ],
        rate_cap: Some(256),
        rate_failed_from: None,
        rate_unreached_to: None,
        b_small_asked: None,
    }
}

fn rate_check(
    batch: u64,
    lr: f64,
    rule_rate: bool,
    steps_to_target: Option<f64>,
    predicted_steps: f64,
    verdict: RateVerdict,
) -> RateCheck {
    RateCheck {
        batch,
        lr,
        rule_rate,
        max_steps: (predicted_steps * 2.0).ceil() as u64,
        loss_start: 2.31,
        loss_end: if steps_to_target.is_some() { 0.07 } else { 0.4 },
        steps_to_target,
        predicted_steps,
        verdict,
        projected_steps: None,
        seeds: 1,
        steps_sd: None,
    }
}

#[test]
fn advise_schedule_noise_probe_plan() {
    let doc = advice();
    insta::assert_snapshot!("advise_text", batchfit_report::advise::render(&doc));
    insta::assert_snapshot!(
        "advise_json",
        serde_json::to_string_pretty(&AdviseDocument::new(&doc)).unwrap()
    );
    let sch = ScheduleDocument::of(&doc).unwrap();
    insta::assert_snapshot!(
        "schedule_text",
        batchfit_report::advise::render_schedule(&sch)
    );
    insta::assert_snapshot!("schedule_json", serde_json::to_string_pretty(&sch).unwrap());
    let noise = doc.noise.as_ref().unwrap();
    insta::assert_snapshot!("noise_text", batchfit_report::noise::render(noise));
    insta::assert_snapshot!(
        "noise_json",
        serde_json::to_string_pretty(&NoiseDocument::new(noise)).unwrap()
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
    let basis = prediction_basis(noise, LrRule::Sqrt, (16, 1e-3)).unwrap();
    insta::assert_snapshot!(
        "basis_json",
        serde_json::to_string_pretty(&batchfit_report::json::BasisJson::new(&basis)).unwrap()
    );
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
    use batchfit_tune::sweep::{SweepRun, SweepSettings, summarize};
    let settings = SweepSettings {
        model: "digits-mlp".into(),
        data: "builtin:digits".into(),
        devices: vec![DeviceSpec::Cpu],
        train_rows: 1617,
        val_rows: 180,
        val_split: 0.1,
        split_seed: 0,
        batches: vec![64, 128, 256],
        seeds: vec![0, 1],
        optimizer: Optimizer::Adam,
        lr_rule: LrRule::Sqrt,
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
        .map(|(b, s)| SweepRun::new(record(b, s, 40.0, 300.0), DeviceSpec::Cpu, false))
        .collect();
    let mut doc = summarize(settings, runs, Some((310.0, 200.0, f64::INFINITY)), 0.0);
    // The advice the runs check, as `sweep --verify` reads it back from its file.
    let a = advice();
    let text = serde_json::to_string_pretty(&AdviseDocument::new(&a)).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let basis: batchfit_tune::basis::PredictionBasis =
        serde_json::from_value(json["prediction"].clone()).unwrap();
    let written = a.decision.basis.as_ref().unwrap();
    assert_eq!(
        basis.method_code(),
        written.method_code(),
        "the kind reads back"
    );
    assert_eq!(basis.lr, written.lr);
    let checked = batchfit_tune::verify::CheckedAdvice {
        path: "advice.json".into(),
        inputs: a.inputs.clone(),
        basis,
        device: DeviceSpec::Cpu,
        recommended: a.decision.recommendations[0].recommended_batch.unwrap(),
        tied: a.decision.recommendations[0].tied_batches.clone(),
        update_s: {
            let mut u: Vec<(u64, f64)> = a
                .decision
                .time_to_target
                .iter()
                .filter(|t| t.option.device == DeviceSpec::Cpu && t.option.accumulation == 1)
                .map(|t| (t.option.micro_batch, t.option.update_s()))
                .collect();
            u.sort_by_key(|p| p.0);
            u
        },
        first_seed: 3,
    };
    doc.verify = Some(batchfit_tune::verify::VerifyReport::new(
        &checked,
        &batchfit_tune::sweep::summary::measured_for_verify(&doc),
    ));
    insta::assert_snapshot!("sweep_text", batchfit_report::sweep::render(&doc));
    insta::assert_snapshot!(
        "sweep_json",
        serde_json::to_string_pretty(&batchfit_report::sweep::SweepDocument::new(&doc)).unwrap()
    );
}

fn trial(batch: u64, reason: TrialReason, oom: bool, noise: bool) -> RunTrial {
    use batchfit_tune::trial::{NoiseReport, Outcome, StepReport, StepStats, TrialResult};
    let reports: Vec<StepReport> = if oom {
        Vec::new()
    } else {
        (1..=30u64)
            .map(|i| StepReport {
                step: Some(i),
                samples: Some(batch),
                seconds: (2e-3 + 1e-5 * batch as f64) * if i == 1 { 5.0 } else { 1.0 },
                loss: Some(2.0 * (-(i as f64) / 15.0).exp()),
                train_loss: None,
                noise: (noise && batch >= 16 && i % 2 == 0).then(|| NoiseReport {
                    b_small: (batch / 8) as f64,
                    g_small_sq: 1.0 + 256.0 / (batch / 8) as f64 * (1.0 + 0.1 * (i % 3) as f64),
                    b_big: batch as f64,
                    g_big_sq: 1.0 + 256.0 / batch as f64,
                    preconditioned: None,
                    rows: None,
                }),
                rank: None,
            })
            .collect()
    };
    // The statistics `run` keeps: the steps after two of warm-up.
    let steps = (!reports.is_empty()).then(|| {
        let used = &reports[2..];
        let times: Vec<f64> = used.iter().map(|s| s.seconds).collect();
        StepStats {
            steps_reported: reports.len(),
            steps_used: used.len(),
            step_time: summarize(&times),
            samples_per_s: (batch * used.len() as u64) as f64 / times.iter().sum::<f64>(),
        }
    });
    RunTrial {
        reason,
        result: TrialResult {
            batch,
            learning_rate: None,
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
    use batchfit_tune::run::{RunRate, RunSummary, advise_run, noise_of, trial_point};
    let mut trials = Vec::new();
    for (b, why) in [
        (1, TrialReason::Start),
        (2, TrialReason::Doubling),
        (4, TrialReason::Doubling),
        (8, TrialReason::Doubling),
    ] {
        trials.push(trial(b, why, false, true));
    }
    for b in [16, 32, 64, 128, 256] {
        trials.push(trial(b, TrialReason::Doubling, false, true));
    }
    trials.push(trial(512, TrialReason::Doubling, true, false));
    trials.push(trial(384, TrialReason::Bisection, true, false));
    trials.push(trial(320, TrialReason::Bisection, false, true));
    trials.push(trial(161, TrialReason::KneeRefinement, false, true));
    trials.push(trial(203, TrialReason::KneeRefinement, false, true));
    let mut points: Vec<ProbePoint> = Vec::new();
    for t in &trials {
        points.retain(|p| p.batch != t.result.batch);
        points.push(trial_point(&t.result));
    }
    points.sort_by_key(|p| p.batch);
    let device = DeviceProbe {
        knee_range: batchfit_tune::knee::knee_range(&curve_with_errors(&points), 0.9),
        device: DeviceSpec::Host,
        threads: None,
        points,
        max_batch: Some(320),
        knee_batch: Some(203),
        efficiency: 0.9,
        search_trials: 11,
        search: None,
        seconds: 7.0,
        budget: None,
        between_process_error: None,
    };
    let learning_rate = RunRate::CommandsOwn {
        assumed_rule: LrRule::Sqrt,
        tuned_at: None,
    };
    let (noise, target_loss) = noise_of(&trials, &learning_rate);
    let advice = advise_run(&device, true, &trials, noise.as_ref(), &learning_rate);
    let doc = RunSummary {
        command: "python train.py --batch-size {batch}".into(),
        launch_command: None,
        world_size: 1,
        device,
        noise,
        advice,
        target_loss,
        trials,
        max_batch: Some(320),
        smallest_failure: Some(384),
        stopped_at: None,
        capped: false,
        search_trials: 11,
        memory_limit_bytes: None,
        batch_with_margin: None,
        seconds: 7.0,
        learning_rate,
    };
    insta::assert_snapshot!("run_text", batchfit_report::run::render(&doc));
    insta::assert_snapshot!(
        "run_json",
        serde_json::to_string_pretty(&RunDocument::new(&doc)).unwrap()
    );
}
