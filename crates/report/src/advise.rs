//! The `advise` report: the recommendation first, then the evidence, as a
//! terminal summary, JSON, and a self-contained HTML page with SVG figures.

use crate::json::{BasisJson, DeviceScheduleJson, FindingJson, RecommendationJson};
use crate::noise::NoiseDocument;
use crate::plots::{Figure, Series, SeriesKind};
use crate::{align_numbers, esc, prose, table, thousands};
use batchfit_plan::{Bytes, Plan};
use batchfit_tune::basis::PredictionBasis;
use batchfit_tune::decide::{Advice, AdviceInputs, Learning, SeedNoise};
use batchfit_tune::device::DeviceSpec;
use batchfit_tune::probe::DeviceProbe;
use batchfit_tune::schedule::{DeviceSchedule, Schedule, Stage};
use batchfit_tune::stability::RateCheck;
use batchfit_tune::target::TimeToTarget;
use batchfit_tune::world::WorldSizes;
use serde::Serialize;

/// The JSON document of `batchfit advise --json`.
#[derive(Serialize)]
pub struct AdviseDocument<'a> {
    pub schema_version: u32,
    pub kind: &'static str,
    pub model: &'a str,
    pub parameters: u64,
    pub command: &'a str,
    /// The model and data as given, so `sweep --verify` trains the same.
    pub inputs: &'a AdviceInputs,
    pub machine: &'a str,
    pub data: Option<&'a str>,
    pub plan: &'a Plan,
    pub devices: &'a [DeviceProbe],
    pub noise: Option<NoiseDocument<'a>>,
    pub recommendations: Vec<RecommendationJson<'a>>,
    /// Every (device, batch, accumulation) option ranked by predicted time to target.
    pub time_to_target: &'a [TimeToTarget],
    /// The loss the noise run reached; time to target is predicted for it.
    pub target_loss: Option<f64>,
    /// The noise run's loss beside the loss of ignoring the inputs (null
    /// without a noise run or a closed form for the latter).
    pub learning: Option<Learning>,
    /// What the predicted time to target rests on.
    pub prediction: Option<BasisJson<'a>>,
    /// A batch-size ramp on each device (predicted).
    pub schedules: Vec<DeviceScheduleJson<'a>>,
    pub findings: Vec<FindingJson>,
    /// Memory budget per device, for the memory figure: (device, bytes).
    pub budgets: &'a [(DeviceSpec, Bytes)],
    /// `--gpus`: time to target across data-parallel world sizes (predicted).
    pub world_sizes: Option<&'a WorldSizes>,
    pub devices_not_used: &'a [String],
    /// The data as read, with its findings.
    pub data_profile: Option<crate::data::DataJson<'a>>,
    /// Each noise run of `--noise-seeds` decided on alone.
    pub noise_seeds: &'a [SeedNoise],
    /// The short runs that checked the rule's rate on the data.
    pub rate_checks: &'a [RateCheck],
    /// The batch the checks held the rule's rate at (null: not capped by them).
    pub rate_cap: Option<u64>,
    /// The smallest checked batch where no rate trained (null: none).
    pub rate_failed_from: Option<u64>,
    /// The largest checked batch whose check was slower than predicted (null: none).
    pub rate_unreached_to: Option<u64>,
    /// `--b-small` as asked, where the data was smaller than its B_big (null: as asked).
    pub b_small_asked: Option<usize>,
}

impl<'a> AdviseDocument<'a> {
    pub fn new(a: &'a Advice) -> Self {
        let d = &a.decision;
        AdviseDocument {
            schema_version: crate::SCHEMA_VERSION,
            kind: "advise",
            model: &a.model,
            parameters: a.parameters,
            command: &a.command,
            inputs: &a.inputs,
            machine: &a.machine,
            data: a.data.as_deref(),
            plan: &a.plan,
            devices: &a.devices,
            noise: a.noise.as_ref().map(NoiseDocument::new),
            recommendations: d
                .recommendations
                .iter()
                .map(RecommendationJson::new)
                .collect(),
            time_to_target: &d.time_to_target,
            target_loss: d.target_loss,
            learning: d.learning,
            prediction: d.basis.as_ref().map(BasisJson::new),
            schedules: DeviceScheduleJson::all(&d.schedules),
            findings: FindingJson::all(&d.findings),
            budgets: &a.budgets,
            world_sizes: a.world_sizes.as_ref(),
            devices_not_used: &a.devices_not_used,
            data_profile: a.data_profile.as_ref().map(crate::data::DataJson::new),
            noise_seeds: &a.noise_seeds,
            rate_checks: &a.rate_checks,
            rate_cap: a.rate_cap,
            rate_failed_from: a.rate_failed_from,
            rate_unreached_to: a.rate_unreached_to,
            b_small_asked: a.b_small_asked,
        }
    }
}

/// The terminal summary: recommendation first.
pub fn render(d: &Advice) -> String {
    let mut out = format!(
        "batchfit advice for {} ({} parameters){}\n\n",
        d.model,
        thousands(d.parameters),
        d.data
            .as_ref()
            .map(|s| format!(" on {s}"))
            .unwrap_or_default()
    );
    out.push_str("RECOMMENDATION\n");
    for r in &d.decision.recommendations {
        let batch = r
            .recommended_batch
            .map(thousands)
            .unwrap_or_else(|| "-".into());
        out.push_str(&format!("  {}: train with batch {batch}", r.device));
        match r.learning_rate {
            Some(lr) => out.push_str(&format!(" at learning rate {lr:.3e}")),
            None => out.push_str(&format!(" ({})", prose::learning_rate_rule(r))),
        }
        out.push('\n');
        out.push_str(&format!("    why: {}\n", prose::reason(&r.reason)));
        let budget = d.devices.iter().find(|p| p.device == r.device);
        if let Some(note) = budget.and_then(|p| crate::probe::budget_note(p.budget.as_ref()?)) {
            out.push_str(&format!("    budget: {note}\n"));
        }
        out.push_str(&format!(
            "    largest batch that fits: {} ({}); smallest efficient batch (knee): {}\n",
            r.max_batch
                .map(thousands)
                .unwrap_or_else(|| "unknown".into()),
            r.max_batch_source.label(),
            r.knee_batch.map(thousands).unwrap_or_else(|| "-".into()),
        ));
        if let Some(a) = &r.accumulation {
            out.push_str(&format!(
                "    memory caps the batch below the critical batch: accumulate {} micro-batches of {} = effective {} ({} per update, predicted)\n",
                a.steps,
                thousands(a.micro_batch),
                thousands(a.effective_batch),
                crate::duration(a.update_s)
            ));
        }
    }
    if !d.rate_checks.is_empty() {
        out.push_str("  the rate, checked on the data: trained to the target from the noise run's start (measured; the first is the noise run's own batch and rate, the reference):\n");
        for c in &d.rate_checks {
            out.push_str(&format!("    {}\n", prose::rate_check(c)));
        }
        let refit = d
            .decision
            .basis
            .as_ref()
            .and_then(|b| Some((b.curve.b_noise, b.b_noise_run?)));
        if let Some(o) =
            prose::rate_outcome(d.rate_cap, d.rate_failed_from, d.rate_unreached_to, refit)
        {
            out.push_str(&format!("    {o}\n"));
        }
        if let Some(n) = prose::none_trained(&d.rate_checks) {
            out.push_str(&format!("    {n}\n"));
        }
        if let Some(a) = d.decision.basis.as_ref().and_then(prose::reference_anchor) {
            out.push_str(&format!("    {a}\n"));
        }
    }
    if let Some(p) = &d.decision.basis {
        out.push_str(&format!(
            "  critical batch ≈ {} for training to loss {:.4}{} ({})\n",
            thousands(p.curve.b_noise.round() as u64),
            p.target_loss,
            d.decision
                .learning
                .map(|l| format!(", against {:.4} for ignoring the inputs", l.prior_loss))
                .unwrap_or_default(),
            if p.measured() {
                "B_noise fitted to the steps to target of real trainings"
            } else {
                "the noise scale of the steps along the measured run, each stretch weighted by the updates it needs"
            }
        ));
    }
    // A run that learned nothing from the inputs has no critical batch to state.
    if let Some(n) = &d.noise
        && let Some(c) = n.critical_batch
        && d.decision.learning.is_none_or(|l| l.learned)
    {
        let band = format!(
            "90 % band {}–{}",
            n.b_simple_low
                .map(|x| format!("{x:.0}"))
                .unwrap_or_else(|| "?".into()),
            n.b_simple_high
                .map(|x| format!("{x:.0}"))
                .unwrap_or_else(|| "∞".into()),
        );
        out.push_str(&if d.decision.basis.is_some() {
            format!(
                "  the raw gradient's B_simple at the end of the noise run: {} ({band})\n",
                thousands(c)
            )
        } else {
            format!(
                "  critical batch ≈ {} (gradient noise scale measured on the data; {band})\n",
                thousands(c)
            )
        });
    }
    if let (Some(asked), Some(n)) = (d.b_small_asked, &d.noise) {
        out.push_str(&format!(
            "  the noise run measured with micro-batches of {} (B_big {}) instead of --b-small {asked}: the data holds {} rows\n",
            n.b_small, n.b_big, n.rows
        ));
    }
    if let Some(line) = seed_agreement(d) {
        out.push_str(&line);
    }
    if let Some(p) = &d.data_profile {
        out.push_str(&crate::data::section(p));
    }
    out.push_str(&time_to_target_table(
        &d.decision.time_to_target,
        d.decision.target_loss,
        match &d.decision.basis {
            Some(p) if p.measured() => "steps measured by a sweep x measured step time",
            _ => "steps from the noise scale x measured step time",
        },
    ));
    if let Some(p) = &d.decision.basis {
        out.push_str(&prediction_basis(p));
    }
    for sch in &d.decision.schedules {
        out.push_str(&schedule_table(sch));
    }
    if let Some(w) = &d.world_sizes {
        out.push_str(&world_size_table(w));
    }
    out.push_str(&diagnosis(&d.decision.findings));
    if !d.devices_not_used.is_empty() {
        out.push_str("\nDEVICES NOT MEASURED\n");
        for why in &d.devices_not_used {
            out.push_str(&format!("  - {why}\n"));
        }
    }
    out.push_str("\nEvidence: `batchfit probe` and `batchfit noise` print the full tables; --html writes the report with plots.\n");
    out.push_str("Check it: `batchfit sweep` trains at several batches and compares steps to target with the prediction; `batchfit run -- CMD {batch}` measures your own training script.\n");
    out
}

/// How far the noise runs of `--noise-seeds` agree: each one's B_noise, and
/// how many name each device's batch.
fn seed_agreement(d: &Advice) -> Option<String> {
    if d.noise_seeds.is_empty() {
        return None;
    }
    let n = d.noise_seeds.len();
    let b_noise: Vec<String> = d
        .noise_seeds
        .iter()
        .map(|s| s.b_noise.map_or("-".into(), |b| format!("{b:.0}")))
        .collect();
    let mut out = format!(
        "  {n} noise runs (seeds {}–{}) pooled; alone, before the rate checks, they give B_noise {}\n",
        d.noise_seeds[0].seed,
        d.noise_seeds[n - 1].seed,
        b_noise.join(", ")
    );
    for (i, r) in d.decision.recommendations.iter().enumerate() {
        let alone: Vec<Option<u64>> = d
            .noise_seeds
            .iter()
            .map(|s| s.recommended.get(i).copied().flatten())
            .collect();
        let same = alone.iter().filter(|&&b| b == r.recommended_batch).count();
        out.push_str(&format!(
            "    {}: {same} of {n} would name batch {} alone (they name {})\n",
            r.device,
            r.recommended_batch.map_or("-".into(), thousands),
            alone
                .iter()
                .map(|b| b.map_or("-".into(), thousands))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    Some(out)
}

/// The DIAGNOSIS section `advise` and `run` print (empty without findings).
pub fn diagnosis(findings: &[batchfit_tune::diagnose::Finding]) -> String {
    let mut out = String::new();
    if !findings.is_empty() {
        out.push_str("\nDIAGNOSIS (from the measurements)\n");
        for f in findings {
            out.push_str(&format!("  - {}\n", prose::finding(f)));
        }
    }
    out
}

/// The figures of the report, each with a caption that says measured or predicted.
pub fn figures(d: &Advice) -> Vec<(Figure, String)> {
    let mut figs = Vec::new();

    // 1. Throughput vs batch, per device, knee and max marked.
    figs.push(crate::probe::throughput_figure(&d.devices));

    // 2. Memory vs batch: planned line, measured points, budgets.
    let mib = |b: f64| b / Bytes::MIB as f64;
    let max_b = d
        .devices
        .iter()
        .flat_map(|dv| dv.points.iter().map(|p| p.batch))
        .max()
        .unwrap_or(1)
        .max(2) as f64;
    let planned: Vec<(f64, f64)> = (0..=20)
        .map(|i| {
            let b = (max_b.ln() * i as f64 / 20.0).exp().max(1.0);
            (b, mib(d.plan.bytes_at(b.round() as u64).as_f64()))
        })
        .collect();
    let mut series = vec![Series {
        label: "planned peak (predicted)".into(),
        points: planned,
        kind: SeriesKind::DashedLine,
        color: 5,
    }];
    for (i, dev) in d.devices.iter().enumerate() {
        let pts: Vec<(f64, f64)> = dev
            .points
            .iter()
            .filter_map(|p| p.peak_bytes.map(|b| (p.batch as f64, mib(b.as_f64()))))
            .collect();
        if !pts.is_empty() {
            series.push(Series {
                label: format!("{} peak (measured)", dev.device),
                points: pts,
                kind: SeriesKind::Points,
                color: i,
            });
        }
    }
    for (i, (dev, budget)) in d.budgets.iter().enumerate() {
        series.push(Series {
            label: format!("{dev} budget {budget}"),
            points: vec![(1.0, mib(budget.as_f64())), (max_b, mib(budget.as_f64()))],
            kind: SeriesKind::Line,
            color: 3 + i,
        });
    }
    figs.push((
        Figure { title: "Peak memory of a training step vs batch size".into(), x_label: "batch size".into(), y_label: "MiB".into(), log_x: true, series, markers: vec![] },
        "Dashed: the static plan (predicted). Points: the counting allocator's high-water mark during timed steps (measured). Horizontal lines: memory budgets.".into(),
    ));

    // 3. Noise scale over the run.
    if let Some(n) = &d.noise {
        let get = |f: fn(&batchfit_tune::noise::NoiseRecord) -> Option<f64>| -> Vec<(f64, f64)> {
            n.history
                .iter()
                .filter_map(|r| f(r).map(|v| (r.step as f64, v)))
                .collect()
        };
        let series = vec![
            Series {
                label: "B_simple (measured)".into(),
                points: get(|r| r.b_simple),
                kind: SeriesKind::Line,
                color: 0,
            },
            Series {
                label: "90 % band".into(),
                points: get(|r| r.b_simple_low),
                kind: SeriesKind::DashedLine,
                color: 5,
            },
            Series {
                label: "".into(),
                points: get(|r| r.b_simple_high),
                kind: SeriesKind::DashedLine,
                color: 5,
            },
        ];
        figs.push((
            Figure { title: "Gradient noise scale over the training run".into(), x_label: "step".into(), y_label: "B_simple (samples)".into(), log_x: false, series, markers: vec![] },
            format!("Measured: B_simple = tr(Σ)/|G|² from the two-batch estimator (B_small {}, B_big {}), smoothed; it grows as the loss falls (loss {:.3} → {:.3}).",
                n.b_small, n.b_big,
                n.history.first().map_or(f64::NAN, |r| r.loss),
                n.history.last().map_or(f64::NAN, |r| r.loss)),
        ));
    }

    // 4. Predicted time to target vs batch, per device.
    if !d.decision.time_to_target.is_empty() {
        let mut series = Vec::new();
        for (i, dev) in d.devices.iter().enumerate() {
            let mut pts: Vec<(f64, f64)> = d
                .decision
                .time_to_target
                .iter()
                .filter(|o| o.option.device == dev.device && o.option.accumulation == 1)
                .map(|o| (o.option.micro_batch as f64, o.vs_best))
                .collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            series.push(Series {
                label: format!("{} (predicted)", dev.device),
                points: pts,
                kind: SeriesKind::LineAndPoints,
                color: i,
            });
        }
        figs.push((
            Figure { title: "Predicted time to target vs batch size".into(), x_label: "batch size".into(), y_label: "time relative to the best option".into(), log_x: true, series, markers: vec![] },
            "Predicted: updates needed S(B) = S_min (1 + B_noise/B) from the measured noise scale, times the measured step time at B; 1.0 is the fastest option.".into(),
        ));
    }
    figs
}

/// The self-contained HTML page: inline SVG, no scripts, no external fonts.
pub fn html(d: &Advice) -> String {
    let mut body = String::new();
    body.push_str(&format!(
        "<h1>batchfit: {}</h1>\n<p class=\"meta\">{} parameters · data: {} · machine: {}<br>command: <code>{}</code></p>\n",
        esc(&d.model),
        thousands(d.parameters),
        esc(d.data.as_deref().unwrap_or("synthetic")),
        esc(&d.machine),
        esc(&d.command)
    ));
    body.push_str("<h2>Recommendation</h2>\n<pre>");
    body.push_str(&esc(&render(d)));
    body.push_str("</pre>\n<h2>Figures</h2>\n");
    body.push_str(&crate::figures_html(figures(d)));
    body.push_str("<h2>Measurements</h2>\n<pre>");
    body.push_str(&esc(&crate::probe::render(&d.model, &d.devices)));
    body.push_str("</pre>\n");
    if let Some(n) = &d.noise {
        body.push_str("<h2>Noise scale</h2>\n<pre>");
        body.push_str(&esc(&crate::noise::render(n)));
        body.push_str("</pre>\n");
    }
    body.push_str("<h2>Plan</h2>\n<pre>");
    body.push_str(&esc(&crate::plan::render(&d.plan, &[])));
    body.push_str("</pre>\n");
    crate::page(&d.model, &body)
}

/// The time-to-target table `advise` and `run` print (empty without rows).
pub fn time_to_target_table(
    rows: &[TimeToTarget],
    target_loss: Option<f64>,
    source: &str,
) -> String {
    let mut out = String::new();
    if !rows.is_empty() {
        out.push_str(&format!(
            "\nPREDICTED TIME TO TARGET{} ({source})\n",
            target_loss
                .map(|l| format!(" (loss {l:.4})"))
                .unwrap_or_default()
        ));
        let mut t = table(&[
            "device",
            "batch",
            "accumulation",
            "effective",
            "updates",
            "lr",
            "time / update",
            "time to target",
            "vs best",
        ]);
        for o in rows.iter().take(14) {
            t.add_row(vec![
                o.option.device.to_string(),
                thousands(o.option.micro_batch),
                format!("x{}", o.option.accumulation),
                thousands(o.option.effective_batch()),
                match (o.steps, o.steps_band) {
                    // A band that rounds to the estimate says nothing the estimate does not.
                    (Some(s), Some((lo, hi)))
                        if format!("{lo:.0}{hi:.0}") != format!("{s:.0}{s:.0}") =>
                    {
                        format!("{s:.0} ({lo:.0}–{hi:.0})")
                    }
                    (Some(s), _) => format!("{s:.0}"),
                    (None, _) => format!("{:.2}x min", o.steps_vs_min),
                },
                o.learning_rate
                    .map(|l| format!("{l:.2e}"))
                    .unwrap_or_else(|| "-".into()),
                crate::duration(o.option.update_s()),
                o.seconds.map(crate::duration).unwrap_or_else(|| "-".into()),
                if o.vs_best <= 1.0 + 1e-9 {
                    "best".into()
                } else {
                    format!("{:.2}x", o.vs_best)
                },
            ]);
        }
        align_numbers(&mut t, 1);
        out.push_str(&t.to_string());
        out.push('\n');
    }
    out
}

/// The lines under the time-to-target table that say what it assumes.
pub fn prediction_basis(p: &PredictionBasis) -> String {
    let run = match p.run() {
        Some(r) => format!(
            "; the noise run trained at batch {} with lr {:.2e}",
            thousands(r.batch),
            r.lr
        ),
        None => String::new(),
    };
    let held = if p.lr.cap_batch.is_some() {
        "; held past B_noise, where the best rate stops growing"
    } else {
        ""
    };
    let warmup = if p.warmup_epochs > 0.0 {
        format!("a {} epoch(s) linear warm-up", p.warmup_epochs)
    } else {
        "no warm-up".to_string()
    };
    format!(
        "  assumes: learning rate lr(B) = {} ({}{held}) at every batch, {warmup}{run};\n  updates: {} (S_min {:.0}, B_noise {:.0}{}); one update = {}.\n",
        prose::formula(&p.lr),
        p.lr.rule.source(),
        prose::basis_method(p),
        p.curve.s_min,
        p.curve.b_noise,
        p.b_simple_end()
            .map(|b| format!("; B_simple {b:.0} at the run's end"))
            .unwrap_or_default(),
        prose::STEP_TIME
    )
}

/// The JSON document of `batchfit schedule --json`: the ramp to export (the
/// first device's) and every device's plan, with what they rest on.
#[derive(Serialize)]
pub struct ScheduleDocument<'a> {
    pub schema_version: u32,
    pub kind: &'static str,
    pub model: &'a str,
    pub data: Option<&'a str>,
    pub command: &'a str,
    pub inputs: &'a AdviceInputs,
    pub target_loss: Option<f64>,
    /// The stages to train with: `sweep --schedule FILE` reads this key.
    pub schedule: Schedule,
    /// Per device: stages as micro-batch x accumulation, predicted updates and time beside the best fixed batch.
    pub devices: Vec<DeviceScheduleJson<'a>>,
    pub prediction: Option<BasisJson<'a>>,
}

impl<'a> ScheduleDocument<'a> {
    /// The schedule part of an advice; `None` when it has none (no noise run).
    pub fn of(d: &'a Advice) -> Option<ScheduleDocument<'a>> {
        let first = d.decision.schedules.first()?;
        Some(ScheduleDocument {
            schema_version: crate::SCHEMA_VERSION,
            kind: "schedule",
            model: &d.model,
            data: d.data.as_deref(),
            command: &d.command,
            inputs: &d.inputs,
            target_loss: d.decision.target_loss,
            schedule: Schedule {
                stages: first
                    .stages
                    .iter()
                    .map(|s| Stage {
                        from_samples: s.from_samples,
                        batch: s.batch,
                        lr: s.lr,
                    })
                    .collect(),
            },
            devices: DeviceScheduleJson::all(&d.decision.schedules),
            prediction: d.decision.basis.as_ref().map(BasisJson::new),
        })
    }
}

/// The terminal report of `batchfit schedule`.
pub fn render_schedule(d: &ScheduleDocument) -> String {
    let (devices, prediction) = (&d.devices, &d.prediction);
    let mut out = format!(
        "batch-size schedule for {}{}, to training loss {}\n",
        d.model,
        d.data
            .as_ref()
            .map(|s| format!(" on {s}"))
            .unwrap_or_default(),
        d.target_loss.map_or("-".into(), |t| format!("{t:.4}"))
    );
    for s in devices {
        out.push_str(&schedule_table(s.schedule));
    }
    if let Some(p) = prediction {
        out.push_str(&prediction_basis(p.basis));
    }
    out.push_str("\nExport: --json writes the stages (`schedule.stages`: from_samples, batch, lr); docs/schedule.md has a PyTorch loop and a Lightning callback that follow them. Check it: `batchfit sweep --schedule FILE` trains it beside fixed batches.\n");
    out
}

/// A device's batch-size ramp: its stages and how it compares (predicted).
pub fn schedule_table(s: &DeviceSchedule) -> String {
    let mut out = format!(
        "\nBATCH-SIZE SCHEDULE ON {} (predicted: the batch doubles as the noise scale grows; `batchfit sweep --schedule ramp` trains it)\n",
        s.device
    );
    let mut t = table(&[
        "from samples",
        "batch",
        "micro-batch",
        "accumulation",
        "lr",
        "updates",
        "time / update",
    ]);
    for st in &s.stages {
        t.add_row(vec![
            thousands(st.from_samples),
            thousands(st.batch),
            thousands(st.micro_batch),
            format!("x{}", st.accumulation),
            format!("{:.2e}", st.lr),
            format!("{:.0}", st.steps),
            st.update_s
                .map(crate::duration)
                .unwrap_or_else(|| "-".into()),
        ]);
    }
    align_numbers(&mut t, 0);
    out.push_str(&t.to_string());
    out.push('\n');
    out.push_str(&format!("  {}\n", prose::schedule_statement(s)));
    out
}

/// The `--gpus` table: time to target across world sizes, and where scaling stops paying.
pub fn world_size_table(w: &WorldSizes) -> String {
    let mut out = format!(
        "\nPREDICTED TIME TO TARGET ACROSS WORLD SIZES ({} devices like {}, {}, {:.0} Gb/s ring; measured step + ring communication)\n",
        w.table.len(),
        w.device,
        w.strategy.name(),
        w.link_gbps
    );
    let mut t = table(&[
        "devices",
        "micro-batch",
        "global batch",
        "updates vs min",
        "time / update",
        "time to target",
        "vs best",
    ]);
    let mut rows: Vec<&batchfit_tune::target::ScaleTime> = w.table.iter().collect();
    rows.sort_by_key(|r| r.option.world_size);
    for r in rows {
        t.add_row(vec![
            r.option.world_size.to_string(),
            thousands(r.option.micro_batch),
            thousands(r.global_batch),
            format!("{:.2}x", r.updates_vs_min),
            crate::duration(r.option.update_s),
            r.seconds.map(crate::duration).unwrap_or_else(|| "-".into()),
            if r.vs_best <= 1.0 + 1e-9 {
                "best".into()
            } else {
                format!("{:.2}x", r.vs_best)
            },
        ]);
    }
    align_numbers(&mut t, 0);
    out.push_str(&t.to_string());
    out.push('\n');
    let critical = if (w.critical_batch - w.b_noise).abs() < 0.5 {
        format!("the critical batch (B_noise) ≈ {:.0}", w.critical_batch)
    } else {
        format!(
            "the critical batch ≈ {:.0} (B_noise {:.0} on the data's rows)",
            w.critical_batch, w.b_noise
        )
    };
    match w.within_critical_batch {
        Some(n) => out.push_str(&format!(
            "  past {n} device{} the global batch exceeds {critical}: each added device then buys less than it costs in samples\n",
            if n == 1 { "" } else { "s" }
        )),
        None => out.push_str(&format!(
            "  every world size given puts the global batch above {critical}\n"
        )),
    }
    if let Some(l) = &w.limit {
        match (l.stop_after, l.elasticity) {
            (Some(n), Some(e)) => out.push_str(&format!(
                "  extra devices stop paying after {n}: the next size cuts the time to target by only {:.0} % of what it adds in devices (elasticity {e:.2} < 0.5)\n",
                100.0 * e
            )),
            _ => out.push_str("  every world size given still pays (elasticity of time to target at least 0.5)\n"),
        }
    }
    out
}
