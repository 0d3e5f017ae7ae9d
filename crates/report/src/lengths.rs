//! Variable-length sequences: the bucket table and the batching schemes compared,
//! for `plan --lengths` and `probe --lengths`.

use crate::{align_numbers, duration, table, thousands};
use batchfit_tune::lengths::{
    BatchSource, BucketMeasurement, EpochCheck, MeasuredStep, NamedLengthPlan, RunLengths,
    SchemeKind, StepTimeModel,
};
use serde::Serialize;

/// How lengths are labelled: frames (the model's sequence axis), and seconds
/// when the frame rate is known.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct LengthUnits {
    pub frames_per_second: Option<f64>,
}

impl LengthUnits {
    fn len(&self, frames: u64) -> String {
        match self.frames_per_second {
            Some(fps) => format!("{} ({:.1} s)", thousands(frames), frames as f64 / fps),
            None => thousands(frames),
        }
    }
}

/// The bucket table `--emit buckets` writes, for a sampler to read (docs/lengths.md).
#[derive(Serialize)]
pub struct BucketsDocument<'a> {
    pub schema_version: u32,
    /// Always `buckets`.
    pub kind: &'static str,
    pub model: &'a str,
    pub budget: &'a str,
    pub budget_bytes: u64,
    /// Lengths are in the model's sequence steps (frames, tokens).
    pub frames_per_second: Option<f64>,
    /// The largest batch for any length up to the longest.
    pub fixed_batch: u64,
    /// Padded frames per batch (batch x longest in batch) that fit at every length.
    pub frame_budget: u64,
    /// Ascending: a sample of length L goes to the first bucket with `max_len >= L`.
    pub buckets: Vec<BucketEntry>,
}

/// One bucket for a sampler.
#[derive(Serialize)]
pub struct BucketEntry {
    pub min_len: u64,
    pub max_len: u64,
    pub batch: u64,
}

impl<'a> BucketsDocument<'a> {
    pub fn new(model: &'a str, p: &'a NamedLengthPlan, units: LengthUnits) -> Self {
        BucketsDocument {
            schema_version: crate::SCHEMA_VERSION,
            kind: "buckets",
            model,
            budget: &p.budget,
            budget_bytes: p.plan.budget_bytes.0,
            frames_per_second: units.frames_per_second,
            fixed_batch: p.plan.fixed_batch,
            frame_budget: p.plan.frame_budget,
            buckets: p
                .plan
                .buckets
                .iter()
                .map(|b| BucketEntry {
                    min_len: b.shortest,
                    max_len: b.longest,
                    batch: b.batch,
                })
                .collect(),
        }
    }
}

/// The lengths, the memory form, and per budget the bucket table and the schemes.
pub fn render(plans: &[NamedLengthPlan], units: LengthUnits) -> String {
    let Some(first) = plans.first() else {
        return String::new();
    };
    let s = &first.plan.lengths;
    let mut out = format!(
        "\nLengths: {} sequences of {} to {} steps; median {}, 90 % at most {}.\n",
        thousands(s.samples),
        units.len(s.min),
        units.len(s.max),
        units.len(s.median),
        units.len(s.p90),
    );
    let m = &first.plan.memory_form;
    out.push_str(&format!(
        "Memory at batch B and length T (planned, the moment `{}`): {} + B x ({:.0} + {:.0} T{}) bytes.\n",
        m.moment,
        m.fixed_bytes,
        m.per_sample_bytes,
        m.per_frame_bytes,
        if m.per_frame_squared_bytes.abs() >= 0.5 {
            format!(" + {:.0} T^2", m.per_frame_squared_bytes)
        } else {
            String::new()
        },
    ));
    for named in plans {
        out.push_str(&render_one(named, units));
    }
    out.push_str(LOSS_NOTE);
    out
}

/// What variable batches do to the gradient's noise and the learning rate.
const LOSS_NOTE: &str = "\nVariable batches and the learning rate: with the loss averaged over the samples of a batch \
(PyTorch's default; CTC's `mean` also divides each sample by its target length), a bucket's step averages \
its own number of samples, so small batches of long sequences are noisier steps. Keep one rate tuned at the \
fixed batch, or scale it per step by the rule of the optimizer (square root of batch / reference for Adam, \
linear for SGD). Under a frame budget every step holds about the same number of frames: with the loss summed \
over frames and divided by the budget, one rate serves every step.\n";

fn render_one(named: &NamedLengthPlan, units: LengthUnits) -> String {
    let p = &named.plan;
    let mut out = format!("\nBudget {} ({}):\n", named.budget, p.budget_bytes);
    match p.batches_from {
        BatchSource::Measured => out.push_str(
            "  Batches: the largest that ran at each bucket's longest sequence (measured below).\n",
        ),
        BatchSource::Planned if p.margin > 0.0 => out.push_str(&format!(
            "  Batches are planned to fit {} ({:.1} % below the budget: the most this runtime's plan has under-counted its peak).\n",
            p.sized_for_bytes,
            100.0 * p.margin
        )),
        BatchSource::Planned => {}
    }
    out.push_str(&format!(
        "  Fixed batch that fits the longest sequence ({}): {}.\n",
        units.len(p.lengths.max),
        thousands(p.fixed_batch)
    ));
    if let Some(m) = p.scheme(SchemeKind::MedianBenchmark) {
        out.push_str(&format!(
            "  A batch sized at the median length ({}) would be {}: {} of its {} batches of an epoch exceed the budget (planned), the longest at {} of {}.\n",
            units.len(p.lengths.median),
            thousands(p.median_batch),
            thousands(m.batches_over_budget),
            thousands(m.steps),
            m.planned_peak,
            p.budget_bytes,
        ));
    }
    let mut t = table(&["bucket", "lengths", "samples", "batch", "planned peak"]);
    for (i, b) in p.buckets.iter().enumerate() {
        t.add_row(vec![
            (i + 1).to_string(),
            format!("{} – {}", units.len(b.shortest), units.len(b.longest)),
            thousands(b.samples),
            thousands(b.batch),
            b.planned_bytes.to_string(),
        ]);
    }
    align_numbers(&mut t, 2);
    out.push_str(&format!(
        "Bucket table (the largest batch at each bucket's longest sequence):\n{t}\n"
    ));
    out.push_str(&format!(
        "Frame budget: {} padded steps per batch (batch x longest in batch).\n",
        thousands(p.frame_budget)
    ));
    let timed = p.schemes.iter().any(|s| s.predicted_epoch_s.is_some());
    let mut header = vec![
        "scheme",
        "steps",
        "padding",
        "compute (TFLOP)",
        "planned peak",
        "riskiest batch",
    ];
    if timed {
        header.push("epoch (predicted)");
    }
    let mut t = table(&header);
    for s in &p.schemes {
        let mut row = vec![
            s.kind.label().to_string(),
            thousands(s.steps),
            format!("{:.0} %", 100.0 * s.padding_waste),
            format!("{:.1}", s.train_flops / 1e12),
            // Measured batches are the limit itself: the plan's peak of them may pass the
            // budget by the plan's error; only a scheme sized at the median is over.
            if s.batches_over_budget > 0
                && (s.kind == SchemeKind::MedianBenchmark || p.batches_from == BatchSource::Planned)
            {
                format!("{} (over)", s.planned_peak)
            } else {
                s.planned_peak.to_string()
            },
            format!(
                "{} x {}",
                thousands(s.riskiest_batch.0),
                units.len(s.riskiest_batch.1)
            ),
        ];
        if timed {
            row.push(s.predicted_epoch_s.map_or("-".into(), duration));
        }
        t.add_row(row);
    }
    align_numbers(&mut t, 1);
    out.push_str(&format!(
        "One epoch of each scheme (simulated; each batch padded to its longest sequence):\n{t}\n"
    ));
    out
}

/// The JSON document of `probe --lengths --json`.
#[derive(Serialize)]
pub struct LengthProbeDocument<'a> {
    pub schema_version: u32,
    /// Always `probe_lengths`.
    pub kind: &'static str,
    pub model: &'a str,
    pub device: String,
    pub plan: &'a NamedLengthPlan,
    /// Longest bucket first, as measured.
    pub buckets: &'a [BucketMeasurement],
    /// Every timed step the step-time model is fitted to.
    pub timed_steps: &'a [MeasuredStep],
    /// Step seconds = overhead + per-step x T + training FLOPs / rate.
    pub step_model: Option<StepTimeModel>,
    /// `--measure-epochs`: each scheme's epoch timed beside its prediction.
    pub epochs: &'a [EpochCheck],
    pub seconds: f64,
}

/// The buckets as measured: the plan's batch, the limit found, planned against
/// measured peak at it, and its step.
pub fn render_measured(
    device: &str,
    buckets: &[BucketMeasurement],
    model: Option<&StepTimeModel>,
    units: LengthUnits,
) -> String {
    let mut t = table(&[
        "longest",
        "planned batch",
        "largest that ran",
        "smallest out of memory",
        "trials",
        "planned peak",
        "measured peak",
        "error",
        "step",
    ]);
    let opt = |v: Option<u64>| v.map_or("-".into(), thousands);
    for b in buckets {
        t.add_row(vec![
            units.len(b.longest),
            thousands(b.planned_batch),
            opt(b.max_batch),
            opt(b.smallest_failure),
            b.trials.to_string(),
            b.planned_bytes.map_or("-".into(), |p| p.to_string()),
            b.measured_peak.map_or("-".into(), |p| p.to_string()),
            b.peak_error()
                .map_or("-".into(), |e| format!("{:+.1} %", 100.0 * e)),
            b.step_s.map_or("-".into(), duration),
        ]);
    }
    align_numbers(&mut t, 0);
    let mut out = format!(
        "\nBuckets measured on {device} (searched longest first; the tables above use the largest batches that ran):\n{t}\n"
    );
    let errors: Vec<f64> = buckets.iter().filter_map(|b| b.peak_error()).collect();
    if let (Some(lo), Some(hi)) = (
        errors.iter().copied().reduce(f64::min),
        errors.iter().copied().reduce(f64::max),
    ) {
        out.push_str(&format!(
            "Planned vs measured peak at the largest batch that ran: {:+.1} % to {:+.1} % over {} buckets.\n",
            100.0 * lo,
            100.0 * hi,
            errors.len()
        ));
    }
    let sharp = buckets
        .iter()
        .filter(|b| b.limit_within_10_percent())
        .count();
    out.push_str(&format!(
        "{sharp} of {} buckets: a batch at most 10 % above the largest that ran ran out of memory.\n",
        buckets.len()
    ));
    for b in buckets.iter().filter(|b| b.stopped.is_some()) {
        out.push_str(&format!(
            "Bucket up to {}: stopped: {}\n",
            units.len(b.longest),
            b.stopped.as_deref().unwrap_or_default()
        ));
    }
    if let Some(m) = model {
        out.push_str(&format!(
            "Step time fitted to the timed steps: {} + {} x T + training FLOPs / {:.1} GFLOP/s; the epoch times above are predicted from it.\n",
            duration(m.overhead_s),
            duration(m.per_step_s),
            m.flops_per_s / 1e9
        ));
    }
    out
}

/// Each scheme's epoch as timed beside its prediction, and the gain of buckets and
/// of the frame budget over the fixed batch, both ways.
pub fn render_epochs(epochs: &[EpochCheck]) -> String {
    if epochs.is_empty() {
        return String::new();
    }
    let mut t = table(&[
        "scheme",
        "steps",
        "timed",
        "epoch (measured)",
        "epoch (predicted)",
        "error",
    ]);
    for e in epochs {
        t.add_row(vec![
            e.kind.label().to_string(),
            thousands(e.steps),
            thousands(e.timed),
            match &e.failed {
                Some(why) => format!("did not run: {why}"),
                None => duration(e.measured_epoch_s),
            },
            e.predicted_epoch_s.map_or("-".into(), duration),
            e.predicted_epoch_s.map_or("-".into(), |p| {
                format!("{:+.1} %", 100.0 * (p / e.measured_epoch_s - 1.0))
            }),
        ]);
    }
    align_numbers(&mut t, 1);
    let mut out = format!(
        "\nEpochs timed (each batch in its own run; a sample of every k-th batch by shape when `timed` < `steps`, scaled to the epoch):\n{t}\n"
    );
    let fixed = epochs
        .iter()
        .find(|e| e.kind == SchemeKind::Fixed && e.failed.is_none());
    for e in epochs
        .iter()
        .filter(|e| e.kind != SchemeKind::Fixed && e.failed.is_none())
    {
        let Some(f) = fixed else { break };
        let measured = f.measured_epoch_s / e.measured_epoch_s;
        let predicted = match (f.predicted_epoch_s, e.predicted_epoch_s) {
            (Some(pf), Some(pe)) => format!(
                "{pf_pe:.2}x predicted ({:+.1} %)",
                100.0 * (pf / pe / measured - 1.0),
                pf_pe = pf / pe
            ),
            _ => "not predicted".into(),
        };
        out.push_str(&format!(
            "Gain of {} over the fixed batch: {measured:.2}x measured, {predicted}.\n",
            e.kind.label()
        ));
    }
    out
}

/// The JSON document of `run --lengths --json`.
#[derive(Serialize)]
pub struct RunLengthsDocument<'a> {
    pub schema_version: u32,
    /// Always `run_lengths`.
    pub kind: &'static str,
    #[serde(flatten)]
    pub run: &'a RunLengths,
}

impl<'a> RunLengthsDocument<'a> {
    pub fn new(run: &'a RunLengths) -> Self {
        RunLengthsDocument {
            schema_version: crate::SCHEMA_VERSION,
            kind: "run_lengths",
            run,
        }
    }
}

/// The buckets as the user's command ran them.
pub fn render_run(d: &RunLengths, units: LengthUnits) -> String {
    let opt = |v: Option<u64>| v.map_or("-".into(), thousands);
    let mut t = table(&[
        "bucket",
        "lengths",
        "samples",
        "largest that ran",
        "smallest out of memory",
        "trials",
    ]);
    for (i, b) in d.buckets.iter().enumerate() {
        t.add_row(vec![
            (i + 1).to_string(),
            format!("{} – {}", units.len(b.shortest), units.len(b.longest)),
            thousands(b.samples),
            opt(b.max_batch),
            opt(b.smallest_failure),
            b.trials.to_string(),
        ]);
    }
    align_numbers(&mut t, 2);
    let mut out = format!(
        "Command: {}\nLengths: {} sequences of {} to {} steps; each bucket searched at its longest length, longest first (measured):\n{t}\n",
        d.command,
        thousands(d.lengths.samples),
        units.len(d.lengths.min),
        units.len(d.lengths.max),
    );
    for b in d.buckets.iter().filter(|b| b.stopped_at.is_some()) {
        out.push_str(&format!(
            "Bucket up to {}: the search stopped at batch {} (a crash or time-out, not out of memory).\n",
            units.len(b.longest),
            opt(b.stopped_at)
        ));
    }
    if let (Some(f), Some(b)) = (&d.fixed_epoch, &d.bucket_epoch) {
        out.push_str(&format!(
            "One epoch (simulated): the longest bucket's batch for all, {} steps with {:.0} % padding; each bucket's own batch, {} steps with {:.0} % padding.\n",
            thousands(f.steps),
            100.0 * f.padding_waste,
            thousands(b.steps),
            100.0 * b.padding_waste
        ));
    }
    out.push_str(&format!("Searched in {}.\n", crate::duration(d.seconds)));
    out
}
