//! `batchfit plan`: the static plan.

use crate::error::CliResult;
use crate::options::{DEFAULT_MODEL, TrainFlags, emit_json, parse_bytes, print};
use batchfit_plan::{Bytes, PRESETS, plan, preset};
use batchfit_report::plan::{BudgetFit, PlanDocument, render};
use clap::Args;

#[derive(Args)]
pub struct PlanArgs {
    /// zoo:NAME, a .toml layer spec or an .onnx file [default: zoo:digits-mlp].
    pub model: Option<String>,
    #[command(flatten)]
    pub train: TrainFlags,
    /// Memory budget, e.g. 6GiB, 512MiB, 4GB.
    #[arg(long, value_parser = parse_bytes)]
    pub memory: Option<Bytes>,
    /// Device presets whose memory is the budget (comma-separated; `host` = this machine).
    /// Without --memory or --device-preset, every preset is listed.
    #[arg(long = "device-preset", value_name = "NAME", value_delimiter = ',')]
    pub device_presets: Vec<String>,
    /// Print the plan as JSON (schema: docs/json.md).
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: PlanArgs) -> CliResult {
    let graph = batchfit_graph::load(args.model.as_deref().unwrap_or(DEFAULT_MODEL))?;
    let mut devices = Vec::new();
    for name in &args.device_presets {
        devices.push(preset(name).map_err(batchfit_pipeline::Error::from)?);
    }
    if args.memory.is_none() && devices.is_empty() {
        devices.extend(PRESETS.iter().cloned());
        devices.extend(preset("host").ok());
    }
    let base = plan(&graph, &args.train.options(false));
    let mut budgets = Vec::new();
    if let Some(m) = args.memory {
        budgets.push(BudgetFit::new(&base, "memory", m));
    }
    for d in &devices {
        let p = plan(&graph, &args.train.options(d.gpu));
        budgets.push(BudgetFit::new(&p, d.name, d.memory));
    }
    if args.json {
        emit_json(&PlanDocument::new(&base, &budgets))
    } else {
        print(&render(&base, &budgets))
    }
}
