//! Time to target across data-parallel world sizes of one measured device:
//! for each world size the measured micro-batch per device with the lowest
//! predicted time, S(N x micro) x (measured step + exposed communication of
//! the ring); where extra devices stop paying; and the largest world size
//! whose global batch stays within the critical batch.

use crate::device::DeviceSpec;
use crate::probe::DeviceProbe;
use crate::target::{
    Rows, ScaleOption, ScaleTime, ScalingLimit, critical_batch_on, scaling_limit,
    time_across_world_sizes,
};
use batchfit_plan::Plan;
use batchfit_plan::distributed::{CommModel, Link, Strategy, comm_time};
use serde::Serialize;

/// Time to target across data-parallel world sizes of one measured device.
#[derive(Clone, Debug, Serialize)]
pub struct WorldSizes {
    /// The measured device the world is made of.
    pub device: DeviceSpec,
    /// How the model states are sharded.
    pub strategy: Strategy,
    /// The ring's bandwidth, Gb/s.
    pub link_gbps: f64,
    pub b_noise: f64,
    /// One row per world size: the micro-batch per device with the lowest predicted time.
    pub table: Vec<ScaleTime>,
    /// Where extra devices stop paying.
    pub limit: Option<ScalingLimit>,
    /// The batch where S(B) = 2 S_min on the rows drawn from: B_noise N / (N +
    /// B_noise) on N rows (B_noise on unlimited data).
    pub critical_batch: f64,
    /// The largest world size whose global batch stays within the critical batch.
    pub within_critical_batch: Option<u64>,
}

/// The world sizes `gpus` of devices like `device`, whose model states are
/// planned by `gpu_plan` (the data-parallel runtime's plan) and sharded by
/// `strategy` over `link`, with S(B) = `s_min` (1 + `b_noise` (1/B - 1/N)) on
/// N = `data_rows` (relative to S_min where `s_min` is not known).
#[allow(clippy::too_many_arguments)] // the world (plan, device, sizes, strategy, link) and S(B)'s three numbers
pub fn across_world_sizes(
    gpu_plan: &Plan,
    device: &DeviceProbe,
    gpus: &[u64],
    strategy: Strategy,
    link: &Link,
    b_noise: f64,
    s_min: Option<f64>,
    data_rows: Option<Rows>,
) -> WorldSizes {
    let layer_params: Vec<u64> = gpu_plan.layers.iter().map(|l| l.parameters).collect();
    let model = CommModel::of(gpu_plan, &layer_params);
    let points = device.step_points();
    let mut rows = Vec::new();
    for &world in gpus {
        let options: Vec<ScaleOption> = points
            .iter()
            .map(|q| {
                let comm = comm_time(&model, strategy, world, 1, Some(q.step_s), link);
                ScaleOption {
                    world_size: world,
                    strategy,
                    micro_batch: q.batch,
                    accumulation: 1,
                    update_s: q.step_s + comm.exposed_s.unwrap_or(comm.seconds),
                }
            })
            .collect();
        let best = time_across_world_sizes(&options, b_noise, s_min, data_rows)
            .into_iter()
            .min_by(|a, b| a.vs_best.total_cmp(&b.vs_best));
        rows.extend(best.map(|t| t.option));
    }
    let table = time_across_world_sizes(&rows, b_noise, s_min, data_rows);
    // Past it a global batch needs more than twice the fewest updates: on N
    // rows that comes before B_noise, where a batch of every row has no noise.
    let critical_batch = critical_batch_on(b_noise, data_rows);
    WorldSizes {
        device: device.device,
        strategy,
        link_gbps: link.bytes_per_s * 8.0 / 1e9,
        limit: scaling_limit(&table),
        within_critical_batch: table
            .iter()
            .filter(|t| t.global_batch as f64 <= critical_batch)
            .map(|t| t.option.world_size)
            .max(),
        b_noise,
        critical_batch,
        table,
    }
}
