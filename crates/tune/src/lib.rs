//! batchfit's evidence and every decision made from it, free of any framework
//! so it compiles and tests in seconds. The pipelines fill in the evidence;
//! the reports render it and the decisions.
//!
//! The evidence:
//! - [`device`]: the device a measurement was made on;
//! - [`trial`]: how one trial (a fresh process) ended and what it measured;
//! - [`probe`]: one device's measured curve, max-batch search and knee;
//! - [`noise`]: a noise run on the user's data (McCandlish et al. 2018);
//! - [`sweep`]: real training runs and their summary;
//! - [`dataset`]: what the training data looks like, and what to fix in it.
//!
//! The decisions:
//! - [`decide`]: **where `advise`'s recommendation is decided**, from all of it;
//! - [`advice`]: the recommendation for one device (also `run`'s, through [`run`]);
//! - [`basis`]: what a time-to-target prediction rests on;
//! - [`target`]: S(B) = S_min (1 + B_noise/B) and time to target per option;
//! - [`trajectory`]: updates to a target summed over a run's stretches;
//! - [`diagnose`]: findings from the measured curves;
//! - [`schedule`]: a batch-size ramp; [`world`]: data-parallel world sizes;
//! - [`stability`]: a short run at an advised rate, and the cap where it fails;
//! - [`verify`]: predicted beside measured, and whether the advice held;
//! - [`buckets`] and [`lengths`]: batches for variable-length sequences.
//!
//! How to measure:
//! - [`measure`]: the one measuring loop of `probe` and `run` over a [`measure::Trials`] runner;
//! - [`search`]: the largest batch that fits, one strategy per file;
//! - [`knee`], [`stats`], [`lr`]: the knee, timing statistics, learning-rate rules.

pub mod advice;
pub mod basis;
pub mod buckets;
pub mod dataset;
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
pub mod stability;
pub mod stats;
pub mod step_times;
pub mod sweep;
pub mod target;
pub mod trajectory;
pub mod trial;
pub mod verify;
pub mod world;
