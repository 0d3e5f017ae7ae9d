//! The `run` report: every trial of the user's own training command, the
//! largest batch that runs and the knee, as a table, JSON and an HTML page.

use crate::json::{FindingJson, RecommendationJson};
use crate::plots::{Figure, Series, SeriesKind};
use crate::{align_numbers, esc, prose, table, thousands};
use batchfit_plan::Bytes;
use batchfit_tune::probe::DeviceProbe;
use batchfit_tune::run::{RunNoise, RunRate, RunSummary};
use batchfit_tune::target::{RateModel, TimeToTarget};
use batchfit_tune::trial::{Outcome, RunTrial};
use batchfit_tune::verify::RunVerifyReport;
use serde::Serialize;

/// The JSON document of `batchfit run --json`.
#[derive(Serialize)]
pub struct RunDocument<'a> {
    pub schema_version: u32,
    pub kind: &'static str,
    /// The command as given, with its `{batch}` placeholder.
    pub command: &'a str,
    /// What was run under `--launcher`: the launcher around the command.
    pub launch_command: Option<&'a str>,
    /// Data-parallel workers (1 without a launcher); `batch` is per worker.
    pub world_size: u32,
    /// The same shape as `probe`'s devices (one entry: where the command ran).
    pub devices: [&'a DeviceProbe; 1],
    /// Every trial in the order it ran.
    pub trials: &'a [RunTrial],
    pub max_batch: Option<u64>,
    pub smallest_failure: Option<u64>,
    pub stopped_at: Option<u64>,
    pub capped: bool,
    pub search_trials: usize,
    pub memory_limit_bytes: Option<Bytes>,
    pub batch_with_margin: Option<u64>,
    pub seconds: f64,
    pub noise: Option<&'a RunNoise>,
    pub recommendation: Option<RecommendationJson<'a>>,
    pub time_to_target: &'a [TimeToTarget],
    pub target_loss: Option<f64>,
    /// How the trials' learning rate was set: `handed` (with the rule, its
    /// reference pair and whether the command has `{lr}`) or `commands_own`
    /// (with the rule the prediction assumes).
    pub learning_rate: &'a RunRate,
    /// How the predicted updates follow the batch: `scaled` (each trial at
    /// the rule's rate) or `fixed` (the command's one rate, with `best_at`).
    pub rate_model: RateModel,
    /// The same, in words.
    pub learning_rate_note: String,
    pub findings: Vec<FindingJson>,
}

impl<'a> RunDocument<'a> {
    pub fn new(d: &'a RunSummary) -> Self {
        RunDocument {
            schema_version: crate::SCHEMA_VERSION,
            kind: "run",
            command: &d.command,
            launch_command: d.launch_command.as_deref(),
            world_size: d.world_size,
            devices: [&d.device],
            trials: &d.trials,
            max_batch: d.max_batch,
            smallest_failure: d.smallest_failure,
            stopped_at: d.stopped_at,
            capped: d.capped,
            search_trials: d.search_trials,
            memory_limit_bytes: d.memory_limit_bytes,
            batch_with_margin: d.batch_with_margin,
            seconds: d.seconds,
            noise: d.noise.as_ref(),
            recommendation: d
                .advice
                .recommendation
                .as_ref()
                .map(RecommendationJson::new),
            time_to_target: &d.advice.time_to_target,
            target_loss: d.target_loss,
            learning_rate: &d.learning_rate,
            rate_model: d
                .learning_rate
                .rate_model(d.noise.as_ref().map(|n| n.batch)),
            learning_rate_note: prose::run_rate(
                &d.learning_rate,
                d.learning_rate
                    .rate_model(d.noise.as_ref().map(|n| n.batch)),
            ),
            findings: FindingJson::all(&d.advice.findings),
        }
    }
}

fn bytes(b: Option<u64>) -> String {
    b.map(|b| Bytes(b).to_string())
        .unwrap_or_else(|| "-".into())
}

/// The trial log, then what it found.
pub fn render(d: &RunSummary) -> String {
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
    let dev = Some(&d.device);
    for (i, tr) in d.trials.iter().enumerate() {
        let r = &tr.result;
        let mut mark = Vec::new();
        if dev.and_then(|d| d.knee_batch) == Some(r.batch) && r.outcome.ran() {
            mark.push("knee");
        }
        if d.max_batch == Some(r.batch) && r.outcome.ran() {
            mark.push("max");
        }
        if r.steps.as_ref().is_some_and(|s| s.step_time.noisy()) {
            mark.push("noisy");
        }
        let mut row = vec![
            (i + 1).to_string(),
            thousands(r.batch),
            tr.reason.label().to_string(),
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
            None if d.trials.iter().any(|t| t.result.outcome.ran()) => out.push_str(
                "no throughput: the command reported no step times; print `BATCHFIT {\"seconds\": ...}` per step or pass --throughput-regex (see examples/)\n",
            ),
            None => {}
        }
    }
    if let Some(n) = &d.noise {
        out.push_str(&format!(
            "gradient noise scale of your training: B_noise ≈ {} (90 % band {}–{}), measured in the batch-{} trial: {} measurements over {} steps{}\n  {}; the trial's end value B_simple ≈ {}\n",
            thousands(n.b_noise.round() as u64),
            thousands(n.b_noise_low.round() as u64),
            n.b_noise_high
                .map(|h| thousands(h.round() as u64))
                .unwrap_or_else(|| "∞".into()),
            thousands(n.batch),
            n.measurements,
            n.steps,
            n.steps_to_target
                .map(|s| format!(
                    ", the target after {s:.0}{}",
                    if n.target_on_fixed_rows {
                        " (on the loss of fixed training rows the lines carried)"
                    } else {
                        ""
                    }
                ))
                .unwrap_or_default(),
            prose::run_noise_method(n),
            thousands(n.b_simple.round() as u64),
        ));
        if !n.checks.is_empty() {
            out.push_str("  the other trials as rate checks: each trained at its batch's rate for the command's steps, to the noise trial's target (measured):\n");
            for c in &n.checks {
                out.push_str(&format!("    {}\n", prose::rate_check(c)));
            }
            let failed = batchfit_tune::stability::failed_from(&n.checks);
            let unreached = batchfit_tune::stability::unreached_to(&n.checks);
            let refit = n.b_noise_run.map(|run| (n.b_noise, run));
            if let Some(o) = prose::rate_outcome(None, failed, unreached, refit) {
                out.push_str(&format!("    {o}\n"));
            }
            if let Some(none) = prose::none_trained(&n.checks) {
                out.push_str(&format!("    {none}\n"));
            }
        }
    }
    if let Some(r) = &d.advice.recommendation
        && let Some(b) = r.recommended_batch
    {
        let rate = match r.learning_rate {
            Some(lr) => format!(" at learning rate {lr:.3e}"),
            None => format!(" ({})", prose::learning_rate_rule(r)),
        };
        out.push_str(&format!(
            "\nRECOMMENDATION\n  train with batch {}{rate}\n    why: {}\n",
            thousands(b),
            prose::reason(&r.reason)
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
    if !d.advice.time_to_target.is_empty() {
        let model = d
            .learning_rate
            .rate_model(d.noise.as_ref().map(|n| n.batch));
        out.push_str(&format!("  {}\n", prose::run_rate(&d.learning_rate, model)));
    }
    let source = match d
        .learning_rate
        .rate_model(d.noise.as_ref().map(|n| n.batch))
    {
        RateModel::Scaled => "steps from the noise scale x measured step time",
        RateModel::Fixed { .. } => {
            "steps from the noise scale at the command's one fixed rate x measured step time"
        }
    };
    out.push_str(&crate::advise::time_to_target_table(
        &d.advice.time_to_target,
        d.target_loss,
        source,
    ));
    out.push_str(&crate::advise::diagnosis(&d.advice.findings));
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
        if !matches!(r.outcome, Outcome::OutOfMemory(_))
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
pub fn figures(d: &RunSummary) -> Vec<(Figure, String)> {
    let mut figs = vec![crate::probe::throughput_figure(std::slice::from_ref(
        &d.device,
    ))];
    let mib = |b: u64| b as f64 / Bytes::MIB as f64;
    let ran = || d.trials.iter().filter(|t| t.result.outcome.ran());
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
pub fn html(d: &RunSummary) -> String {
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

/// `run --verify --json`.
#[derive(Serialize)]
pub struct RunVerifyDocument<'a> {
    pub schema_version: u32,
    pub kind: &'static str,
    #[serde(flatten)]
    pub report: &'a RunVerifyReport,
    /// The verdict in words.
    pub verdict_line: String,
}

impl<'a> RunVerifyDocument<'a> {
    pub fn new(report: &'a RunVerifyReport) -> Self {
        RunVerifyDocument {
            schema_version: crate::SCHEMA_VERSION,
            kind: "run_verify",
            report,
            verdict_line: prose::verdict_line(report.verdict.recommended, report.verdict.outcome),
        }
    }
}

/// `run --verify`: each training, then predicted beside measured and the verdict.
pub fn render_verify(v: &RunVerifyReport) -> String {
    let mut out = format!(
        "\n{} (measured: each training a fresh process tree)\n",
        v.command
    );
    let mut t = table(&[
        "batch",
        "seed",
        "outcome",
        "lr",
        "steps reported",
        "steps to target",
        "time to target",
    ]);
    for tr in &v.trials {
        let r = &tr.result;
        t.add_row(vec![
            thousands(tr.batch),
            tr.seed.to_string(),
            r.outcome.label().to_string(),
            r.learning_rate.map_or("-".into(), |l| format!("{l:.3e}")),
            r.reports.len().to_string(),
            tr.steps_to_target
                .map_or("not reached".into(), |s| format!("{s:.0}")),
            tr.seconds_to_target.map_or("-".into(), crate::duration),
        ]);
    }
    align_numbers(&mut t, 0);
    out.push_str(&t.to_string());
    out.push('\n');
    let statistic = if v.target.fixed_rows {
        "on the fixed training rows' loss the lines carry; steps interpolated between its evaluations".to_string()
    } else {
        format!(
            "the mean of {} reported losses; steps counted to the middle of the first such window at it",
            v.target.window
        )
    };
    out.push_str(&format!(
        "\nPREDICTED (run {}) BESIDE MEASURED (mean ± sd over {} seeds), to loss {:.4} ({statistic})\n",
        v.advice, v.seeds, v.target.target
    ));
    out.push_str(&match &v.learning_rate {
        RunRate::Handed { scaling, .. } => format!(
            "  each training at lr(B) = {}, as the run trained its trials\n",
            prose::formula(scaling)
        ),
        RunRate::CommandsOwn { .. } => {
            "  each training at the command's own rate, as the run's trials were\n".to_string()
        }
    });
    out.push_str(&crate::sweep::verify_rows(&v.rows, &v.verdict));
    out
}
