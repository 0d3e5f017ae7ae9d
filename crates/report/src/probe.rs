//! The `probe` report: measured throughput and memory per batch, per device.

use crate::plots::{Figure, Marker, Series, SeriesKind};
use crate::{align_numbers, table, thousands};
use batchfit_tune::probe::{DeviceProbe, ProbeBudget, ProbePoint};
use serde::Serialize;

/// One sentence on what a time budget left out, or `None` when nothing was.
pub fn budget_note(b: &ProbeBudget) -> Option<String> {
    let (first, last) = (b.not_measured.first()?, b.not_measured.last()?);
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
        crate::duration(b.budget_s),
        b.predicted_step_s.map_or(String::new(), |s| format!(
            " (batch {}'s step predicted at {} from the batch below it)",
            crate::thousands(*first),
            crate::duration(s)
        ))
    ))
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
        let steal: Vec<(u64, f64)> = d
            .points
            .iter()
            .filter_map(|p| Some((p.batch, p.cpu_steal_share?)))
            .collect();
        if let Some(f) = batchfit_tune::diagnose::cpu_steal(&steal, d.device) {
            out.push_str(&format!("warning: {}.\n", crate::prose::finding(&f)));
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
        if let Some(note) = d.budget.as_ref().and_then(budget_note) {
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
                    let short = if p.out_of_memory() {
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
        let best = d.fastest();
        summary.add_row(vec![
            d.device.to_string(),
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
