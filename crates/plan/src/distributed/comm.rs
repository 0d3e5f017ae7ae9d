//! Communication of one step: links, ring collectives (the alpha-beta model) and what the compute hides.

use super::*;
use serde::Serialize;

/// A link between devices: bandwidth per direction and the fixed cost of one ring step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Link {
    /// Preset name, or `custom`.
    pub name: String,
    /// Bytes per second one device sends (and receives) at once.
    pub bytes_per_s: f64,
    /// Seconds of one ring step's fixed cost (alpha).
    pub latency_s: f64,
}

/// Named links (`--link`). Bandwidths are nominal per direction, no efficiency factor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum LinkPreset {
    /// NVLink 3 on an A100 SXM: 12 links x 25 GB/s = 300 GB/s per direction per GPU.
    #[cfg_attr(feature = "clap", value(name = "nvlink"))]
    Nvlink,
    /// PCIe 4.0 x16: 16 GT/s x 16 lanes x 128/130 / 8 = 31.5 GB/s per direction.
    #[cfg_attr(feature = "clap", value(name = "pcie4"))]
    Pcie4,
    /// InfiniBand EDR, 100 Gb/s data rate: 12.5 GB/s.
    #[cfg_attr(feature = "clap", value(name = "ib100"))]
    Ib100,
    /// InfiniBand HDR, 200 Gb/s: 25 GB/s.
    #[cfg_attr(feature = "clap", value(name = "ib200"))]
    Ib200,
    /// InfiniBand NDR, 400 Gb/s: 50 GB/s.
    #[cfg_attr(feature = "clap", value(name = "ib400"))]
    Ib400,
    /// 25 Gigabit Ethernet: 3.125 GB/s.
    #[cfg_attr(feature = "clap", value(name = "eth25"))]
    Eth25,
}

/// Latency of one ring step inside a node and over RDMA (order of magnitude of a
/// small-message NCCL step; see `docs/scale.md`).
pub(super) const LOCAL_LATENCY_S: f64 = 5e-6;
/// Latency of one ring step over TCP sockets (NCCL's socket transport).
pub(super) const SOCKET_LATENCY_S: f64 = 25e-6;

impl LinkPreset {
    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            LinkPreset::Nvlink => "nvlink",
            LinkPreset::Pcie4 => "pcie4",
            LinkPreset::Ib100 => "ib100",
            LinkPreset::Ib200 => "ib200",
            LinkPreset::Ib400 => "ib400",
            LinkPreset::Eth25 => "eth25",
        }
    }

    /// The link's figures.
    pub fn link(self) -> Link {
        let gbit = |g: f64| g * 1e9 / 8.0;
        let (bytes_per_s, latency_s) = match self {
            LinkPreset::Nvlink => (12.0 * 25e9, LOCAL_LATENCY_S),
            LinkPreset::Pcie4 => (16e9 * 16.0 * 128.0 / 130.0 / 8.0, LOCAL_LATENCY_S),
            LinkPreset::Ib100 => (gbit(100.0), LOCAL_LATENCY_S),
            LinkPreset::Ib200 => (gbit(200.0), LOCAL_LATENCY_S),
            LinkPreset::Ib400 => (gbit(400.0), LOCAL_LATENCY_S),
            LinkPreset::Eth25 => (gbit(25.0), SOCKET_LATENCY_S),
        };
        Link {
            name: self.name().to_string(),
            bytes_per_s,
            latency_s,
        }
    }
}

impl Link {
    /// A link of `gbps` gigabits per second with the latency of RDMA or a local link.
    pub fn gbps(gbps: f64) -> Link {
        Link {
            name: "custom".to_string(),
            bytes_per_s: gbps * 1e9 / 8.0,
            latency_s: LOCAL_LATENCY_S,
        }
    }

    /// The ring's link over `nodes` nodes: one flat ring through every device crosses each
    /// node boundary, and every hop carries the same bytes, so the slowest hop sets the
    /// bandwidth and the largest latency the step cost.
    pub fn ring(intra: &Link, inter: Option<&Link>) -> Link {
        match inter {
            None => intra.clone(),
            Some(x) => Link {
                name: format!("{} between nodes, {} within", x.name, intra.name),
                bytes_per_s: x.bytes_per_s.min(intra.bytes_per_s),
                latency_s: x.latency_s.max(intra.latency_s),
            },
        }
    }
}

/// A collective operation of the ring algorithms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Collective {
    /// Every device ends with the sum: a reduce-scatter then an all-gather.
    AllReduce,
    /// Every device ends with the sum of its shard.
    ReduceScatter,
    /// Every device ends with every shard.
    AllGather,
}

impl Collective {
    /// (bytes moved per device, ring steps) for a message of `bytes` over `world` devices.
    pub fn volume(self, bytes: u64, world: u64) -> (f64, u64) {
        if world <= 1 {
            return (0.0, 0);
        }
        let share = (world - 1) as f64 / world as f64 * bytes as f64;
        match self {
            Collective::AllReduce => (2.0 * share, 2 * (world - 1)),
            Collective::ReduceScatter | Collective::AllGather => (share, world - 1),
        }
    }

    /// Seconds for a message of `bytes` on `link` (alpha-beta: steps x alpha + volume / beta).
    pub fn seconds(self, bytes: u64, world: u64, link: &Link) -> f64 {
        let (moved, steps) = self.volume(bytes, world);
        moved / link.bytes_per_s + steps as f64 * link.latency_s
    }
}

/// Communication of one update (all its micro-steps) and what of it the compute does not hide.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CommTime {
    /// Bytes one device sends per update.
    pub bytes_per_device: f64,
    /// Collectives per update.
    pub collectives: u64,
    /// Seconds of all collectives per update, if none overlapped.
    pub seconds: f64,
    /// Seconds per update not hidden behind compute (`None` without a compute time).
    pub exposed_s: Option<f64>,
}

/// The collectives of one phase, in issue order, each as (kind, message bytes).
pub(super) type Phase = Vec<(Collective, u64)>;

/// Exposed seconds of a phase overlapped with `compute_s`: the last collective cannot
/// start before the compute that produces its data ends (`first_exposed`: the first one
/// cannot start before it is needed), the rest hide behind the compute up to its length.
pub(super) fn exposed(times: &[f64], compute_s: f64, tail_exposed: bool) -> f64 {
    let Some(edge) = (if tail_exposed {
        times.last()
    } else {
        times.first()
    }) else {
        return 0.0;
    };
    let rest: f64 = times.iter().sum::<f64>() - edge;
    edge + (rest - compute_s).max(0.0)
}

/// What the communication of a step depends on besides the strategy and the world.
#[derive(Clone, Copy, Debug)]
pub struct CommModel<'a> {
    /// Parameters of each layer, in forward order.
    pub layer_params: &'a [u64],
    /// Bytes per parameter of the states.
    pub per: StateBytes,
    /// The forward's share of a micro-step's compute (the plan's forward / training FLOPs).
    pub forward_share: f64,
}

impl<'a> CommModel<'a> {
    /// The model of `plan`'s layers and options.
    pub fn of(plan: &Plan, layer_params: &'a [u64]) -> CommModel<'a> {
        CommModel {
            layer_params,
            per: StateBytes::of(&plan.options),
            forward_share: plan.forward_flops_per_sample.0
                / plan.train_flops_per_sample.0.max(f64::MIN_POSITIVE),
        }
    }
}

/// The step's communication under `strategy`; `micro_step_s`: one device's forward +
/// backward of one micro-batch.
///
/// Overlap rules: DDP all-reduces its buckets once per update (`no_sync` on the other
/// micro-steps) while the last micro-step's backward runs, all but the last bucket hidden.
/// ZeRO-1 reduce-scatters the gradients once per update, ZeRO-2 at every micro-step (its
/// gradient shard cannot hold an unreduced full gradient), both in DeepSpeed's buckets and
/// without overlap (`overlap_comm` defaults to false for stages 1 and 2); both all-gather
/// the updated parameters after the optimizer step. ZeRO-3 and FSDP all-gather each
/// layer's parameters in the forward (hidden behind the forward but the first layer's) and
/// again in the backward with its gradient's reduce-scatter (hidden behind the backward
/// but the first layer's reduce-scatter, which comes last), at every micro-step.
pub fn comm_time(
    model: &CommModel,
    strategy: Strategy,
    world: u64,
    accumulation: u64,
    micro_step_s: Option<f64>,
    link: &Link,
) -> CommTime {
    let CommModel {
        layer_params,
        per,
        forward_share,
    } = *model;
    let a = accumulation.max(1);
    let parameters: u64 = layer_params.iter().sum();
    let grads: Vec<u64> = layer_params.iter().map(|p| p * per.gradients).collect();
    let fwd_s = micro_step_s.map(|s| s * forward_share);
    let bwd_s = micro_step_s.map(|s| s * (1.0 - forward_share));
    let time = |phase: &Phase| -> Vec<f64> {
        phase
            .iter()
            .map(|&(c, b)| c.seconds(b, world, link))
            .collect()
    };
    let deepspeed = |total: u64, dtype: u64| chunks(total, DEEPSPEED_BUCKET_ELEMENTS * dtype);
    // (phase, times it runs per update, compute it overlaps with, whether its last
    // (else first) collective is exposed).
    let mut phases: Vec<(Phase, u64, Option<f64>, bool)> = Vec::new();
    match strategy {
        Strategy::Ddp => {
            let buckets = ddp_buckets(&grads);
            let phase = buckets
                .iter()
                .map(|&b| (Collective::AllReduce, b))
                .collect();
            phases.push((phase, 1, bwd_s, true));
        }
        Strategy::Zero1 | Strategy::Zero2 => {
            let reduce: Phase = deepspeed(parameters * per.gradients, per.gradients)
                .into_iter()
                .map(|b| (Collective::ReduceScatter, b))
                .collect();
            let gather: Phase = deepspeed(parameters * per.params, per.params)
                .into_iter()
                .map(|b| (Collective::AllGather, b))
                .collect();
            let reduces = if strategy == Strategy::Zero2 { a } else { 1 };
            phases.push((reduce, reduces, Some(0.0), true));
            phases.push((gather, 1, Some(0.0), true));
        }
        Strategy::Zero3 | Strategy::Fsdp => {
            let with: Vec<u64> = layer_params.iter().copied().filter(|&p| p > 0).collect();
            let forward: Phase = with
                .iter()
                .map(|&p| (Collective::AllGather, p * per.params))
                .collect();
            let backward: Phase = with
                .iter()
                .rev()
                .flat_map(|&p| {
                    [
                        (Collective::AllGather, p * per.params),
                        (Collective::ReduceScatter, p * per.gradients),
                    ]
                })
                .collect();
            phases.push((forward, a, fwd_s, false));
            phases.push((backward, a, bwd_s, true));
        }
    }
    let mut out = CommTime {
        bytes_per_device: 0.0,
        collectives: 0,
        seconds: 0.0,
        exposed_s: micro_step_s.map(|_| 0.0),
    };
    for (phase, times, compute, tail) in &phases {
        let t = time(phase);
        let k = *times as f64;
        out.bytes_per_device += k * phase
            .iter()
            .map(|&(c, b)| c.volume(b, world).0)
            .sum::<f64>();
        out.collectives += times * phase.len() as u64;
        out.seconds += k * t.iter().sum::<f64>();
        if let (Some(e), Some(c)) = (out.exposed_s.as_mut(), compute) {
            *e += k * exposed(&t, *c, *tail);
        }
    }
    if world <= 1 {
        out.collectives = 0;
    }
    out
}
