//! The `plan` report.

use crate::{align_numbers, table, thousands};
use batchfit_plan::accuracy::MeasuredError;
use batchfit_plan::{Bytes, Plan};
use serde::Serialize;

/// A memory budget and what fits in it.
#[derive(Clone, Debug, Serialize)]
pub struct BudgetFit {
    /// Preset name, or `memory` for `--memory`.
    pub name: String,
    /// The budget.
    pub budget_bytes: Bytes,
    /// Largest batch whose planned peak fits; `null` if none.
    pub max_batch: Option<u64>,
    /// Planned peak at `max_batch`.
    pub peak_bytes: Option<Bytes>,
    /// How far this device's plan has been from the runtime's own count (null: never
    /// measured).
    pub measured_error: Option<MeasuredError>,
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
            measured_error: plan.measured_error,
        }
    }
}

/// The JSON document of `batchfit plan --json`.
#[derive(Serialize)]
pub struct PlanDocument<'a> {
    /// [`crate::SCHEMA_VERSION`].
    pub schema_version: u32,
    /// Always `plan`.
    pub kind: &'static str,
    /// The plan's own fields, at the top level (`memory.moments` reproduces `max_batch`).
    #[serde(flatten)]
    pub plan: &'a Plan,
    /// Largest batch for the first budget asked (`--memory` or the first preset); null if none fits or none was asked.
    pub max_batch: Option<u64>,
    pub budgets: &'a [BudgetFit],
    /// Notes on how the model was exported (an ONNX model that looks exported in eval mode).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// `--gpus`: memory per device, batches and communication per (world size, strategy).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub distributed: Option<&'a crate::scale::Distributed>,
    /// `--lengths`: per budget, the bucket table and the batching schemes over the lengths.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lengths: Option<&'a [batchfit_tune::lengths::NamedLengthPlan]>,
}

impl<'a> PlanDocument<'a> {
    /// The document of `plan` with what fits each of `budgets`.
    pub fn new(plan: &'a Plan, budgets: &'a [BudgetFit]) -> Self {
        PlanDocument {
            schema_version: crate::SCHEMA_VERSION,
            kind: "plan",
            plan,
            max_batch: budgets.first().and_then(|b| b.max_batch),
            budgets,
            distributed: None,
            lengths: None,
            notes: Vec::new(),
        }
    }
}

/// Per-layer table, totals, and max batch per budget.
pub fn render(plan: &Plan, budgets: &[BudgetFit]) -> String {
    let mut out = String::new();
    let o = &plan.options;
    out.push_str(&format!(
        "Plan of {} — {} parameters; loss {}, optimizer {:?}, precision {:?}, runtime {:?}{}{}{}\n",
        plan.model,
        thousands(plan.parameters),
        plan.loss.name(),
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
        "\nmemory(B) = {} + {} x B   (peak during {})\n(gradients are made during backward, so only those alive at that moment are counted; at\n small batches another moment can peak higher, which max batch and planned peak use)\n{}\ncompute: {} forward, {} per training sample\n",
        plan.memory.fixed_bytes,
        plan.memory.per_sample_bytes,
        plan.peak_at,
        batchfit_plan::accuracy::describe(plan.options.runtime, plan.options.gpu),
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

#[cfg(test)]
mod tests {
    use super::*;
    use batchfit_graph::zoo;
    use batchfit_plan::plan::{CpuHost, GemmKernel, plan_on};
    use batchfit_plan::{Optimizer, Runtime, TrainOptions};
    use serde_json::Value;

    /// `bytes_at` with `b` samples per pass, as docs/json.md says to compute it from `memory`
    /// (in u128: the search below tries batches whose bytes overflow u64).
    fn at_samples(memory: &Value, b: u64) -> u128 {
        let field = |v: &Value, k: &str| u128::from(v[k].as_u64().expect(k));
        let b = u128::from(b);
        memory["moments"]
            .as_array()
            .expect("moments")
            .iter()
            .map(|m| {
                field(m, "fixed_bytes")
                    + field(m, "per_sample_bytes") * b
                    + packing(&m["gemm_call"], b as u64)
            })
            .max()
            .expect("one moment at least")
            + field(memory, "rounding_bytes")
    }

    /// A moment's `gemm_call` packing bytes at `b` samples, as docs/json.md gives them.
    fn packing(call: &Value, b: u64) -> u128 {
        if call.is_null() {
            return 0;
        }
        let num = |v: &Value| v.as_u64().expect("a count");
        let [lanes, mr, nr] = ["lanes", "rows", "cols"].map(|k| num(&call["kernel"][k]));
        let [l2, ways] = [0, 1].map(|i| num(&call["l2"][i]));
        let mut mnk = [0, 1, 2].map(|i| num(&call["mnk"][i]));
        mnk[num(&call["batch_axis"]) as usize] *= b.max(1);
        let [m, n, k] = mnk;
        let unit = |i: usize| call["unit_rows"][i].as_bool().expect("a flag");
        if m <= 1 || n <= 1 || k <= 2 {
            return 0;
        }
        let (kc, mc) = if m <= 64 && n <= 64 {
            let kc = k.min(512);
            (kc, l2 / 4 / kc / mr * mr)
        } else {
            let kc = k.div_ceil(k.div_ceil(512));
            let ways = ways.max(2);
            let rhs_ways = (nr * kc * 4).div_ceil(l2 / ways);
            let lhs_ways = ways.saturating_sub(1 + rhs_ways).max(1);
            let fit = lhs_ways * l2 / (ways * 4 * kc) / mr * mr;
            let mc = if fit == 0 {
                mr
            } else {
                m.div_ceil(m.div_ceil(fit) * mr) * mr
            };
            (kc, mc.min(8 * mr))
        };
        let lhs = if m <= 2 * mc && (m % lanes != 0 || !unit(0)) {
            m.div_ceil(mr) * mr
        } else {
            0
        };
        let rhs = if !unit(1) && m > 2 * mr {
            n.div_ceil(nr) * nr
        } else {
            0
        };
        u128::from(kc * (lhs + rhs) * 4)
    }

    /// `bytes_at(B)` from the document alone.
    fn bytes_at(doc: &Value, batch: u64) -> u128 {
        let b = doc["options"]["micro_batch"]
            .as_u64()
            .map_or(batch, |m| m.min(batch));
        at_samples(&doc["memory"], b)
    }

    /// `max_batch(budget)` from the document alone: the largest B whose planned bytes
    /// without micro-batching fit (they grow with B), searched up to 2^47.
    fn max_batch(doc: &Value, budget: u64) -> Option<u64> {
        let fits = |b: u64| at_samples(&doc["memory"], b) <= u128::from(budget);
        if !fits(1) {
            return None;
        }
        let (mut lo, mut hi) = (1u64, 1u64 << 47);
        if fits(hi) {
            return Some(hi);
        }
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        Some(lo)
    }

    /// Every zoo model, both runtimes, CPU and GPU, with and without a micro-batch: the
    /// JSON document alone gives the library's `bytes_at` and `max_batch`. Burn on a
    /// GPU is left out: its planned bytes are CubeCL's pages (`batchfit_plan::pages`),
    /// which the `plan` document (the CPU plan) does not carry.
    #[test]
    fn json_reproduces_bytes_at_and_max_batch() {
        let host = CpuHost {
            threads: 4,
            l2_bytes: 1 << 20,
            l2_ways: 8,
            gemm_kernel: GemmKernel::AVX2,
        };
        let budgets = [1000u64, 3 << 20, 64 << 20, 1 << 30, 6 << 30, 80 << 30];
        for name in zoo::NAMES {
            let graph = zoo::build(name).unwrap();
            for runtime in [Runtime::Burn, Runtime::Pytorch] {
                for (gpu, micro_batch) in [(false, None), (true, None), (false, Some(3))] {
                    if gpu && runtime == Runtime::Burn {
                        continue;
                    }
                    let opts = TrainOptions {
                        runtime,
                        gpu,
                        micro_batch,
                        optimizer: Optimizer::Momentum,
                        ..TrainOptions::default()
                    };
                    let plan = plan_on(&graph, &opts, host);
                    let fits: Vec<BudgetFit> = budgets
                        .iter()
                        .map(|&b| BudgetFit::new(&plan, "memory", Bytes(b)))
                        .collect();
                    let doc = serde_json::to_value(PlanDocument::new(&plan, &fits)).unwrap();
                    let case = format!("{name} {opts:?}");
                    for b in [1u64, 2, 3, 5, 8, 17, 64, 100, 1000, 12_345, 1 << 20] {
                        assert_eq!(
                            bytes_at(&doc, b),
                            u128::from(plan.bytes_at(b).0),
                            "{case} at {b}"
                        );
                    }
                    for (fit, &budget) in doc["budgets"].as_array().unwrap().iter().zip(&budgets) {
                        let mb = max_batch(&doc, budget);
                        assert_eq!(mb, plan.max_batch(Bytes(budget)), "{case} in {budget}");
                        assert_eq!(fit["max_batch"].as_u64(), mb, "{case} in {budget}");
                    }
                }
            }
        }
    }
}
