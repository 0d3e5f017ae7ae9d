//! `plan --gpus`: the distributed table, its JSON section, and launch configurations for it
//! (`--emit deepspeed`, `--emit torchrun`).

use crate::{align_numbers, duration, table, thousands};
use batchfit_plan::Precision;
use batchfit_plan::distributed::{ScaleRequest, ScaleRow, StateBytes, Strategy, half_kind};
use serde::Serialize;
use serde_json::{Value, json};

/// The `distributed` section of `plan --json` (docs/json.md).
#[derive(Clone, Debug, Serialize)]
pub struct Distributed {
    /// What was asked: world sizes, strategies, budget, batches, link, compute.
    #[serde(flatten)]
    pub request: ScaleRequest,
    /// Unsharded model-state bytes per parameter (ZeRO's 2 + 2 + K under mixed-precision Adam).
    pub state_bytes_per_param: StateBytes,
    /// One row per (GPUs per node, strategy).
    pub rows: Vec<ScaleRow>,
}

/// The distributed table for the terminal.
pub fn render(d: &Distributed) -> String {
    let r = &d.request;
    let s = &d.state_bytes_per_param;
    let mut out = format!(
        "\nDATA PARALLEL (predicted; PyTorch's rules on a GPU; model states {} + {} + {} = {} B per parameter unsharded; link {}: {:.1} GB/s, {} per ring step; {})\n",
        s.params,
        s.gradients,
        s.optimizer,
        s.total(),
        r.link.name,
        r.link.bytes_per_s / 1e9,
        duration(r.link.latency_s),
        r.budget_bytes
            .map(|b| format!("{b} per device"))
            .unwrap_or_else(|| "no budget: give --memory or --device-preset".into()),
    );
    let mut t = table(&[
        "strategy",
        if r.nodes > 1 { "nodes x GPUs" } else { "GPUs" },
        "states/device",
        "comm buffers",
        "max micro",
        "micro x accum",
        "global batch",
        "peak/device",
        "comm/update",
        "exposed",
        "update",
    ]);
    let opt = |v: Option<u64>| v.map(thousands).unwrap_or_else(|| "-".into());
    let secs = |v: Option<f64>| v.map(duration).unwrap_or_else(|| "-".into());
    for row in &d.rows {
        let m = &row.memory;
        t.add_row(vec![
            m.strategy.name().to_string(),
            if row.nodes > 1 {
                format!(
                    "{} x {} = {}",
                    row.nodes, row.gpus_per_node, row.memory.world_size
                )
            } else {
                row.gpus_per_node.to_string()
            },
            m.model_state_bytes.to_string(),
            m.comm_buffer_bytes.to_string(),
            match (row.max_micro_batch, r.budget_bytes) {
                (Some(b), _) => thousands(b),
                (None, Some(_)) => "none fits".into(),
                (None, None) => "-".into(),
            },
            match (row.micro_batch, row.accumulation) {
                (Some(mb), Some(a)) => format!("{} x {a}", thousands(mb)),
                _ => "-".into(),
            },
            opt(row.global_batch),
            row.peak_bytes
                .map(|b| b.to_string())
                .unwrap_or_else(|| "-".into()),
            duration(row.comm.seconds),
            secs(row.comm.exposed_s),
            secs(row.step_s),
        ]);
    }
    align_numbers(&mut t, 1);
    out.push_str(&t.to_string());
    out.push_str(
        "\nstates: ZeRO's counting (stage 1 shards K, 2 also gradients, 3 and fsdp (FULL_SHARD) also parameters); \
         how each figure is modelled: docs/scale.md\n",
    );
    out
}

/// Why a launch configuration cannot be written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EmitError {
    /// The row has no micro-batch (no budget, nothing fits, no `--micro-batch`).
    #[error(
        "no micro-batch to launch with: give --memory or --device-preset (and a micro-batch must fit), or --micro-batch"
    )]
    NoMicroBatch,
    /// DeepSpeed has no FSDP.
    #[error(
        "DeepSpeed has no FSDP strategy: use --emit torchrun, or --strategy zero3 (the same sharding)"
    )]
    FsdpInDeepSpeed,
}

/// A DeepSpeed config (`ds_config.json`) for `row`: batch sizes, ZeRO stage, half precision.
/// `ddp` is stage 0 (DeepSpeed's plain data parallelism).
pub fn deepspeed_config(row: &ScaleRow, precision: Precision) -> Result<Value, EmitError> {
    if row.memory.strategy == Strategy::Fsdp {
        return Err(EmitError::FsdpInDeepSpeed);
    }
    let (Some(micro), Some(acc), Some(global)) =
        (row.micro_batch, row.accumulation, row.global_batch)
    else {
        return Err(EmitError::NoMicroBatch);
    };
    let half = half_kind(precision);
    Ok(json!({
        "train_batch_size": global,
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": acc,
        "zero_optimization": { "stage": row.stage },
        "fp16": { "enabled": half == Some("fp16") },
        "bf16": { "enabled": half == Some("bf16") },
    }))
}

/// The `torchrun` line for `row`: one process per GPU; `train.py` stands for your script,
/// which reads its per-device batch from `--batch-size` (and `--grad-accum` when accumulating).
pub fn torchrun_line(row: &ScaleRow) -> Result<String, EmitError> {
    let (Some(micro), Some(acc)) = (row.micro_batch, row.accumulation) else {
        return Err(EmitError::NoMicroBatch);
    };
    let mut line = format!(
        "torchrun --nnodes {} --nproc-per-node {}",
        row.nodes, row.gpus_per_node
    );
    if row.nodes > 1 {
        // Every node runs the same line; the rendezvous names the first node.
        line.push_str(" --rdzv-backend c10d --rdzv-endpoint $MASTER_ADDR:29500");
    }
    line.push_str(&format!(" train.py --batch-size {micro}"));
    if acc > 1 {
        line.push_str(&format!(" --grad-accum {acc}"));
    }
    Ok(line)
}

#[cfg(test)]
mod tests {
    use super::*;
    use batchfit_plan::distributed::{
        Compute, LinkPreset, ScaleRequest, Strategy, plan_options, scale_table,
    };
    use batchfit_plan::{Bytes, TrainOptions, plan};

    fn row(strategy: Strategy, micro: Option<u64>) -> ScaleRow {
        let g = batchfit_graph::zoo::build("mnist-mlp").unwrap();
        let p = plan(&g, &plan_options(&TrainOptions::default()));
        let req = ScaleRequest {
            gpus_per_node: vec![4],
            nodes: 1,
            strategies: vec![strategy],
            budget_bytes: micro.map(|_| Bytes(Bytes::GIB)),
            micro_batch: micro,
            global_batch: Some(256),
            link: LinkPreset::Nvlink.link(),
            compute: Compute::Unknown,
        };
        scale_table(&p, &req).remove(0)
    }

    #[test]
    fn deepspeed_config_fields() {
        let c = deepspeed_config(&row(Strategy::Zero3, Some(16)), Precision::Fp16Mixed).unwrap();
        // 256 over 4 devices: 64 each, 4 steps of 16.
        assert_eq!(c["train_micro_batch_size_per_gpu"], 16);
        assert_eq!(c["gradient_accumulation_steps"], 4);
        assert_eq!(c["train_batch_size"], 256);
        assert_eq!(c["zero_optimization"]["stage"], 3);
        assert_eq!(c["fp16"]["enabled"], true);
        assert_eq!(c["bf16"]["enabled"], false);
        let ddp = deepspeed_config(&row(Strategy::Ddp, Some(64)), Precision::Fp32).unwrap();
        assert_eq!(ddp["zero_optimization"]["stage"], 0);
        assert_eq!(
            deepspeed_config(&row(Strategy::Fsdp, Some(16)), Precision::Fp32),
            Err(EmitError::FsdpInDeepSpeed)
        );
        assert_eq!(
            deepspeed_config(&row(Strategy::Zero1, None), Precision::Fp32),
            Err(EmitError::NoMicroBatch)
        );
    }

    #[test]
    fn torchrun_line_by_hand() {
        assert_eq!(
            torchrun_line(&row(Strategy::Fsdp, Some(16))).unwrap(),
            "torchrun --nnodes 1 --nproc-per-node 4 train.py --batch-size 16 --grad-accum 4"
        );
        assert_eq!(
            torchrun_line(&row(Strategy::Ddp, None)),
            Err(EmitError::NoMicroBatch)
        );
    }
}
