//! `batchfit probe`: real timed training steps across batch sizes on each device.

use crate::error::CliResult;
use crate::options::{
    DEFAULT_MODEL, JsonFlag, LengthFlags, LossFlags, MeasureFlags, emit, emit_json, print, progress,
};
use batchfit_pipeline::lengths::probe_lengths;
use batchfit_pipeline::probe::{parse_devices, probe};
use batchfit_report::lengths::{self, LengthProbeDocument};
use batchfit_report::probe::{ProbeDocument, render};
use clap::Args;

#[derive(Args, Clone)]
pub struct ProbeArgs {
    /// zoo:NAME, a .toml layer spec or an .onnx file [default: zoo:digits-mlp].
    pub model: Option<String>,
    #[command(flatten)]
    pub loss: LossFlags,
    #[command(flatten)]
    pub measure: MeasureFlags,
    #[command(flatten)]
    pub lengths: LengthFlags,
    /// With --lengths: time up to N batches of each scheme's epoch (every k-th by shape;
    /// all when the epoch has at most N) beside the predicted epoch.
    #[arg(long, value_name = "N", default_value_t = 0, requires = "lengths")]
    pub measure_epochs: usize,
    #[command(flatten)]
    pub json: JsonFlag,
}

pub fn run(args: ProbeArgs) -> CliResult {
    let source = args.model.as_deref().unwrap_or(DEFAULT_MODEL);
    let devices = parse_devices(&args.measure.device.device)?;
    let loss = args.loss.request()?;
    let bar = progress(args.json.json);
    if let Some(mut req) = args.lengths.request() {
        req.measure_epochs = args.measure_epochs;
        let cfg = args.measure.config()?;
        let units = args.lengths.units();
        let mut text = String::new();
        let mut docs = Vec::new();
        for &d in &devices {
            let (graph, p) = probe_lengths(&cfg, source, loss.as_ref(), &req, d, &bar)?;
            if args.json.json {
                docs.push(
                    serde_json::to_value(LengthProbeDocument {
                        schema_version: batchfit_report::SCHEMA_VERSION,
                        kind: "probe_lengths",
                        model: &graph.name,
                        device: d.to_string(),
                        plan: &p.plan,
                        buckets: &p.buckets,
                        timed_steps: &p.timed_steps,
                        step_model: p.step_model,
                        epochs: &p.epochs,
                        seconds: p.seconds,
                    })
                    .expect("a document serialises"),
                );
            } else {
                text.push_str(&lengths::render(std::slice::from_ref(&p.plan), units));
                text.push_str(&lengths::render_measured(
                    &d.to_string(),
                    &p.buckets,
                    p.step_model.as_ref(),
                    units,
                ));
                text.push_str(&lengths::render_epochs(&p.epochs));
            }
        }
        drop(bar);
        return match docs.len() {
            0 => print(&text),
            1 => emit_json(&docs[0]),
            _ => emit_json(&docs),
        };
    }
    let out = probe(
        &args.measure.config()?,
        source,
        loss.as_ref(),
        &devices,
        &bar,
    )?;
    drop(bar);
    let doc = ProbeDocument {
        schema_version: batchfit_report::SCHEMA_VERSION,
        kind: "probe",
        model: &out.graph.name,
        parameters: out.graph.param_count(),
        optimizer: args.measure.optimizer.optimizer.name(),
        devices: &out.devices,
        notes: out
            .graph
            .export_note(source)
            .map(String::from)
            .into_iter()
            .collect(),
    };
    emit(&doc, &doc, args.json.json, |d| {
        let mut text = render(d.model, d.devices);
        for n in &d.notes {
            text.push_str(&format!("\nnote: {n}\n"));
        }
        text
    })
}
