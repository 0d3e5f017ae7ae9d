//! The `probe` report: measured throughput and memory per batch, per device.

use crate::plots::{Figure, Marker, Series, SeriesKind};
use crate::{align_numbers, table, thousands};
use batchfit_plan::Bytes;
use batchfit_tune::search::TrialRecord;
use batchfit_tune::stats::Summary;
use serde::Serialize;

/// One measured batch size.
#[derive(Clone, Debug, Serialize)]
pub struct ProbePoint {
    pub batch: u64,
    /// Median seconds per training step (measured).
    pub step_time_s: f64,
    pub step_time_p10_s: f64,
    pub step_time_p90_s: f64,
    /// Mean seconds per step (measured): what a training's total time grows
    /// by per step, slow steps included; null where not measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_time_mean_s: Option<f64>,
    /// Standard error of the median step time, relative to it (measured spread).
    pub step_time_rel_err: f64,
    pub steps_timed: usize,
    /// batch / median step time (measured).
    pub samples_per_s: f64,
    /// Counting-allocator high-water mark (measured); null where not measurable.
    pub peak_bytes: Option<Bytes>,
    /// Peak RSS of the measuring process (measured).
    pub peak_rss_bytes: Option<Bytes>,
    /// The plan's peak at this batch (predicted); null where nothing was planned (`run`).
    pub planned_bytes: Option<Bytes>,
    /// (planned - measured) / measured, percent.
    pub plan_error_pct: Option<f64>,
    /// Whether the spread of the timings is wide (outliers, p10-p90 over 25 % of the median).
    pub noisy: bool,
    /// Out of memory, crashed or timed out instead of measured.
    pub failure: Option<String>,
}

impl ProbePoint {
    /// A measured point from its timing summary.
    pub fn measured(
        batch: u64,
        s: &Summary,
        peak: Option<u64>,
        rss: Option<u64>,
        planned: Option<Bytes>,
    ) -> ProbePoint {
        ProbePoint {
            batch,
            step_time_s: s.median,
            step_time_p10_s: s.p10,
            step_time_p90_s: s.p90,
            step_time_mean_s: Some(s.mean),
            step_time_rel_err: s.rel_std_err,
            steps_timed: s.n,
            samples_per_s: batch as f64 / s.median,
            peak_bytes: peak.map(Bytes),
            peak_rss_bytes: rss.map(Bytes),
            planned_bytes: planned,
            plan_error_pct: peak
                .filter(|&p| p > 0)
                .zip(planned)
                .map(|(p, planned)| 100.0 * (planned.as_f64() - p as f64) / p as f64),
            noisy: s.noisy(),
            failure: None,
        }
    }

    /// A batch that did not run.
    pub fn failed(batch: u64, planned: Option<Bytes>, why: String) -> ProbePoint {
        ProbePoint {
            batch,
            step_time_s: f64::NAN,
            step_time_p10_s: f64::NAN,
            step_time_p90_s: f64::NAN,
            step_time_mean_s: None,
            step_time_rel_err: f64::NAN,
            steps_timed: 0,
            samples_per_s: 0.0,
            peak_bytes: None,
            peak_rss_bytes: None,
            planned_bytes: planned,
            plan_error_pct: None,
            noisy: false,
            failure: Some(why),
        }
    }

    pub fn ok(&self) -> bool {
        self.failure.is_none()
    }
}

/// The search for the largest batch that fits.
#[derive(Clone, Debug, Serialize)]
pub struct MaxBatchSearch {
    pub budget_bytes: Bytes,
    /// Largest batch that ran (measured).
    pub max_batch: Option<u64>,
    /// Smallest batch that ran out of memory (measured).
    pub smallest_failure: Option<u64>,
    /// The plan's limit before calibration (predicted).
    pub planned_limit: Option<u64>,
    /// The limit from the calibrated line (predicted, then confirmed).
    pub predicted_limit: u64,
    /// The batch whose crash or time-out stopped the search (not out of memory).
    pub stopped_at: Option<u64>,
    /// How that trial ended.
    pub stop_reason: Option<String>,
    pub trials: Vec<TrialRecord>,
    pub seconds: f64,
}

/// Everything measured on one device.
#[derive(Clone, Debug, Serialize)]
pub struct DeviceProbe {
    pub device: String,
    /// CPU threads, for the CPU.
    pub threads: Option<usize>,
    pub points: Vec<ProbePoint>,
    /// Largest batch that fits (measured by the search), else null.
    pub max_batch: Option<u64>,
    /// Smallest batch within `efficiency` of the best throughput (measured).
    pub knee_batch: Option<u64>,
    /// Where the knee lies given the timings' errors, and from which batch the
    /// throughput is flat within them.
    pub knee_range: Option<batchfit_tune::knee::KneeRange>,
    pub efficiency: f64,
    /// Trial steps the max-batch search took (0 when it did not run).
    pub search_trials: usize,
    pub search: Option<MaxBatchSearch>,
    pub seconds: f64,
    /// Under a time budget (`advise --budget`): what it left unmeasured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget: Option<ProbeBudget>,
}

/// What a time budget left unmeasured.
#[derive(Clone, Debug, Serialize)]
pub struct ProbeBudget {
    pub budget_s: f64,
    /// Batches the sampling would have measured but whose predicted cost passed the budget.
    pub not_measured: Vec<u64>,
    /// The first of them: its step predicted from the measured batch below it (a prediction).
    pub predicted_step_s: Option<f64>,
}

impl ProbeBudget {
    /// One sentence on what was left out, or `None` when nothing was.
    pub fn describe(&self) -> Option<String> {
        let (first, last) = (self.not_measured.first()?, self.not_measured.last()?);
        let batches = if first == last {
            format!("batch {}", crate::thousands(*first))
        } else {
            format!(
                "batches {} to {}",
                crate::thousands(*first),
                crate::thousands(*last)
            )
        };
        Some(format!(
            "within the {} budget (--budget) {batches} were not measured{}; the knee and the advice come from the batches measured, and a larger batch may run faster: raise --budget or give --batches to measure it",
            crate::duration(self.budget_s),
            self.predicted_step_s.map_or(String::new(), |s| format!(
                " (batch {}'s step predicted at {} from the batch below it)",
                crate::thousands(*first),
                crate::duration(s)
            ))
        ))
    }
}

/// The JSON document of `batchfit probe --json`.
#[derive(Serialize)]
pub struct ProbeDocument<'a> {
    pub schema_version: u32,
    pub kind: &'static str,
    pub model: &'a str,
    pub parameters: u64,
    pub optimizer: &'a str,
    pub devices: &'a [DeviceProbe],
    /// Notes on how the model was exported (an ONNX model that looks exported in eval mode).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// Samples per second: whole numbers, with two decimals below 10 (a slow
/// device's 0.42 is not 0).
fn rate(samples_per_s: f64) -> String {
    if samples_per_s < 10.0 {
        format!("{samples_per_s:.2}")
    } else {
        format!("{samples_per_s:.0}")
    }
}

fn planned(p: &ProbePoint) -> String {
    p.planned_bytes
        .map(|b| b.to_string())
        .unwrap_or_else(|| "-".into())
}

/// One table per device, then the side-by-side summary.
pub fn render(model: &str, devices: &[DeviceProbe]) -> String {
    let mut out = String::new();
    for d in devices {
        out.push_str(&format!(
            "\n{} on {}{} (measured: real training steps, device synchronised)\n",
            model,
            d.device,
            d.threads
                .map(|t| format!(", {t} threads"))
                .unwrap_or_default()
        ));
        let mut t = table(&[
            "batch",
            "step (median)",
            "p10 – p90",
            "samples/s",
            "peak memory",
            "planned",
            "plan error",
            "",
        ]);
        for p in &d.points {
            let mut mark = Vec::new();
            if Some(p.batch) == d.knee_batch {
                mark.push("knee");
            }
            if Some(p.batch) == d.max_batch {
                mark.push("max fit");
            }
            if p.noisy {
                mark.push("noisy");
            }
            match &p.failure {
                Some(why) => t.add_row(vec![
                    thousands(p.batch),
                    why.clone(),
                    String::new(),
                    String::new(),
                    String::new(),
                    planned(p),
                    String::new(),
                    String::new(),
                ]),
                None => t.add_row(vec![
                    thousands(p.batch),
                    crate::duration(p.step_time_s),
                    format!(
                        "{} – {}",
                        crate::duration(p.step_time_p10_s),
                        crate::duration(p.step_time_p90_s)
                    ),
                    rate(p.samples_per_s),
                    p.peak_bytes
                        .map(|b| b.to_string())
                        .unwrap_or_else(|| "n/a".into()),
                    planned(p),
                    p.plan_error_pct
                        .map(|e| format!("{e:+.1}%"))
                        .unwrap_or_default(),
                    mark.join(", "),
                ]),
            };
        }
        align_numbers(&mut t, 0);
        out.push_str(&t.to_string());
        out.push('\n');
        if d.points.iter().any(|p| p.noisy) {
            out.push_str("warning: statistical outliers were detected in rows marked noisy; consider re-running on a quiet system.\n");
        }
        if let Some(s) = &d.search {
            out.push_str(&format!(
                "largest batch under {}: {} (measured; next size up {}), found in {} trial steps, {:.1} s; plan predicted {}, calibrated line {}\n",
                s.budget_bytes,
                s.max_batch.map(thousands).unwrap_or_else(|| "none".into()),
                s.smallest_failure
                    .map(|b| format!("{} ran out of memory", thousands(b)))
                    .unwrap_or_else(|| "not reached".into()),
                s.trials.len(),
                s.seconds,
                s.planned_limit.map(thousands).unwrap_or_else(|| "none".into()),
                thousands(s.predicted_limit),
            ));
            if let Some(b) = s.stopped_at {
                out.push_str(&format!(
                    "warning: the search stopped at batch {} because that trial did not run for a reason other than memory ({}); the largest batch above is a lower bound\n",
                    thousands(b),
                    s.stop_reason.as_deref().unwrap_or("unknown"),
                ));
            }
        }
        if let Some(note) = d.budget.as_ref().and_then(ProbeBudget::describe) {
            out.push_str(&format!("budget: {note}\n"));
        }
        if let Some(k) = d.knee_batch {
            out.push_str(&format!(
                "knee: batch {} is the smallest reaching {:.0} % of the best measured throughput{}\n",
                thousands(k),
                d.efficiency * 100.0,
                crate::knee_noise(d.knee_range.as_ref())
            ));
        }
    }
    if devices.len() > 1 {
        out.push_str(&side_by_side(devices));
    }
    out
}

/// Several devices in one table per question: step time and throughput at each
/// batch, peak memory against the plan at each batch, and the summary.
fn side_by_side(devices: &[DeviceProbe]) -> String {
    let mut batches: Vec<u64> = devices
        .iter()
        .flat_map(|d| d.points.iter().map(|p| p.batch))
        .collect();
    batches.sort_unstable();
    batches.dedup();
    let mut header = vec!["batch".to_string()];
    header.extend(devices.iter().map(|d| format!("{} step", d.device)));
    header.extend(devices.iter().map(|d| format!("{} samples/s", d.device)));
    let mut speed = table(&header.iter().map(String::as_str).collect::<Vec<_>>());
    let mut header = vec!["batch".to_string()];
    for d in devices {
        header.push(format!("{} peak", d.device));
        header.push("planned".into());
        header.push("error".into());
    }
    let mut memory = table(&header.iter().map(String::as_str).collect::<Vec<_>>());
    for &b in &batches {
        let mut steps = vec![thousands(b)];
        let mut rates = Vec::new();
        let mut mem = vec![thousands(b)];
        for d in devices {
            match d.points.iter().find(|p| p.batch == b) {
                Some(p) if p.ok() => {
                    steps.push(crate::duration(p.step_time_s));
                    rates.push(rate(p.samples_per_s));
                    mem.push(
                        p.peak_bytes
                            .map(|b| b.to_string())
                            .unwrap_or_else(|| "n/a".into()),
                    );
                    mem.push(planned(p));
                    mem.push(
                        p.plan_error_pct
                            .map(|e| format!("{e:+.1}%"))
                            .unwrap_or_default(),
                    );
                }
                Some(p) => {
                    let why = p.failure.as_deref().unwrap_or("failed");
                    let short = if why.contains("out of memory") {
                        "out of memory"
                    } else {
                        "failed"
                    };
                    steps.push(short.into());
                    rates.push(String::new());
                    mem.push(short.into());
                    mem.push(planned(p));
                    mem.push(String::new());
                }
                None => {
                    steps.push("-".into());
                    rates.push(String::new());
                    mem.extend(["-".to_string(), String::new(), String::new()]);
                }
            }
        }
        steps.extend(rates);
        speed.add_row(steps);
        memory.add_row(mem);
    }
    align_numbers(&mut speed, 0);
    align_numbers(&mut memory, 0);
    let mut summary = table(&["device", "max batch", "knee", "best samples/s", "at batch"]);
    for d in devices {
        let best = d
            .points
            .iter()
            .filter(|p| p.ok())
            .max_by(|a, b| a.samples_per_s.total_cmp(&b.samples_per_s));
        summary.add_row(vec![
            d.device.clone(),
            d.max_batch.map(thousands).unwrap_or_else(|| "-".into()),
            d.knee_batch.map(thousands).unwrap_or_else(|| "-".into()),
            best.map(|p| rate(p.samples_per_s)).unwrap_or_default(),
            best.map(|p| thousands(p.batch)).unwrap_or_default(),
        ]);
    }
    align_numbers(&mut summary, 1);
    format!(
        "\nSIDE BY SIDE: step time and throughput (measured)\n{speed}\n\
         \nSIDE BY SIDE: peak memory, measured vs planned (on a GPU: what its runtime reserved)\n{memory}\n\
         \nSIDE BY SIDE: summary (measured)\n{summary}\n"
    )
}

/// Throughput vs batch, one series per device, knee and largest batch marked.
pub fn throughput_figure(devices: &[DeviceProbe]) -> (Figure, String) {
    let mut series = Vec::new();
    let mut markers = Vec::new();
    for (i, dev) in devices.iter().enumerate() {
        let pts: Vec<(f64, f64)> = dev
            .points
            .iter()
            .filter(|p| p.ok() && p.samples_per_s.is_finite())
            .map(|p| (p.batch as f64, p.samples_per_s))
            .collect();
        let mut mark = |batch: Option<u64>, what: &str| {
            if let Some(b) = batch
                && let Some(p) = pts.iter().find(|p| p.0 == b as f64)
            {
                markers.push(Marker {
                    x: p.0,
                    y: p.1,
                    text: format!(" {what} {b}"),
                    color: i,
                });
            }
        };
        mark(dev.knee_batch, "knee");
        mark(dev.max_batch, "max");
        series.push(Series {
            label: format!("{} (measured)", dev.device),
            points: pts,
            kind: SeriesKind::LineAndPoints,
            color: i,
        });
    }
    (
        Figure {
            title: "Training throughput vs batch size".into(),
            x_label: "batch size".into(),
            y_label: "samples / s".into(),
            log_x: true,
            series,
            markers,
        },
        "Measured: median of timed training steps (forward, backward, optimizer) after warm-up, per device. Triangles mark the knee (smallest batch within the efficiency share of the best) and the largest batch that fits.".into(),
    )
}

/// The probe's points as `(batch, samples/s, relative error)` for the knee's range.
pub fn curve_with_errors(points: &[ProbePoint]) -> Vec<(u64, f64, f64)> {
    points
        .iter()
        .filter(|p| p.ok() && p.samples_per_s.is_finite())
        .map(|p| (p.batch, p.samples_per_s, p.step_time_rel_err))
        .collect()
}
