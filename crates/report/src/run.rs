//! The `run` report: every trial of the user's own training command, the
//! largest batch that runs and the knee, as a table, JSON and an HTML page.

use crate::plots::{Figure, Series, SeriesKind};
use crate::probe::DeviceProbe;
use crate::{align_numbers, esc, table, thousands};
use batchfit_exec::TrialResult;
use batchfit_plan::Bytes;
use batchfit_tune::advice::Recommendation;
use batchfit_tune::diagnose::Finding;
use batchfit_tune::target::TimeToTarget;
use serde::Serialize;

/// One trial and why it was run.
#[derive(Clone, Debug, Serialize)]
pub struct RunTrial {
    /// doubling, bisection, knee refinement or listed (--batches).
    pub reason: &'static str,
    #[serde(flatten)]
    pub result: TrialResult,
}

/// The JSON document of `batchfit run --json`.
#[derive(Clone, Debug, Serialize)]
pub struct RunDocument {
    pub schema_version: u32,
    pub kind: &'static str,
    /// The command as given, with its `{batch}` placeholder.
    pub command: String,
    /// What was run under `--launcher`: the launcher around the command.
    pub launch_command: Option<String>,
    /// Data-parallel workers (1 without a launcher); `batch` is per worker.
    pub world_size: u32,
    /// The same shape as `probe`'s devices (one entry: where the command ran).
    pub devices: Vec<DeviceProbe>,
    /// Every trial in the order it ran.
    pub trials: Vec<RunTrial>,
    /// Largest batch that ran (measured), exact when `smallest_failure` = it + 1.
    pub max_batch: Option<u64>,
    /// Smallest batch that ran out of memory (measured).
    pub smallest_failure: Option<u64>,
    /// A crash or time-out that stopped the search, if one did.
    pub stopped_at: Option<u64>,
    /// The search reached --max-batch still running.
    pub capped: bool,
    /// Trials the max-batch search took (knee refinements not counted).
    pub search_trials: usize,
    /// `--memory-limit`: each process of a trial could map at most this (RLIMIT_AS).
    pub memory_limit_bytes: Option<Bytes>,
    /// `--margin`: the largest batch leaving that share of the limit free (predicted).
    pub batch_with_margin: Option<u64>,
    pub seconds: f64,
    /// The gradient noise scale of the command's own training, when it
    /// reported noise measurements (the Python helper, docs/run.md).
    pub noise: Option<RunNoise>,
    /// What to train with, from the measured curve (and the noise scale when known).
    pub recommendation: Option<Recommendation>,
    /// Every (batch, accumulation) option ranked by predicted time to target
    /// (empty without a noise scale).
    pub time_to_target: Vec<TimeToTarget>,
    /// The loss the noise trial reached; seconds are predicted for it.
    pub target_loss: Option<f64>,
    pub findings: Vec<Finding>,
}

/// The noise scale measured in one trial of the user's command.
#[derive(Clone, Debug, Serialize)]
pub struct RunNoise {
    /// The trial it comes from (the one with the most noise measurements).
    pub batch: u64,
    /// B_simple at the end of that trial, with its 90 % band (measured).
    pub b_simple: f64,
    pub b_simple_low: f64,
    /// `None`: unbounded.
    pub b_simple_high: Option<f64>,
    /// Noise measurements and optimizer steps in that trial.
    pub measurements: usize,
    pub steps: usize,
    /// S_min of S(B) = S_min (1 + B_noise/B) through that trial's steps to its final loss (predicted).
    pub s_min: Option<f64>,
    /// B_simple of every trial that reported noise: (batch, B_simple).
    pub per_trial: Vec<(u64, f64)>,
}

fn bytes(b: Option<u64>) -> String {
    b.map(|b| Bytes(b).to_string())
        .unwrap_or_else(|| "-".into())
}

/// The trial log, then what it found.
pub fn render(d: &RunDocument) -> String {
    let mut out = format!(
        "\n{} (measured: each trial a fresh process tree)\n",
        d.launch_command.as_deref().unwrap_or(&d.command)
    );
    let ranked = d.world_size > 1;
    if ranked {
        out.push_str(&format!(
            "world size {}: batch is the per-device micro-batch; step = the slowest rank's median; samples/s = micro-batch x {} / that rank's step\n",
            d.world_size, d.world_size
        ));
    }
    let mut header = vec![
        "#",
        "batch",
        "why",
        "outcome",
        "wall",
        if ranked {
            "step (slowest rank)"
        } else {
            "step (median)"
        },
        "samples/s",
        "peak host",
        "peak GPU",
    ];
    if ranked {
        header.extend(["max rank host", "max rank GPU"]);
    }
    header.extend(["GPU util", ""]);
    let mut t = table(&header);
    let dev = d.devices.first();
    for (i, tr) in d.trials.iter().enumerate() {
        let r = &tr.result;
        let mut mark = Vec::new();
        if dev.and_then(|d| d.knee_batch) == Some(r.batch) && r.outcome.label() == "ran" {
            mark.push("knee");
        }
        if d.max_batch == Some(r.batch) && r.outcome.label() == "ran" {
            mark.push("max");
        }
        if r.steps.as_ref().is_some_and(|s| s.step_time.noisy()) {
            mark.push("noisy");
        }
        let mut row = vec![
            (i + 1).to_string(),
            thousands(r.batch),
            tr.reason.to_string(),
            r.outcome.label().to_string(),
            crate::duration(r.wall_s),
            r.steps
                .as_ref()
                .map(|s| crate::duration(s.step_time.median))
                .unwrap_or_else(|| "-".into()),
            r.steps
                .as_ref()
                .map(|s| format!("{:.0}", s.samples_per_s))
                .unwrap_or_else(|| "-".into()),
            bytes(r.peak_host_bytes),
            bytes(r.peak_gpu_bytes),
        ];
        if ranked {
            row.push(bytes(
                r.ranks.iter().filter_map(|x| x.peak_host_bytes).max(),
            ));
            row.push(bytes(r.ranks.iter().filter_map(|x| x.peak_gpu_bytes).max()));
        }
        row.push(
            r.gpu_util_mean_pct
                .zip(r.gpu_util_max_pct)
                .map(|(m, x)| format!("{m:.0} % (max {x})"))
                .unwrap_or_else(|| "-".into()),
        );
        row.push(mark.join(", "));
        t.add_row(row);
    }
    align_numbers(&mut t, 0);
    out.push_str(&t.to_string());
    out.push('\n');

    match (d.max_batch, d.smallest_failure) {
        (Some(m), Some(f)) if f == m + 1 => out.push_str(&format!(
            "largest batch that runs: {} (exact: {} ran out of memory)",
            thousands(m),
            thousands(f)
        )),
        (Some(m), _) if d.capped => out.push_str(&format!(
            "largest batch that runs: at least {} (--max-batch; the limit lies above)",
            thousands(m)
        )),
        (Some(m), Some(f)) => out.push_str(&format!(
            "largest batch that ran: {}; smallest out of memory: {}",
            thousands(m),
            thousands(f)
        )),
        (Some(m), None) => out.push_str(&format!("largest batch that ran: {}", thousands(m))),
        (None, Some(f)) => out.push_str(&format!(
            "no batch ran: batch {} already ran out of memory",
            thousands(f)
        )),
        (None, None) => out.push_str("no batch ran"),
    }
    out.push_str(&format!(
        "; {} trials ({} for the search), {:.1} s{}\n",
        d.trials.len(),
        d.search_trials,
        d.seconds,
        d.memory_limit_bytes
            .map(|l| format!("; each process limited to {l} of address space"))
            .unwrap_or_default()
    ));
    if let Some(b) = d.batch_with_margin {
        out.push_str(&format!(
            "with headroom: batch {} leaves the requested margin free (predicted from the measured peaks)\n",
            thousands(b)
        ));
    }
    if let Some(b) = d.stopped_at {
        out.push_str(&format!(
            "the search stopped at batch {}: it crashed or timed out for a reason other than memory (see below)\n",
            thousands(b)
        ));
    }
    if let Some(dev) = dev {
        match dev.knee_batch {
            Some(k) => out.push_str(&format!(
                "knee: batch {} is the smallest reaching {:.0} % of the best measured throughput{}\n",
                thousands(k),
                dev.efficiency * 100.0,
                crate::knee_noise(dev.knee_range.as_ref())
            )),
            None if d.trials.iter().any(|t| t.result.outcome.label() == "ran") => out.push_str(
                "no throughput: the command reported no step times; print `BATCHFIT {\"seconds\": ...}` per step or pass --throughput-regex (see examples/)\n",
            ),
            None => {}
        }
    }
    if let Some(n) = &d.noise {
        out.push_str(&format!(
            "gradient noise scale of your training: B_simple ≈ {} (90 % band {}–{}; measured in the batch-{} trial, {} measurements over {} steps)\n",
            thousands(n.b_simple.round() as u64),
            thousands(n.b_simple_low.round() as u64),
            n.b_simple_high
                .map(|h| thousands(h.round() as u64))
                .unwrap_or_else(|| "∞".into()),
            thousands(n.batch),
            n.measurements,
            n.steps,
        ));
    }
    if let Some(r) = &d.recommendation
        && let Some(b) = r.recommended_batch
    {
        out.push_str(&format!(
            "\nRECOMMENDATION\n  train with batch {} ({})\n    why: {}\n",
            thousands(b),
            r.learning_rate_rule,
            r.reason
        ));
        if let Some(a) = &r.accumulation {
            out.push_str(&format!(
                "    memory caps the batch below the critical batch: accumulate {} x {} = {} per update\n",
                a.steps,
                thousands(a.micro_batch),
                thousands(a.effective_batch)
            ));
        }
    }
    out.push_str(&crate::advise::time_to_target_table(
        &d.time_to_target,
        d.target_loss,
        "steps from the noise scale x measured step time",
    ));
    if !d.findings.is_empty() {
        out.push_str("\nDIAGNOSIS (from the measurements)\n");
        for f in &d.findings {
            out.push_str(&format!("  - {}\n", f.message));
        }
    }
    for tr in &d.trials {
        let r = &tr.result;
        // Under a launcher, ranks without step lines: their lines lacked "rank".
        let silent: Vec<String> = r
            .ranks
            .iter()
            .filter(|x| x.steps == 0)
            .map(|x| x.rank.to_string())
            .collect();
        if ranked && r.steps.is_some() && !silent.is_empty() {
            out.push_str(&format!(
                "batch {}: rank(s) {} reported no steps; each rank should print \"rank\" in its BATCHFIT lines (lines without one count as rank 0)\n",
                thousands(r.batch),
                silent.join(", ")
            ));
        }
        if r.bad_step_lines > 0 {
            out.push_str(&format!(
                "batch {}: {} BATCHFIT lines did not parse and were skipped\n",
                thousands(r.batch),
                r.bad_step_lines
            ));
        }
        if r.outcome.label() != "out of memory"
            && let Some(detail) = r.outcome.detail()
        {
            out.push_str(&format!(
                "\nbatch {} {}: {}\n",
                thousands(r.batch),
                r.outcome.label(),
                detail
            ));
        }
    }
    out
}

/// Figures: throughput (as `probe`), and peak memory per batch.
pub fn figures(d: &RunDocument) -> Vec<(Figure, String)> {
    let mut figs = vec![crate::probe::throughput_figure(&d.devices)];
    let mib = |b: u64| b as f64 / Bytes::MIB as f64;
    let ran = || {
        d.trials
            .iter()
            .filter(|t| t.result.outcome.label() == "ran")
    };
    let host: Vec<(f64, f64)> = ran()
        .filter_map(|t| {
            t.result
                .peak_host_bytes
                .map(|b| (t.result.batch as f64, mib(b)))
        })
        .collect();
    let gpu: Vec<(f64, f64)> = ran()
        .filter_map(|t| {
            t.result
                .peak_gpu_bytes
                .map(|b| (t.result.batch as f64, mib(b)))
        })
        .collect();
    let mut series = Vec::new();
    for (label, mut pts, color) in [
        ("host, whole process tree (measured)", host, 0),
        ("GPU, NVML (measured)", gpu, 1),
    ] {
        if !pts.is_empty() {
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            series.push(Series {
                label: label.into(),
                points: pts,
                kind: SeriesKind::LineAndPoints,
                color,
            });
        }
    }
    if !series.is_empty() {
        figs.push((
            Figure {
                title: "Peak memory of the training command vs batch size".into(),
                x_label: "batch size".into(),
                y_label: "MiB".into(),
                log_x: true,
                series,
                markers: vec![],
            },
            "Measured: the largest resident memory of the command's process tree seen during each trial (sampled every 100 ms, at least the kernel's peak for the command itself), and the GPU memory NVML attributes to those processes.".into(),
        ));
    }
    figs
}

/// The HTML page: findings, figures, the trial log.
pub fn html(d: &RunDocument) -> String {
    let mut body = format!(
        "<h1>batchfit run</h1>\n<p class=\"meta\">command: <code>{}</code></p>\n",
        esc(&d.command)
    );
    if let Some(l) = &d.launch_command {
        body.push_str(&format!(
            "<p class=\"meta\">launched as: <code>{}</code> (world size {}; batch is per device)</p>\n",
            esc(l),
            d.world_size
        ));
    }
    body.push_str("<h2>Figures</h2>\n");
    body.push_str(&crate::figures_html(figures(d)));
    body.push_str("<h2>Trials</h2>\n<pre>");
    body.push_str(&esc(&render(d)));
    body.push_str("</pre>\n");
    crate::page("run", &body)
}
