//! `batchfit advise`: plan -> probe on each device -> noise on the data -> one recommendation.

use crate::cmd::noise::{DataFlags, NoiseFlags, apply_loss, document, load_data, run_noise};
use crate::cmd::probe::{MeasureFlags, Target, probe_device, progress};
use crate::error::CliResult;
use crate::options::{DEFAULT_MODEL, positive_u64, positive_usize};
use batchfit_data::Dataset;
use batchfit_engine::DeviceSpec;
use batchfit_plan::{TrainOptions, plan};
use batchfit_report::advise::{Accumulation, AdviseDocument, Recommendation, html, render};
use batchfit_report::noise::NoiseDocument;
use batchfit_report::probe::DeviceProbe;
use batchfit_tune::diagnose::{self, Finding, StepPoint};
use batchfit_tune::lr::{LrRule, scale};
use batchfit_tune::target::{TrainingOption, rank};
use clap::Args;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args)]
pub struct AdviseArgs {
    /// zoo:NAME, a .toml layer spec or an .onnx file [default: zoo:digits-mlp with the shipped digits data].
    pub model: Option<String>,
    #[command(flatten)]
    pub measure: MeasureFlags,
    #[command(flatten)]
    pub data: DataFlags,
    /// Steps of the noise-scale run (0 skips it).
    #[arg(long, default_value_t = 200)]
    pub noise_steps: usize,
    /// Small batch of the noise-scale estimator.
    #[arg(long, default_value_t = 16, value_parser = positive_usize)]
    pub b_small: usize,
    /// Small batches per noise measurement (B_big = k x B_small).
    #[arg(long, default_value_t = 8)]
    pub k: usize,
    /// The batch size your learning rate was tuned at.
    #[arg(long, value_parser = positive_u64, requires = "ref_lr")]
    pub ref_batch: Option<u64>,
    /// The learning rate tuned at --ref-batch.
    #[arg(long, requires = "ref_batch")]
    pub ref_lr: Option<f64>,
    /// Write a self-contained HTML report with plots here.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// Print everything as JSON (schema: docs/json.md).
    #[arg(long)]
    pub json: bool,
}

pub fn run(mut args: AdviseArgs) -> CliResult {
    let default_model = args.model.is_none();
    let source = args
        .model
        .clone()
        .unwrap_or_else(|| DEFAULT_MODEL.to_string());
    let mut graph = crate::options::load_model(Some(&source))?;
    apply_loss(&mut graph, args.data.loss.as_deref())?;
    batchfit_engine::model::check_trainable(&graph).map_err(crate::options::input)?;
    if args.measure.device.is_empty() {
        args.measure.device = DeviceSpec::available()
            .iter()
            .map(|d| d.to_string())
            .collect();
    }
    let devices = args.measure.devices()?;
    if let Some(path) = &args.html {
        crate::options::check_output_folder("--html", path)?;
    }
    let seq_len = args.measure.seq_len.or(graph.default_seq_len).unwrap_or(1);
    let data: Option<Dataset> = if args.data.data.is_some() || default_model {
        Some(load_data(&args.data, &graph, seq_len, default_model)?)
    } else {
        None
    };
    let bar = progress(args.json);

    // Noise scale first: it is quick and decides what "a good batch" means statistically.
    let noise: Option<NoiseDocument> = match (&data, args.noise_steps) {
        (Some(d), steps) if steps > 0 => {
            let flags = NoiseFlags {
                lr: args.measure.lr,
                optimizer: args.measure.optimizer,
                steps,
                b_small: args.b_small,
                k: args.k.max(2),
                beta: None,
                batches: Vec::new(),
                ref_batch: args.ref_batch,
                ref_lr: args.ref_lr,
                init: "checkpoint".into(),
                seed: args.measure.seed,
                threads: None,
            };
            bar.set_length(steps as u64);
            bar.set_message("noise scale on the data");
            let outcome = run_noise(&flags, &graph, d, seq_len, |_| bar.inc(1))?;
            bar.set_position(0);
            bar.set_length(0);
            Some(document(&flags, &graph, d, outcome))
        }
        _ => None,
    };

    let target = Target {
        source: source.clone(),
        graph: &graph,
        seq_len,
    };
    let mut probes = Vec::new();
    for &d in &devices {
        probes.push(probe_device(&args.measure, &target, d, &bar)?);
    }
    bar.finish_and_clear();

    let plan_cpu = plan(
        &graph,
        &TrainOptions {
            optimizer: args.measure.optimizer,
            seq_len: args.measure.seq_len,
            ..TrainOptions::default()
        },
    );
    let b_noise = noise.as_ref().and_then(|n| n.b_simple);
    let rule = LrRule::for_optimizer(args.measure.optimizer.is_adaptive());
    let mut recommendations = Vec::new();
    let mut options = Vec::new();
    let mut findings: Vec<Finding> = Vec::new();
    for p in &probes {
        let (rec, opts) = recommend(p, &plan_cpu, b_noise, rule, args.ref_batch.zip(args.ref_lr));
        let points = step_points(p);
        findings.extend(diagnose::flat_throughput(&points, &p.device));
        findings.extend(diagnose::fixed_overhead(&points, &p.device));
        if let (Some(b), Some(m)) = (rec.recommended_batch, rec.max_batch)
            && rec.max_batch_source == "measured"
        {
            findings.extend(diagnose::near_memory_limit(b, m, &p.device));
        }
        if let (Some(d), Some(b)) = (&data, rec.recommended_batch)
            && let Some(step) = points.iter().find(|q| q.batch == b)
        {
            findings.extend(diagnose::input_bound(
                batch_load_seconds(d, &graph, b as usize),
                step.step_s,
                b,
                &p.device,
            ));
        }
        if let Some(bn) = b_noise {
            let knee = p.knee_batch.unwrap_or(0);
            let largest = p
                .points
                .iter()
                .filter(|q| q.ok())
                .map(|q| q.batch)
                .max()
                .unwrap_or(0);
            for b in [knee, largest] {
                if let Some(f) = diagnose::above_critical(b, bn) {
                    findings.push(Finding {
                        rule: f.rule,
                        message: format!("{}: {}", p.device, f.message),
                    });
                    break;
                }
            }
        }
        recommendations.push(rec);
        options.extend(opts);
    }
    // S_min from the noise run: it took `steps` updates at B_big to reach its final loss.
    let (target_loss, s_min) = match (&noise, b_noise) {
        (Some(n), Some(bn)) if n.lr > 0.0 => {
            let tail = &n.history[n.history.len() * 9 / 10..];
            let loss = tail.iter().map(|r| r.loss).sum::<f64>() / tail.len().max(1) as f64;
            (
                Some(loss),
                Some(n.steps as f64 / (1.0 + bn / n.b_big as f64)),
            )
        }
        _ => (None, None),
    };
    let time_to_target = b_noise
        .map(|bn| rank(&options, bn, s_min))
        .unwrap_or_default();
    let budgets = args
        .measure
        .memory_limit
        .map(|m| devices.iter().map(|d| (d.to_string(), m)).collect())
        .unwrap_or_default();
    let doc = AdviseDocument {
        schema_version: batchfit_report::SCHEMA_VERSION,
        kind: "advise",
        model: graph.name.clone(),
        parameters: graph.param_count(),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        machine: machine(),
        data: data.as_ref().map(|d| d.source.clone()),
        plan: plan_cpu,
        devices: probes,
        noise,
        recommendations,
        time_to_target,
        target_loss,
        findings,
        budgets,
    };
    crate::options::emit_with_html(&doc, args.json, render, args.html.as_deref(), html)?;
    Ok(())
}

fn step_points(p: &DeviceProbe) -> Vec<StepPoint> {
    p.points
        .iter()
        .filter(|q| q.ok())
        .map(|q| StepPoint {
            batch: q.batch,
            step_s: q.step_time_s,
        })
        .collect()
}

/// The recommendation for one device and its training options for the time-to-target table.
fn recommend(
    p: &DeviceProbe,
    plan_cpu: &batchfit_plan::Plan,
    b_noise: Option<f64>,
    rule: LrRule,
    reference: Option<(u64, f64)>,
) -> (Recommendation, Vec<TrainingOption>) {
    let points = step_points(p);
    let (max_batch, source) = match p.max_batch {
        Some(m) => (Some(m), "measured"),
        None if p.device == "cpu" => (
            batchfit_plan::devices::host_memory().and_then(|m| plan_cpu.max_batch(m)),
            "predicted for this machine's RAM",
        ),
        None => (None, "not searched: give --memory-limit"),
    };
    let fits = |b: u64| max_batch.is_none_or(|m| b <= m);
    let mut options: Vec<TrainingOption> = points
        .iter()
        .filter(|q| fits(q.batch))
        .map(|q| TrainingOption {
            device: p.device.clone(),
            micro_batch: q.batch,
            accumulation: 1,
            micro_step_s: q.step_s,
        })
        .collect();
    let (recommended, reason) = match b_noise {
        Some(bn) => {
            let best = options.iter().min_by(|a, b| {
                ((1.0 + bn / a.micro_batch as f64) * a.micro_step_s)
                    .total_cmp(&((1.0 + bn / b.micro_batch as f64) * b.micro_step_s))
            });
            match best {
                Some(o) => (
                    Some(o.micro_batch),
                    format!(
                        "fastest predicted time to target among the measured batches: (1 + B_noise/B) x step time is lowest at B = {} (B_noise ≈ {:.0}, step {:.2} ms measured)",
                        o.micro_batch,
                        bn,
                        o.micro_step_s * 1e3
                    ),
                ),
                None => (None, "no batch size could be measured".into()),
            }
        }
        None => (
            p.knee_batch,
            format!(
                "the smallest batch reaching {:.0} % of the best measured throughput (no data was given, so the statistical side is unknown: add --data to weigh steps needed)",
                p.efficiency * 100.0
            ),
        ),
    };
    // Accumulation where memory caps the batch below the critical batch.
    let accumulation = match (b_noise, max_batch) {
        (Some(bn), Some(m)) if (m as f64) < bn => points
            .iter()
            .filter(|q| q.batch <= m)
            .max_by_key(|q| q.batch)
            .map(|q| {
                let steps = (bn / q.batch as f64).ceil().max(2.0) as u64;
                options.push(TrainingOption {
                    device: p.device.clone(),
                    micro_batch: q.batch,
                    accumulation: steps,
                    micro_step_s: q.step_s,
                });
                Accumulation {
                    micro_batch: q.batch,
                    steps,
                    effective_batch: q.batch * steps,
                    update_s: q.step_s * steps as f64,
                }
            }),
        _ => None,
    };
    let lr = match (reference, recommended) {
        (Some((rb, rl)), Some(b)) => Some(scale(rule, rb, rl, b)),
        _ => None,
    };
    let rule_text = match rule {
        LrRule::Sqrt => {
            "learning rate: your tuned lr x sqrt(B / your batch), square-root rule for Adam (Malladi et al. 2022); give --ref-batch/--ref-lr for a number"
        }
        _ => {
            "learning rate: your tuned lr x B / your batch, linear rule with warm-up for SGD (Goyal et al. 2017); give --ref-batch/--ref-lr for a number"
        }
    };
    (
        Recommendation {
            device: p.device.clone(),
            max_batch,
            max_batch_source: source,
            knee_batch: p.knee_batch,
            recommended_batch: recommended,
            reason,
            learning_rate: lr,
            learning_rate_rule: rule_text.to_string(),
            accumulation,
        },
        options,
    )
}

/// Median seconds to gather `b` rows and build the batch tensors.
fn batch_load_seconds(d: &Dataset, graph: &batchfit_graph::Graph, b: usize) -> f64 {
    let device = burn_device();
    let mut batcher = batchfit_data::Batcher::new(d.rows, 0);
    let mut times = Vec::new();
    for _ in 0..5 {
        let idx = batcher.next(b);
        let t0 = Instant::now();
        let batch = batchfit_engine::data::from_rows(d, graph, &idx, &device);
        drop(batch);
        times.push(t0.elapsed().as_secs_f64());
    }
    batchfit_tune::stats::summarize(&times).median
}

fn burn_device() -> batchfit_engine::burn::tensor::Device {
    DeviceSpec::Cpu.device().expect("the CPU is always built")
}

/// "AMD EPYC ... (2 cores), 23.4 GiB RAM".
fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let ram = batchfit_plan::devices::host_memory()
        .map(|b| b.to_string())
        .unwrap_or_else(|| "? RAM".into());
    format!("{cpu} ({cores} cores), {ram} RAM")
}
