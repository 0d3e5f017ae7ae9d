//! `batchfit probe`: real timed training steps across batch sizes on each device.

use crate::error::CliResult;
use crate::options::{DEFAULT_MODEL, MeasureFlags, emit, progress};
use batchfit_pipeline::probe::{parse_devices, probe};
use batchfit_report::probe::{ProbeDocument, render};
use clap::Args;

#[derive(Args, Clone)]
pub struct ProbeArgs {
    /// zoo:NAME, a .toml layer spec or an .onnx file [default: zoo:digits-mlp].
    pub model: Option<String>,
    #[command(flatten)]
    pub measure: MeasureFlags,
    /// Print the measurements as JSON (schema: docs/json.md).
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: ProbeArgs) -> CliResult {
    let source = args.model.as_deref().unwrap_or(DEFAULT_MODEL);
    let devices = parse_devices(&args.measure.device)?;
    let bar = progress(args.json);
    let out = probe(&args.measure.config()?, source, &devices, &bar)?;
    drop(bar);
    let doc = ProbeDocument {
        schema_version: batchfit_report::SCHEMA_VERSION,
        kind: "probe",
        model: &out.graph.name,
        parameters: out.graph.param_count(),
        optimizer: args.measure.optimizer.name(),
        devices: &out.devices,
        notes: out
            .graph
            .export_note(source)
            .map(String::from)
            .into_iter()
            .collect(),
    };
    emit(&doc, args.json, |d| {
        let mut text = render(d.model, d.devices);
        for n in &d.notes {
            text.push_str(&format!("\nnote: {n}\n"));
        }
        text
    })
}
