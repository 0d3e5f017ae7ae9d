//! The `sweep` report: real trainings per batch and seed, measured steps to
//! target beside the noise-scale prediction, and the quality question.

use crate::json::{ScheduleSummaryJson, VerifyJson};
use crate::plots::{Figure, Marker, Series, SeriesKind};
use crate::{align_numbers, esc, prose, table, thousands};
use batchfit_tune::sweep::{
    BatchSummary, DeviceTimes, MeasuredNoise, QualityVerdict, RunStatus, ScheduleSummary, StepsFit,
    SweepRun, SweepSettings, SweepSummary,
};
use batchfit_tune::verify::{Verdict, VerifyReport, VerifyRow};
use serde::Serialize;

/// The JSON document of `batchfit sweep --json`.
#[derive(Serialize)]
pub struct SweepDocument<'a> {
    pub schema_version: u32,
    pub kind: &'static str,
    pub settings: &'a SweepSettings,
    /// The target every comparison uses, and where it came from.
    pub target_loss: Option<f64>,
    pub target_source: String,
    pub target_source_code: &'static str,
    pub runs: &'a [SweepRun],
    /// Per batch over seeds, on the first device.
    pub per_batch: &'a [BatchSummary],
    /// Steps and seconds to target on each device.
    pub by_device: &'a [DeviceTimes],
    /// S_min and B_noise fitted to the measured steps to target.
    pub fit: Option<StepsFit>,
    pub noise: Option<&'a MeasuredNoise>,
    pub quality_loss: Option<&'a QualityVerdict>,
    pub quality_accuracy: Option<&'a QualityVerdict>,
    /// The quality answer in words, and as a code.
    pub quality_statement: String,
    pub quality_code: &'static str,
    /// `--verify`: the advice's prediction beside these trainings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verify: Option<VerifyJson<'a>>,
    /// `--schedule`: the batch-size schedule trained beside the fixed batches.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schedule: Option<ScheduleSummaryJson<'a>>,
    pub seconds: f64,
}

impl<'a> SweepDocument<'a> {
    pub fn new(d: &'a SweepSummary) -> Self {
        SweepDocument {
            schema_version: crate::SCHEMA_VERSION,
            kind: "sweep",
            settings: &d.settings,
            target_loss: d.target_loss,
            target_source: prose::target_source(d.target_source),
            target_source_code: d.target_source.code(),
            runs: &d.runs,
            per_batch: &d.per_batch,
            by_device: &d.by_device,
            fit: d.fit,
            noise: d.noise.as_ref(),
            quality_loss: d.quality_loss.as_ref(),
            quality_accuracy: d.quality_accuracy.as_ref(),
            quality_statement: quality(d),
            quality_code: prose::quality_code(d.quality_loss.as_ref(), d.quality_accuracy.as_ref()),
            verify: d.verify.as_ref().map(VerifyJson::new),
            schedule: d.schedule.as_ref().map(ScheduleSummaryJson::new),
            seconds: d.seconds,
        }
    }
}

/// The quality answer of a sweep.
fn quality(d: &SweepSummary) -> String {
    prose::quality_statement(
        d.quality_loss.as_ref(),
        d.quality_accuracy.as_ref(),
        d.settings.seeds.len(),
    )
}

/// The schedule section of the terminal report.
pub fn schedule_table(s: &ScheduleSummary) -> String {
    let mut out = format!(
        "\nBATCH-SIZE SCHEDULE ({})\n",
        prose::schedule_source(&s.source)
    );
    let mut t = table(&["from samples", "batch", "lr"]);
    for st in &s.schedule.stages {
        t.add_row(vec![
            thousands(st.from_samples),
            thousands(st.batch),
            format!("{:.3e}", st.lr),
        ]);
    }
    align_numbers(&mut t, 0);
    out.push_str(&t.to_string());
    out.push('\n');
    let mut t = table(&["", "steps", "samples", "seconds", "val accuracy"]);
    t.add_row(vec![
        "schedule (measured)".into(),
        pm(s.steps_mean, s.steps_std, 0),
        opt(s.samples_mean, |x| thousands(x.round() as u64)),
        match (s.seconds_mean, s.seconds_std) {
            (Some(m), Some(d)) => format!("{m:.3} ± {d:.3}"),
            _ => "-".into(),
        },
        match s.val_accuracy_mean {
            Some(m) => format!(
                "{:.2} % ± {:.2}",
                m * 100.0,
                s.val_accuracy_std.unwrap_or(0.0) * 100.0
            ),
            None => opt(s.val_loss_mean, |l| format!("loss {l:.4}")),
        },
    ]);
    t.add_row(vec![
        "schedule (predicted)".into(),
        opt(s.predicted_steps, |x| format!("{x:.0}")),
        opt(s.predicted_samples, |x| thousands(x.round() as u64)),
        "-".into(),
        "-".into(),
    ]);
    align_numbers(&mut t, 1);
    out.push_str(&t.to_string());
    out.push('\n');
    out.push_str(&prose::schedule_summary_statement(s));
    out.push('\n');
    out
}

/// The `--verify` table and its verdict.
pub fn verify_table(v: &VerifyReport) -> String {
    let mut out = format!(
        "\nPREDICTED (advice {}) BESIDE MEASURED (mean ± sd over seeds), to loss {:.4}, lr(B) = {}\n",
        v.advice,
        v.basis.target_loss,
        prose::formula(&v.basis.lr)
    );
    out.push_str(&verify_rows(&v.rows, &v.verdict));
    out
}

/// Predicted beside measured, one row a batch, then the worst errors and the verdict line.
pub fn verify_rows(rows: &[VerifyRow], verdict: &Verdict) -> String {
    let mut out = String::new();
    let mut t = table(&[
        "batch",
        "steps predicted",
        "steps measured",
        "error",
        "time predicted",
        "time measured",
        "error",
        "vs best predicted",
        "vs best measured",
        "error",
    ]);
    let secs = |x: f64| crate::duration(x);
    for r in rows {
        t.add_row(vec![
            thousands(r.batch),
            format!("{:.0}", r.predicted_steps),
            match r.steps_mean {
                Some(_) if r.reached < r.runs => format!(
                    "{} ({}/{} reached)",
                    pm(r.steps_mean, r.steps_std, 0),
                    r.reached,
                    r.runs
                ),
                Some(_) => pm(r.steps_mean, r.steps_std, 0),
                None => format!("not reached (0/{})", r.runs),
            },
            opt(r.steps_error_pct, |e| format!("{e:+.0}%")),
            opt(r.predicted_seconds, secs),
            match (r.seconds_mean, r.seconds_std) {
                (Some(m), Some(s)) => format!("{} ± {}", secs(m), secs(s)),
                _ => "-".into(),
            },
            opt(r.seconds_error_pct, |e| format!("{e:+.0}%")),
            opt(r.predicted_vs_best, |x| format!("{x:.2}x")),
            opt(r.vs_best, |x| format!("{x:.2}x")),
            opt(r.vs_best_error_pct, |e| format!("{e:+.0}%")),
        ]);
    }
    align_numbers(&mut t, 0);
    out.push_str(&t.to_string());
    out.push('\n');
    let worst = |w: Option<(u64, f64)>| {
        w.map_or("-".to_string(), |(b, e)| {
            format!("{:.0} % (batch {b})", e.abs())
        })
    };
    // Whether the relative errors are larger than the seeds alone make the
    // measured ratio move: with a few seeds, a 20 % miss can be noise.
    let noise = |b: u64| {
        rows.iter()
            .find(|r| r.batch == b)
            .and_then(|r| r.vs_best_noise_pct)
    };
    let relative = match verdict.worst_relative {
        Some((b, e)) => match noise(b) {
            Some(n) => format!(
                "{:.0} % (batch {b}; the seeds' noise there ±{n:.0} %), {}",
                e.abs(),
                match verdict.relative_beyond_noise.as_slice() {
                    [] => "every error within the seeds' noise".to_string(),
                    beyond => format!(
                        "beyond the seeds' noise at batch{} {}",
                        if beyond.len() == 1 { "" } else { "es" },
                        beyond
                            .iter()
                            .map(|b| thousands(*b))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                }
            ),
            None => worst(Some((b, e))),
        },
        None => worst(None),
    };
    out.push_str(&format!(
        "predicted time relative to the best: worst error {relative}; predicted seconds: worst error {}\n",
        worst(verdict.worst_absolute)
    ));
    out.push_str(&prose::verdict_line(verdict.recommended, verdict.outcome));
    out.push('\n');
    out
}

fn opt(x: Option<f64>, f: impl Fn(f64) -> String) -> String {
    x.map(f).unwrap_or_else(|| "-".into())
}

fn pm(mean: Option<f64>, std: Option<f64>, digits: usize) -> String {
    match (mean, std) {
        (Some(m), Some(s)) => format!("{m:.digits$} ± {s:.digits$}"),
        (Some(m), None) => format!("{m:.digits$}"),
        _ => "-".into(),
    }
}

/// Terminal report.
pub fn render(d: &SweepSummary) -> String {
    let s = &d.settings;
    let mut out = format!(
        "\nsweep of {} on {}, trained on {} ({} training rows, {} validation), {} x {} seeds, {} with {} lr (reference {} at batch {}), warm-up {} epoch(s)\n",
        s.model,
        s.data,
        s.devices
            .iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(","),
        thousands(s.train_rows as u64),
        thousands(s.val_rows as u64),
        s.batches
            .iter()
            .map(|b| b.to_string())
            .collect::<Vec<_>>()
            .join("/"),
        s.seeds.len(),
        s.optimizer.name(),
        s.lr_rule.name(),
        s.ref_lr,
        s.ref_batch,
        s.warmup_epochs,
    );
    out.push_str(&format!(
        "target training loss: {} ({})\n\n",
        opt(d.target_loss, |t| format!("{t:.4}")),
        prose::target_source(d.target_source)
    ));
    out.push_str("STEPS TO TARGET (measured, mean ± sd over seeds) AND S(B) = S_min (1 + B_noise/B) (predicted)\n");
    let mut t = table(&[
        "batch",
        "lr",
        "reached",
        "steps",
        "epochs",
        "seconds",
        "fit S(B)",
        "error",
        "from noise",
        "error",
    ]);
    for b in &d.per_batch {
        t.add_row(vec![
            thousands(b.batch),
            format!("{:.3e}", b.lr),
            format!(
                "{}/{}{}",
                b.reached,
                b.runs,
                if b.diverged > 0 {
                    format!(" ({} diverged)", b.diverged)
                } else {
                    String::new()
                }
            ),
            pm(b.steps_mean, b.steps_std, 0),
            opt(b.epochs_mean, |e| format!("{e:.2}")),
            opt(b.seconds_mean, |s| format!("{s:.2} s")),
            opt(b.steps_fitted, |s| format!("{s:.0}")),
            opt(b.fitted_error_pct, |e| format!("{e:+.1}%")),
            opt(b.steps_from_noise, |s| format!("{s:.0}")),
            opt(b.noise_error_pct, |e| format!("{e:+.1}%")),
        ]);
    }
    align_numbers(&mut t, 0);
    out.push_str(&t.to_string());
    out.push('\n');
    match &d.fit {
        Some(f) => out.push_str(&format!(
            "fitted to the measured steps: S_min = {:.0} steps, B_noise = {:.0}",
            f.s_min, f.b_noise
        )),
        None => out.push_str(
            "no fit: S_min and B_noise need steps to target at two or more batches that fall with the batch no faster than 1/B",
        ),
    }
    match &d.noise {
        Some(n) => out.push_str(&format!(
            "; `noise` measured B_simple = {:.0} (90 % band {:.0}–{}) on the training split\n",
            n.b_simple,
            n.low,
            opt(n.high, |h| format!("{h:.0}"))
        )),
        None => out.push_str("; no noise-scale measurement (--no-noise, or too few rows)\n"),
    }

    if d.by_device.len() > 1 {
        out.push_str(&by_device_table(d));
    }
    out.push_str("\nFINAL VALIDATION (measured, mean ± sd over seeds)\n");
    let mut t = table(&["batch", "val loss", "val accuracy"]);
    for b in &d.per_batch {
        t.add_row(vec![
            thousands(b.batch),
            pm(b.val_loss_mean, b.val_loss_std, 4),
            match b.val_accuracy_mean {
                Some(m) => format!(
                    "{:.2} % ± {:.2}",
                    m * 100.0,
                    b.val_accuracy_std.unwrap_or(0.0) * 100.0
                ),
                None => "-".into(),
            },
        ]);
    }
    align_numbers(&mut t, 0);
    out.push_str(&t.to_string());
    out.push('\n');
    out.push_str(&quality(d));
    out.push('\n');

    for r in &d.runs {
        if let RunStatus::Diverged { step, loss } = r.record.status {
            out.push_str(&format!(
                "diverged: batch {} seed {} at lr {:.3e}: loss {} at step {step}\n",
                r.record.batch,
                r.record.seed,
                r.record.lr,
                loss.map_or("NaN".to_string(), |l| l.to_string())
            ));
        }
    }
    let resumed = d.runs.iter().filter(|r| r.resumed).count();
    out.push_str(&format!(
        "{} runs ({} trained now, {} read back from --out), {:.1} s\n",
        d.runs.len(),
        d.runs.len() - resumed,
        resumed,
        d.seconds
    ));
    if let Some(sch) = &d.schedule {
        out.push_str(&schedule_table(sch));
    }
    // Last, so the output ends with whether the advice held.
    if let Some(v) = &d.verify {
        out.push_str(&verify_table(v));
    }
    out
}

/// Seconds to target per batch with a column per device, and each device's fastest.
fn by_device_table(d: &SweepSummary) -> String {
    let mut out = String::from(
        "\nSECONDS TO TARGET BY DEVICE (measured, mean ± sd over seeds; steps are the first device's above)\n",
    );
    let mut head = vec!["batch".to_string()];
    head.extend(d.by_device.iter().map(|dev| dev.device.to_string()));
    let head: Vec<&str> = head.iter().map(String::as_str).collect();
    let mut t = table(&head);
    for (i, &b) in d.settings.batches.iter().enumerate() {
        let mut row = vec![thousands(b)];
        row.extend(d.by_device.iter().map(|dev| {
            let x = &dev.per_batch[i];
            match x.seconds_mean {
                Some(_) if x.reached < x.runs => format!(
                    "{} ({}/{} reached)",
                    pm(x.seconds_mean, x.seconds_std, 3),
                    x.reached,
                    x.runs
                ),
                Some(_) => format!("{} s", pm(x.seconds_mean, x.seconds_std, 3)),
                None => "not reached".into(),
            }
        }));
        t.add_row(row);
    }
    align_numbers(&mut t, 0);
    out.push_str(&t.to_string());
    out.push('\n');
    for dev in &d.by_device {
        match dev.fastest {
            Some(b) => out.push_str(&format!(
                "fastest to target on {}: batch {}\n",
                dev.device,
                thousands(b)
            )),
            None => out.push_str(&format!(
                "{}: no batch reached the target in every seed\n",
                dev.device
            )),
        }
    }
    out
}

/// Learning curves, validation per epoch, and measured vs predicted steps.
pub fn figures(d: &SweepSummary) -> Vec<(Figure, String)> {
    let mut figs = Vec::new();
    let color = |batch: u64| {
        d.settings
            .batches
            .iter()
            .position(|&b| b == batch)
            .unwrap_or(0)
    };
    let first_seed = |r: &&SweepRun| Some(r.record.seed) == d.settings.seeds.first().copied();
    let curve_series = |x: fn(&batchfit_tune::sweep::CurvePoint) -> f64| -> Vec<Series> {
        d.runs
            .iter()
            .filter(first_seed)
            .map(|r| Series {
                label: match r.record.schedule {
                    Some(_) => "schedule (measured)".to_string(),
                    None => format!("batch {} (measured)", r.record.batch),
                },
                points: r.record.curve.iter().map(|p| (x(p), p.loss)).collect(),
                kind: SeriesKind::Line,
                color: match r.record.schedule {
                    Some(_) => d.settings.batches.len(),
                    None => color(r.record.batch),
                },
            })
            .collect()
    };
    // Where the schedule's first-seed run moved to each later stage.
    let stage_markers = |x: fn(&batchfit_tune::sweep::CurvePoint) -> f64| -> Vec<Marker> {
        d.runs
            .iter()
            .filter(first_seed)
            .filter_map(|r| r.record.schedule.as_ref().map(|s| (r, s)))
            .flat_map(|(r, s)| {
                s.stages.iter().skip(1).filter_map(|st| {
                    r.record
                        .curve
                        .iter()
                        .find(|p| p.samples >= st.from_samples)
                        .map(|p| Marker {
                            x: x(p),
                            y: p.loss,
                            text: format!("→ {}", st.batch),
                            color: d.settings.batches.len(),
                        })
                })
            })
            .collect()
    };
    let seed_note = format!(
        "seed {}",
        d.settings.seeds.first().copied().unwrap_or_default()
    );
    figs.push((
        Figure {
            title: "Training loss vs step".into(),
            x_label: "optimizer step".into(),
            y_label: "training loss (fixed subset)".into(),
            log_x: false,
            series: curve_series(|p| p.step as f64),
            markers: stage_markers(|p| p.step as f64),
        },
        format!("Measured, {seed_note}: loss on a fixed subset of the training split, about ten times per epoch (at most every 5 % of the steps so far). Larger batches need fewer steps for the same loss, up to the noise scale. With a schedule, its curve is marked where the batch changes (→ new batch)."),
    ));
    figs.push((
        Figure {
            title: "Training loss vs wall-clock time".into(),
            x_label: "seconds of training steps".into(),
            y_label: "training loss (fixed subset)".into(),
            log_x: false,
            series: curve_series(|p| p.seconds),
            markers: stage_markers(|p| p.seconds),
        },
        format!("Measured, {seed_note}: the same curves against the time spent in training steps (evaluations excluded) — which batch gets there first on this machine."),
    ));
    let val: Vec<Series> = d
        .runs
        .iter()
        .filter(first_seed)
        .map(|r| Series {
            label: match r.record.schedule {
                Some(_) => "schedule (measured)".to_string(),
                None => format!("batch {} (measured)", r.record.batch),
            },
            points: r
                .record
                .epochs
                .iter()
                .map(|e| (e.epoch as f64, e.val_accuracy.unwrap_or(e.val_loss)))
                .collect(),
            kind: SeriesKind::LineAndPoints,
            color: color(r.record.batch),
        })
        .collect();
    let acc = d.runs.iter().any(|r| r.record.final_val_accuracy.is_some());
    figs.push((
        Figure {
            title: "Validation per epoch".into(),
            x_label: "epoch".into(),
            y_label: if acc {
                "validation accuracy"
            } else {
                "validation loss"
            }
            .into(),
            log_x: false,
            series: val,
            markers: vec![],
        },
        format!("Measured, {seed_note}: the held-out split at the end of each epoch."),
    ));
    let measured: Vec<(f64, f64)> = d
        .runs
        .iter()
        .filter_map(|r| r.steps_to_target.map(|s| (r.record.batch as f64, s)))
        .collect();
    if !measured.is_empty() {
        let mut series = vec![Series {
            label: "runs (measured)".into(),
            points: measured,
            kind: SeriesKind::Points,
            color: 0,
        }];
        let (lo, hi) = (
            *d.settings.batches.iter().min().unwrap_or(&1) as f64,
            *d.settings.batches.iter().max().unwrap_or(&1) as f64,
        );
        let grid = |f: &dyn Fn(f64) -> f64| -> Vec<(f64, f64)> {
            (0..=30)
                .map(|i| {
                    let b = lo * (hi / lo).powf(i as f64 / 30.0);
                    (b, f(b))
                })
                .collect()
        };
        if let Some(f) = &d.fit {
            series.push(Series {
                label: format!("fit: B_noise {:.0} (predicted)", f.b_noise),
                points: grid(&|b| f.steps(b)),
                kind: SeriesKind::Line,
                color: 1,
            });
        }
        if let Some(n) = &d.noise
            && let Some(s_min) = n.s_min
        {
            let from = StepsFit {
                s_min,
                b_noise: n.b_simple,
                rows: d.settings.rows_drawn_from(),
            };
            series.push(Series {
                label: format!("from noise: B_simple {:.0} (predicted)", n.b_simple),
                points: grid(&|b| from.steps(b)),
                kind: SeriesKind::DashedLine,
                color: 2,
            });
        }
        figs.push((
            Figure {
                title: "Steps to target: measured vs predicted".into(),
                x_label: "batch size".into(),
                y_label: "optimizer steps to the target loss".into(),
                log_x: true,
                series,
                markers: vec![],
            },
            "Points: each run's steps to the target (measured, interpolated between evaluations). Solid: S(B) = S_min (1 + B_noise/B) fitted to them. Dashed: the same law with the B_simple `noise` measured (S_min scaled to the runs).".into(),
        ));
    }
    figs
}

/// The HTML page.
pub fn html(d: &SweepSummary) -> String {
    let mut body = format!(
        "<h1>batchfit sweep: {}</h1>\n<p class=\"meta\">data: {}</p>\n<h2>Results</h2>\n<pre>",
        esc(&d.settings.model),
        esc(&d.settings.data)
    );
    body.push_str(&esc(&render(d)));
    body.push_str("</pre>\n<h2>Figures</h2>\n");
    body.push_str(&crate::figures_html(figures(d)));
    crate::page(&format!("sweep {}", d.settings.model), &body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use batchfit_tune::basis::{BasisSource, NoiseRunAt, PredictionBasis};
    use batchfit_tune::lr::{LrRule, LrScaling};
    use batchfit_tune::target::StepsCurve;
    use batchfit_tune::verify::{Measured, Predicted, verify};

    /// The verify table has a row per batch and ends with the verdict line.
    #[test]
    fn the_verify_table_ends_with_the_verdict() {
        let predicted = [
            Predicted {
                batch: 64,
                steps: 300.0,
                seconds: Some(0.09),
            },
            Predicted {
                batch: 256,
                steps: 100.0,
                seconds: Some(0.06),
            },
        ];
        let measured = [
            Measured {
                batch: 64,
                runs: 2,
                steps: vec![310.0, 330.0],
                seconds: vec![0.10, 0.11],
            },
            Measured {
                batch: 256,
                runs: 2,
                steps: vec![105.0, 95.0],
                seconds: vec![0.07, 0.065],
            },
        ];
        let (rows, verdict) = verify(&predicted, &measured, 256, &[]);
        let report = VerifyReport {
            advice: "advice.json".into(),
            device: batchfit_tune::device::DeviceSpec::Cpu,
            basis: PredictionBasis {
                lr: LrScaling {
                    rule: LrRule::Sqrt,
                    ref_batch: 16,
                    ref_lr: 1e-3,
                    cap_batch: Some(400),
                },
                warmup_epochs: 0.0,
                target_loss: 0.07,
                curve: StepsCurve {
                    s_min: 50.0,
                    b_noise: 400.0,
                    rows: None,
                },
                source: BasisSource::EndValue {
                    run: NoiseRunAt {
                        batch: 128,
                        lr: 2.83e-3,
                    },
                    updates: 150.0,
                    b_simple_end: 400.0,
                },
                b_noise_run: None,
                reference_updates: None,
            },
            rows,
            verdict,
        };
        let text = verify_table(&report);
        assert!(text.contains("held from B = 400"), "{text}");
        assert_eq!(
            text.matches("│    64 ").count() + text.matches("│   256 ").count(),
            2,
            "{text}"
        );
        let last = text.trim_end().lines().last().unwrap();
        assert!(
            last.starts_with("The advice held: batch 256 reached the target fastest"),
            "{last}"
        );
    }
}
