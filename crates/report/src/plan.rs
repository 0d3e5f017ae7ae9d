//! The `plan` report.

use crate::{align_numbers, table, thousands};
use batchfit_plan::{Bytes, Plan};
use serde::Serialize;

/// A memory budget and what fits in it.
#[derive(Clone, Debug, Serialize)]
pub struct BudgetFit {
    /// Preset name, or `memory` for `--memory`.
    pub name: String,
    pub budget_bytes: Bytes,
    /// Largest batch whose planned peak fits; `null` if none.
    pub max_batch: Option<u64>,
    /// Planned peak at `max_batch`.
    pub peak_bytes: Option<Bytes>,
}

impl BudgetFit {
    /// What fits `budget` under `plan` (plan it with the device's GPU flag set).
    pub fn new(plan: &Plan, name: &str, budget: Bytes) -> BudgetFit {
        let max_batch = plan.max_batch(budget);
        BudgetFit {
            name: name.to_string(),
            budget_bytes: budget,
            max_batch,
            peak_bytes: max_batch.map(|b| plan.bytes_at(b)),
        }
    }
}

/// The JSON document of `batchfit plan --json`.
#[derive(Serialize)]
pub struct PlanDocument<'a> {
    pub schema_version: u32,
    pub kind: &'static str,
    #[serde(flatten)]
    pub plan: &'a Plan,
    /// Largest batch for the first budget asked (`--memory` or the first preset); null if none fits or none was asked.
    pub max_batch: Option<u64>,
    pub budgets: &'a [BudgetFit],
}

impl<'a> PlanDocument<'a> {
    pub fn new(plan: &'a Plan, budgets: &'a [BudgetFit]) -> Self {
        PlanDocument {
            schema_version: crate::SCHEMA_VERSION,
            kind: "plan",
            plan,
            max_batch: budgets.first().and_then(|b| b.max_batch),
            budgets,
        }
    }
}

/// Per-layer table, totals, and max batch per budget.
pub fn render(plan: &Plan, budgets: &[BudgetFit]) -> String {
    let mut out = String::new();
    let o = &plan.options;
    out.push_str(&format!(
        "Plan of {} — {} parameters; optimizer {:?}, precision {:?}, runtime {:?}{}{}{}\n",
        plan.model,
        thousands(plan.parameters),
        o.optimizer,
        o.precision,
        o.runtime,
        plan.seq_len
            .map(|t| format!(", sequence length T = {t}"))
            .unwrap_or_default(),
        if o.checkpointing {
            ", checkpointing"
        } else {
            ""
        },
        o.micro_batch
            .map(|m| format!(", micro-batch {m}"))
            .unwrap_or_default(),
    ));
    out.push_str("(predicted: static plan, not measured)\n\n");

    let mut t = table(&[
        "layer",
        "op",
        "output",
        "params",
        "saved/sample",
        "fwd FLOPs/sample",
    ]);
    for l in &plan.layers {
        t.add_row(vec![
            l.name.clone(),
            l.op.to_string(),
            l.output_shape.clone(),
            thousands(l.parameters),
            l.saved_bytes_per_sample.to_string(),
            l.forward_flops_per_sample.to_string(),
        ]);
    }
    align_numbers(&mut t, 3);
    out.push_str(&t.to_string());
    out.push_str("\n\n");

    let f = &plan.fixed;
    let s = &plan.per_sample;
    let mut t = table(&["memory at the peak", "fixed", "per sample"]);
    let rows: [(&str, Bytes, Option<Bytes>); 9] = [
        ("weights", f.weights, None),
        ("gradients", f.gradients, None),
        ("optimizer state", f.optimizer_state, None),
        ("optimizer update temporaries", f.optimizer_transient, None),
        (
            "buffers / accumulation / runtime",
            f.buffers + f.accumulation + f.runtime,
            None,
        ),
        ("batch data (inputs + targets)", Bytes(0), Some(s.data)),
        (
            "activations saved for backward",
            Bytes(0),
            Some(s.activations),
        ),
        (
            "transient at peak (grads, workspace)",
            Bytes(0),
            Some(s.transient_at_peak),
        ),
        (
            "total",
            plan.memory.fixed_bytes,
            Some(plan.memory.per_sample_bytes),
        ),
    ];
    for (name, fixed, per) in rows {
        t.add_row(vec![
            name.to_string(),
            if fixed.0 == 0 && per.is_some() {
                String::new()
            } else {
                fixed.to_string()
            },
            per.map(|b| b.to_string()).unwrap_or_default(),
        ]);
    }
    align_numbers(&mut t, 1);
    out.push_str(&t.to_string());
    out.push_str(&format!(
        "\nmemory(B) = {} + {} x B   (peak during {}){}\ncompute: {} forward, {} per training sample\n",
        plan.memory.fixed_bytes,
        plan.memory.per_sample_bytes,
        plan.peak_at,
        if plan.options.runtime == batchfit_plan::Runtime::Burn {
            "\n(burn frees and creates gradients during backward, so only what is alive at that moment is\n counted; at small batches another moment can peak higher, which max batch and planned peak use)"
        } else {
            ""
        },
        plan.forward_flops_per_sample,
        plan.train_flops_per_sample,
    ));

    if !budgets.is_empty() {
        out.push('\n');
        let mut t = table(&["budget", "memory", "max batch", "planned peak"]);
        for b in budgets {
            t.add_row(vec![
                b.name.clone(),
                b.budget_bytes.to_string(),
                b.max_batch
                    .map(thousands)
                    .unwrap_or_else(|| "none fits".into()),
                b.peak_bytes.map(|p| p.to_string()).unwrap_or_default(),
            ]);
        }
        align_numbers(&mut t, 1);
        out.push_str(&t.to_string());
        out.push('\n');
    }
    out
}
