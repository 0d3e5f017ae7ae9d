//! The `noise` report: gradient noise scale, critical batch, predictions, learning rates.

use crate::{align_numbers, table, thousands};
use batchfit_tune::noise::{NoiseRecord, NoiseRun};
use serde::Serialize;

/// The JSON document of `batchfit noise --json` (and `advise`'s `noise`).
#[derive(Serialize)]
pub struct NoiseDocument<'a> {
    pub schema_version: u32,
    pub kind: &'static str,
    #[serde(flatten)]
    pub run: &'a NoiseRun,
    /// The data as read, with its findings (`noise` only; `advise` has its own).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_profile: Option<crate::data::DataJson<'a>>,
}

impl<'a> NoiseDocument<'a> {
    pub fn new(run: &'a NoiseRun) -> NoiseDocument<'a> {
        NoiseDocument {
            schema_version: crate::SCHEMA_VERSION,
            kind: "noise",
            run,
            data_profile: None,
        }
    }

    /// The same with the data's profile.
    pub fn with_data(self, profile: &'a batchfit_tune::dataset::DataProfile) -> NoiseDocument<'a> {
        NoiseDocument {
            data_profile: Some(crate::data::DataJson::new(profile)),
            ..self
        }
    }
}

fn band(r: &NoiseRecord) -> String {
    match (r.b_simple_low, r.b_simple_high) {
        (Some(l), Some(h)) => format!("{l:.0} – {h:.0}"),
        (Some(l), None) => format!("{l:.0} – ∞"),
        _ => "-".into(),
    }
}

/// The table a person reads.
pub fn render(d: &NoiseRun) -> String {
    let mut out = format!(
        "Gradient noise scale of {} on {} ({} rows): {} steps of {} at lr {}, B_small {}, B_big {} (measured)\n",
        d.model,
        d.data,
        thousands(d.rows as u64),
        d.steps,
        d.optimizer.name(),
        d.lr,
        d.b_small,
        d.b_big
    );
    let mut t = table(&["step", "epoch", "loss", "B_simple", "90 % band"]);
    let n = d.history.len();
    let every = (n / 10).max(1);
    for (i, r) in d.history.iter().enumerate() {
        if i % every == 0 || i + 1 == n {
            t.add_row(vec![
                r.step.to_string(),
                r.epoch.to_string(),
                format!("{:.4}", r.loss),
                r.b_simple
                    .map(|b| format!("{b:.1}"))
                    .unwrap_or_else(|| "-".into()),
                band(r),
            ]);
        }
    }
    align_numbers(&mut t, 0);
    out.push_str(&t.to_string());
    out.push('\n');
    let Some(b) = d.b_simple else {
        out.push_str("\nno estimate: the measured |G|^2 or tr(Sigma) stayed at or below zero (try more --steps or a larger --k)\n");
        return out;
    };
    // The first estimate whose band is finite: earlier ones rest on a handful of samples.
    let first = d
        .history
        .iter()
        .find(|r| r.b_simple_high.is_some())
        .and_then(|r| r.b_simple.map(|b| (r.step, b, r.loss)));
    if let Some((s, b0, l0)) = first
        && d.lr > 0.0
    {
        out.push_str(&format!(
            "\nB_simple went from {b0:.0} (step {s}, loss {l0:.4}) to {b:.0} (step {}, loss {:.4}); it typically grows as the loss falls.\n",
            n.saturating_sub(1),
            d.history.last().map_or(f64::NAN, |r| r.loss),
        ));
    }
    let crit = d.critical_batch.unwrap_or(1);
    out.push_str(&format!(
        "\ncritical batch ≈ {} (predicted from the measured B_simple; 90 % band {}).\n\
         Below it, doubling the batch nearly halves the steps needed; far above it, extra samples\n\
         per step are wasted: the steps hardly fall while the epochs needed grow.\n\n",
        thousands(crit),
        d.history.last().map(band).unwrap_or_default()
    ));
    let mut header = vec!["batch", "steps vs minimum", "samples (epochs) vs minimum"];
    if d.lr_advice.is_some() {
        header.push("learning rate");
    }
    let mut t = table(&header);
    for p in &d.predictions {
        let mut row = vec![
            thousands(p.batch),
            format!("{:.2}x", p.steps_vs_min),
            format!("{:.2}x", p.samples_vs_min),
        ];
        if let Some(lr) = &d.lr_advice {
            let v = lr
                .per_batch
                .iter()
                .find(|(b, _)| *b == p.batch)
                .map(|x| x.1);
            row.push(v.map(|v| format!("{v:.3e}")).unwrap_or_default());
        }
        t.add_row(row);
    }
    align_numbers(&mut t, 0);
    out.push_str(&t.to_string());
    out.push_str("\n(predicted: S(B) = S_min (1 + B_noise/B), E(B) = E_min (1 + B/B_noise), McCandlish et al. 2018)\n");
    if let Some(lr) = &d.lr_advice {
        out.push_str(&format!(
            "learning rates: {} from lr {} at batch {}; warm up over the first epochs when scaling up.\n",
            lr.source, lr.ref_lr, lr.ref_batch
        ));
    }
    out
}
