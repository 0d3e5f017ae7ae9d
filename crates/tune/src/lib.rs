//! batchfit's math, free of any framework so it compiles and tests in seconds.
//!
//! - [`stats`]: medians, spread and stopping rules for timed steps;
//! - [`search`]: the largest batch that fits, predicted from a calibrated plan
//!   and confirmed near the limit (no blind doubling);
//! - [`knee`]: the smallest batch that runs efficiently;
//! - [`noise`]: the gradient noise scale (McCandlish et al. 2018) and the
//!   steps and samples each batch size needs;
//! - [`lr`]: learning-rate scaling rules;
//! - [`target`]: S(B) = S_min (1 + B_noise/B) and predicted time to a target
//!   loss per device and batch;
//! - [`trajectory`]: updates to a target summed over the stretches of a
//!   measured run, each with its own noise scale;
//! - [`schedule`]: a batch-size ramp from the noise scale along a run;
//! - [`verify`]: predicted time to target beside real trainings, and whether
//!   the recommendation held;
//! - [`advice`]: the recommendation for one device from its measurements;
//! - [`diagnose`]: findings from the measured curves.
//! - [`buckets`] and [`lengths`]: batches for variable-length sequences (a fixed
//!   padded batch, buckets by length, a frame budget) planned over the lengths;
//! - [`sweep`]: records of real training runs, the fit of steps to target
//!   against the batch, and whether batch size changes final quality.

pub mod advice;
pub mod basis;
pub mod buckets;
pub mod decide;
pub mod device;
pub mod diagnose;
pub mod knee;
pub mod lengths;
pub mod lr;
pub mod measure;
pub mod noise;
pub mod probe;
pub mod run;
pub mod schedule;
pub mod search;
pub mod stats;
pub mod sweep;
pub mod target;
pub mod trajectory;
pub mod trial;
pub mod verify;
pub mod world;
