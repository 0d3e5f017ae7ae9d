//! `batchfit plan`: the static plan; with `--gpus`, per device under data parallelism.

use crate::error::{CliError, CliResult};
use crate::options::{
    DEFAULT_MODEL, JsonFlag, LengthFlags, LossFlags, ParallelFlags, TrainFlags, emit_json,
    parse_bytes, parse_seconds, positive_f64, positive_u64, print,
};
use batchfit_pipeline::Error;
use batchfit_pipeline::lengths::NamedBudget;
use batchfit_plan::distributed::{
    self, Compute, Link, LinkPreset, ScaleRequest, StateBytes, Strategy,
};
use batchfit_plan::{Bytes, PRESETS, plan, preset};
use batchfit_report::lengths::BucketsDocument;
use batchfit_report::plan::{BudgetFit, PlanDocument, render};
use batchfit_report::scale::{self, Distributed};
use clap::{Args, ValueEnum};

#[derive(Args)]
pub struct PlanArgs {
    /// zoo:NAME, a .toml layer spec or an .onnx file [default: zoo:digits-mlp].
    pub model: Option<String>,
    #[command(flatten)]
    pub loss: LossFlags,
    #[command(flatten)]
    pub train: TrainFlags,
    /// Memory budget, e.g. 6GiB, 512MiB, 4GB.
    #[arg(long, value_parser = parse_bytes)]
    pub memory: Option<Bytes>,
    /// Device presets whose memory is the budget (comma-separated; `host` = this machine).
    /// Without --memory or --device-preset, every preset is listed.
    #[arg(long = "device-preset", value_name = "NAME", value_delimiter = ',')]
    pub device_presets: Vec<String>,
    #[command(flatten)]
    pub json: JsonFlag,
    #[command(flatten)]
    pub lengths: LengthFlags,
    #[command(flatten)]
    pub scale: ScaleFlags,
}

/// Data parallelism over several GPUs (docs/scale.md).
#[derive(Args)]
pub struct ScaleFlags {
    #[command(flatten)]
    pub parallel: ParallelFlags,
    /// Nodes, each with --gpus GPUs.
    #[arg(long, value_name = "M", default_value_t = 1, value_parser = crate::options::parse_device_count)]
    pub nodes: u64,
    /// Global batch to reach per update (micro-batch x accumulation x world size).
    #[arg(long, value_name = "G", value_parser = positive_u64)]
    pub global_batch: Option<u64>,
    /// The ring's link as a bandwidth in Gb/s instead of a preset.
    #[arg(long, value_name = "GBPS", value_parser = positive_f64, conflicts_with = "link")]
    pub link_gbps: Option<f64>,
    /// The link between GPUs within a node when --nodes > 1 [default: pcie4].
    #[arg(long, value_enum)]
    pub intra_link: Option<LinkPreset>,
    /// Seconds of one device's forward and backward at --micro-batch (measured, e.g. by probe).
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds, conflicts_with = "device_tflops")]
    pub step_time: Option<f64>,
    /// Sustained TFLOP/s of one device: compute predicted as training FLOPs / this.
    #[arg(long, value_name = "TFLOPS", value_parser = positive_f64)]
    pub device_tflops: Option<f64>,
    /// Write a launch configuration for the one --gpus and --strategy asked, instead of the plan.
    #[arg(long, value_enum)]
    pub emit: Option<Emit>,
}

/// Launch configurations `--emit` writes.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Emit {
    /// A DeepSpeed config (ds_config.json) on stdout.
    Deepspeed,
    /// The torchrun command line.
    Torchrun,
    /// With --lengths: the bucket table as JSON, for a sampler to read (docs/lengths.md).
    Buckets,
}

fn bad(message: impl Into<String>) -> CliError {
    CliError::Pipeline(Error::input(message))
}

pub fn run(args: PlanArgs) -> CliResult {
    let source = args.model.as_deref().unwrap_or(DEFAULT_MODEL);
    let graph = batchfit_graph::load_with_loss(source, args.loss.request()?.as_ref())?;
    let notes: Vec<String> = graph
        .export_note(source)
        .map(String::from)
        .into_iter()
        .collect();
    let mut devices = Vec::new();
    for name in &args.device_presets {
        devices.push(preset(name).map_err(batchfit_pipeline::Error::from)?);
    }
    let emit_buckets = matches!(args.scale.emit, Some(Emit::Buckets));
    let distributed = if args.scale.parallel.gpus.is_empty() {
        args.scale.check_unused()?;
        None
    } else {
        let opts = distributed::plan_options(&args.train.options(true));
        let budget = args.memory.or(devices.first().map(|d| d.memory));
        let request = args.scale.request(budget, args.train.micro_batch)?;
        let p = plan(&graph, &opts);
        Some((
            Distributed {
                state_bytes_per_param: StateBytes::of(&opts),
                rows: distributed::scale_table(&p, &request),
                request,
            },
            opts.precision,
        ))
    };
    let lengths = match args.lengths.request() {
        Some(req) => {
            let mut named = Vec::new();
            if let Some(m) = args.memory {
                named.push(NamedBudget {
                    name: "memory".into(),
                    bytes: m,
                    gpu: false,
                });
            }
            named.extend(devices.iter().map(|d| NamedBudget {
                name: d.name.to_string(),
                bytes: d.memory,
                gpu: d.gpu,
            }));
            let (_, plans) = batchfit_pipeline::lengths::plan_over(
                &graph,
                &args.train.options(false),
                &req,
                &named,
            )?;
            Some(plans)
        }
        None if emit_buckets => return Err(bad("--emit buckets needs --lengths FILE")),
        None => None,
    };
    if emit_buckets {
        let plans = lengths.as_deref().unwrap_or_default();
        let [first, ..] = plans else {
            return Err(bad(
                "--emit buckets needs a budget: --memory or --device-preset",
            ));
        };
        return emit_json(&BucketsDocument::new(
            &graph.name,
            first,
            args.lengths.units(),
        ));
    }
    if let Some(emit) = args.scale.emit {
        let Some((d, precision)) = &distributed else {
            return Err(bad("--emit needs --gpus N and --strategy S"));
        };
        let [row] = d.rows.as_slice() else {
            return Err(bad(
                "--emit writes one launch: give one --gpus value and one --strategy",
            ));
        };
        return match emit {
            Emit::Deepspeed => emit_json(
                &scale::deepspeed_config(row, *precision).map_err(|e| bad(e.to_string()))?,
            ),
            Emit::Torchrun => print(&format!(
                "{}\n",
                scale::torchrun_line(row).map_err(|e| bad(e.to_string()))?
            )),
            Emit::Buckets => unreachable!("answered above"),
        };
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
    let distributed = distributed.map(|(d, _)| d);
    if args.json.json {
        let mut doc = PlanDocument::new(&base, &budgets);
        doc.distributed = distributed.as_ref();
        doc.notes = notes;
        doc.lengths = lengths.as_deref();
        emit_json(&doc)
    } else {
        let mut text = render(&base, &budgets);
        if devices.iter().any(|d| d.gpu) {
            text.push_str(&format!(
                "GPU presets' rows: {}\n",
                batchfit_plan::accuracy::describe(base.options.runtime, true)
            ));
        }
        if let Some(plans) = &lengths {
            text.push_str(&batchfit_report::lengths::render(
                plans,
                args.lengths.units(),
            ));
        }
        if let Some(d) = &distributed {
            text.push_str(&scale::render(d));
        }
        for n in &notes {
            text.push_str(&format!("\nnote: {n}\n"));
        }
        print(&text)
    }
}

impl ScaleFlags {
    /// Without --gpus, no distributed flag may be given.
    fn check_unused(&self) -> CliResult {
        self.parallel.check()?;
        let given = [
            (self.nodes != 1, "--nodes"),
            (self.global_batch.is_some(), "--global-batch"),
            (self.link_gbps.is_some(), "--link-gbps"),
            (self.intra_link.is_some(), "--intra-link"),
            (self.step_time.is_some(), "--step-time"),
            (self.device_tflops.is_some(), "--device-tflops"),
            (
                self.emit.is_some_and(|e| !matches!(e, Emit::Buckets)),
                "--emit",
            ),
        ];
        match given.iter().find(|(g, _)| *g) {
            Some((_, flag)) => Err(bad(format!("{flag} needs --gpus N"))),
            None => Ok(()),
        }
    }

    /// The library's request, with the budget of one device and the fixed micro-batch.
    fn request(&self, budget: Option<Bytes>, micro_batch: Option<u64>) -> CliResult<ScaleRequest> {
        let multi = self.nodes > 1;
        if self.intra_link.is_some() && !multi {
            return Err(bad(
                "--intra-link is the link within a node when --nodes > 1; on one node use --link",
            ));
        }
        let named = self.parallel.link.unwrap_or(if multi {
            LinkPreset::Ib100
        } else {
            LinkPreset::Pcie4
        });
        let outer = match self.link_gbps {
            Some(g) => Link::gbps(g),
            None => named.link(),
        };
        let link = if multi {
            Link::ring(
                &self.intra_link.unwrap_or(LinkPreset::Pcie4).link(),
                Some(&outer),
            )
        } else {
            outer
        };
        let compute = match (self.step_time, self.device_tflops, micro_batch) {
            (Some(seconds), _, Some(m)) => Compute::StepTime {
                seconds,
                micro_batch: m,
            },
            (Some(_), _, None) => {
                return Err(bad(
                    "--step-time is the time of one micro-batch: give the micro-batch it was measured at with --micro-batch",
                ));
            }
            (None, Some(tflops), _) => Compute::Flops { tflops },
            (None, None, _) => Compute::Unknown,
        };
        Ok(ScaleRequest {
            gpus_per_node: self.parallel.gpus.clone(),
            nodes: self.nodes,
            strategies: if self.parallel.strategy.is_empty() {
                Strategy::ALL.to_vec()
            } else {
                self.parallel.strategy.clone()
            },
            budget_bytes: budget,
            micro_batch,
            global_batch: self.global_batch,
            link,
            compute,
        })
    }
}
