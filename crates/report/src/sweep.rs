//! The `sweep` report: real trainings per batch and seed, measured steps to
//! target beside the noise-scale prediction, and the quality question.

use crate::plots::{Figure, Marker, Series, SeriesKind};
use crate::{align_numbers, esc, table, thousands};
use batchfit_tune::sweep::{QualityVerdict, RunRecord, RunStatus, StepsFit};
use serde::{Deserialize, Serialize};

/// What a sweep was asked to do; stored as `sweep.json` in `--out` so a
/// `--resume` can check it continues the same experiment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SweepSettings {
    pub model: String,
    pub data: String,
    /// The devices every run trained on, comma-separated, in the order trained.
    #[serde(default = "cpu")]
    pub device: String,
    pub train_rows: usize,
    pub val_rows: usize,
    pub val_split: f64,
    pub split_seed: u64,
    pub batches: Vec<u64>,
    pub seeds: Vec<u64>,
    pub optimizer: String,
    pub lr_rule: String,
    pub ref_batch: u64,
    pub ref_lr: f64,
    /// Batches above this train at its learning rate (null: no cap).
    #[serde(default)]
    pub lr_cap: Option<u64>,
    /// `--schedule`: `ramp` or the schedule file (null: fixed batches only).
    #[serde(default)]
    pub schedule: Option<String>,
    pub warmup_epochs: f64,
    pub target_loss: Option<f64>,
    pub max_epochs: u32,
}

fn cpu() -> String {
    "cpu".into()
}

/// One run as the report shows it.
#[derive(Clone, Debug, Serialize)]
pub struct SweepRun {
    /// The device it trained on.
    pub device: String,
    /// Read back from `--out` instead of trained in this invocation.
    pub resumed: bool,
    /// Steps, seconds and samples to the sweep's target (interpolated; measured).
    pub steps_to_target: Option<f64>,
    pub seconds_to_target: Option<f64>,
    pub samples_to_target: Option<f64>,
    pub record: RunRecord,
}

/// Per batch, over seeds.
#[derive(Clone, Debug, Serialize)]
pub struct BatchSummary {
    pub batch: u64,
    pub lr: f64,
    pub runs: usize,
    pub reached: usize,
    pub diverged: usize,
    /// Mean and standard deviation over the runs that reached the target (measured).
    pub steps_mean: Option<f64>,
    pub steps_std: Option<f64>,
    pub seconds_mean: Option<f64>,
    pub epochs_mean: Option<f64>,
    /// S(B) from the fitted S_min and B_noise, and its error vs measured, percent.
    pub steps_fitted: Option<f64>,
    pub fitted_error_pct: Option<f64>,
    /// S(B) from `noise`'s B_simple (S_min scaled to the runs), and its error.
    pub steps_from_noise: Option<f64>,
    pub noise_error_pct: Option<f64>,
    /// Final validation figures, mean and spread over seeds (measured).
    pub val_loss_mean: Option<f64>,
    pub val_loss_std: Option<f64>,
    pub val_accuracy_mean: Option<f64>,
    pub val_accuracy_std: Option<f64>,
}

/// Seconds to target per batch on one device (measured).
#[derive(Clone, Debug, Serialize)]
pub struct DeviceTimes {
    pub device: String,
    pub per_batch: Vec<DeviceBatchTimes>,
    /// The batch with the fewest mean seconds to target among those every seed reached.
    pub fastest: Option<u64>,
}

/// One batch on one device, over seeds (measured).
#[derive(Clone, Debug, Serialize)]
pub struct DeviceBatchTimes {
    pub batch: u64,
    pub runs: usize,
    pub reached: usize,
    pub steps_mean: Option<f64>,
    pub seconds_mean: Option<f64>,
    pub seconds_std: Option<f64>,
}

/// The noise scale measured on the training split, for comparison.
#[derive(Clone, Debug, Serialize)]
pub struct MeasuredNoise {
    pub b_simple: f64,
    pub low: f64,
    pub high: Option<f64>,
    /// S_min that best scales (1 + B_simple/B) to the measured steps.
    pub s_min: Option<f64>,
}

/// The JSON document of `batchfit sweep --json`.
#[derive(Clone, Debug, Serialize)]
pub struct SweepDocument {
    pub schema_version: u32,
    pub kind: &'static str,
    pub settings: SweepSettings,
    /// The target every comparison uses, and where it came from.
    pub target_loss: Option<f64>,
    pub target_source: String,
    pub runs: Vec<SweepRun>,
    /// Per batch over seeds, on the first device.
    pub per_batch: Vec<BatchSummary>,
    /// Steps and seconds to target on each device.
    pub by_device: Vec<DeviceTimes>,
    /// S_min and B_noise fitted to the measured steps to target.
    pub fit: Option<StepsFit>,
    pub noise: Option<MeasuredNoise>,
    pub quality_loss: Option<QualityVerdict>,
    pub quality_accuracy: Option<QualityVerdict>,
    /// The quality answer in words.
    pub quality_statement: String,
    /// `--verify`: the advice's prediction beside these trainings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verify: Option<VerifyReport>,
    /// `--schedule`: the batch-size schedule trained beside the fixed batches.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schedule: Option<ScheduleSummary>,
    pub seconds: f64,
}

/// The schedule's runs (first device) beside the fastest fixed batch.
#[derive(Clone, Debug, Serialize)]
pub struct ScheduleSummary {
    /// Where the schedule came from, in words.
    pub source: String,
    pub schedule: batchfit_tune::schedule::Schedule,
    /// Updates and samples to the target (predicted from the noise run's
    /// stretches; null when that run did not reach the target).
    pub predicted_steps: Option<f64>,
    pub predicted_samples: Option<f64>,
    /// The noise run's prediction for the fastest fixed batch, for scale.
    pub predicted_steps_best_fixed: Option<f64>,
    pub runs: usize,
    pub reached: usize,
    pub steps_mean: Option<f64>,
    pub steps_std: Option<f64>,
    pub samples_mean: Option<f64>,
    pub seconds_mean: Option<f64>,
    pub seconds_std: Option<f64>,
    /// (predicted - measured) / measured steps, percent.
    pub steps_error_pct: Option<f64>,
    pub val_loss_mean: Option<f64>,
    pub val_accuracy_mean: Option<f64>,
    pub val_accuracy_std: Option<f64>,
    /// The fixed batch with the fewest mean seconds to target (every run reached it).
    pub best_fixed: Option<u64>,
    /// Schedule over that batch: mean seconds and steps, with z = difference
    /// over its standard error (seed to seed).
    pub seconds_ratio: Option<f64>,
    pub seconds_z: Option<f64>,
    pub steps_ratio: Option<f64>,
    pub steps_z: Option<f64>,
    /// Faster than the best fixed batch by more than two standard errors.
    pub beats_best_fixed: bool,
    /// The answer in words.
    pub statement: String,
}

/// The schedule section of the terminal report.
pub fn schedule_table(s: &ScheduleSummary) -> String {
    let mut out = format!("\nBATCH-SIZE SCHEDULE ({})\n", s.source);
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
    out.push_str(&s.statement);
    out.push('\n');
    out
}

/// `sweep --verify ADVICE.json`: predicted beside measured, and the verdict.
#[derive(Clone, Debug, Serialize)]
pub struct VerifyReport {
    /// The advice file.
    pub advice: String,
    /// The device whose recommendation is checked (the runs train on it).
    pub device: String,
    /// What the prediction assumed; the runs trained with it.
    pub basis: batchfit_tune::target::PredictionBasis,
    pub rows: Vec<batchfit_tune::verify::VerifyRow>,
    pub verdict: batchfit_tune::verify::Verdict,
}

/// The `--verify` table and its verdict.
pub fn verify_table(v: &VerifyReport) -> String {
    let mut out = format!(
        "\nPREDICTED (advice {}) BESIDE MEASURED (mean ± sd over seeds), to loss {:.4}, lr(B) = {}\n",
        v.advice,
        v.basis.target_loss,
        v.basis.lr.formula()
    );
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
    for r in &v.rows {
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
    out.push_str(&format!(
        "predicted time relative to the best: worst error {}; predicted seconds: worst error {}\n",
        worst(v.verdict.worst_relative),
        worst(v.verdict.worst_absolute)
    ));
    out.push_str(&v.verdict.line);
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
pub fn render(d: &SweepDocument) -> String {
    let s = &d.settings;
    let mut out = format!(
        "\nsweep of {} on {}, trained on {} ({} training rows, {} validation), {} x {} seeds, {} with {} lr (reference {} at batch {}), warm-up {} epoch(s)\n",
        s.model,
        s.data,
        s.device,
        thousands(s.train_rows as u64),
        thousands(s.val_rows as u64),
        s.batches
            .iter()
            .map(|b| b.to_string())
            .collect::<Vec<_>>()
            .join("/"),
        s.seeds.len(),
        s.optimizer,
        s.lr_rule,
        s.ref_lr,
        s.ref_batch,
        s.warmup_epochs,
    );
    out.push_str(&format!(
        "target training loss: {} ({})\n\n",
        opt(d.target_loss, |t| format!("{t:.4}")),
        d.target_source
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
    out.push_str(&d.quality_statement);
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
fn by_device_table(d: &SweepDocument) -> String {
    let mut out = String::from(
        "\nSECONDS TO TARGET BY DEVICE (measured, mean ± sd over seeds; steps are the first device's above)\n",
    );
    let mut head = vec!["batch".to_string()];
    head.extend(d.by_device.iter().map(|dev| dev.device.clone()));
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

/// The quality answer in words, from the verdicts.
pub fn quality_statement(
    loss: Option<&QualityVerdict>,
    accuracy: Option<&QualityVerdict>,
    seeds: usize,
) -> String {
    let Some(main) = accuracy.or(loss) else {
        return "quality: not compared (needs two batches with at least two finished seeds each)"
            .into();
    };
    let what = if accuracy.is_some() {
        "validation accuracy"
    } else {
        "validation loss"
    };
    let (diff, se) = if accuracy.is_some() {
        (
            format!("{:.2} points", main.difference * 100.0),
            format!("{:.2}", main.std_err * 100.0),
        )
    } else {
        (
            format!("{:.4}", main.difference),
            format!("{:.4}", main.std_err),
        )
    };
    let verdict = if main.exceeds_seed_noise {
        "exceeds the seed-to-seed noise: on this data and budget the batch size changes the result"
    } else {
        "is within the seed-to-seed noise: these runs show no quality cost of either batch size"
    };
    format!(
        "quality: best {what} at batch {}, worst at batch {}; the difference ({diff}, {:.1} standard errors of {se}) {verdict} ({} seeds per batch; with few seeds only large differences show)",
        main.best_batch, main.worst_batch, main.z, seeds
    )
}

/// Learning curves, validation per epoch, and measured vs predicted steps.
pub fn figures(d: &SweepDocument) -> Vec<(Figure, String)> {
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
pub fn html(d: &SweepDocument) -> String {
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
    use batchfit_tune::lr::{LrRule, LrScaling};
    use batchfit_tune::target::{PredictionBasis, StepsCurve};
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
        let (rows, verdict) = verify(&predicted, &measured, 256);
        let report = VerifyReport {
            advice: "advice.json".into(),
            device: "cpu".into(),
            basis: PredictionBasis {
                lr: LrScaling {
                    rule: LrRule::Sqrt,
                    ref_batch: 16,
                    ref_lr: 1e-3,
                    cap_batch: Some(400),
                },
                warmup_epochs: 0.0,
                measured: false,
                run_batch: Some(128),
                run_lr: Some(2.83e-3),
                target_loss: 0.07,
                updates_to_target: Some(150.0),
                curve: StepsCurve {
                    s_min: 50.0,
                    b_noise: 400.0,
                },
                b_simple_end: None,
                segments: Vec::new(),
                method: String::new(),
                step_time: String::new(),
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
