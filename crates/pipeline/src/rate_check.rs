//! The runs behind "a rate that trains" (`batchfit_tune::stability`): first
//! the noise run's own batch and rate (the reference), then the table's powers
//! of two from half the run's batch up (and below it those predicted to take
//! at most [`LADDER_UPDATES`] x the run's updates) and the largest batch of
//! the table, each trained to the noise run's target at the rule's rate, then
//! at its halvings where it failed; B_noise is refitted to these. Then each
//! recommended batch and its neighbours, the decision made again until the
//! batches it names have trained.

use crate::Result;
use batchfit_data::Dataset;
use batchfit_engine::TrainConfig;
use batchfit_engine::sweep::run_to_target;
use batchfit_graph::Graph;
use batchfit_tune::basis::PredictionBasis;
use batchfit_tune::decide::Decision;
use batchfit_tune::lr::LrScaling;
use batchfit_tune::stability::{
    CHECK_SEEDS, HALVINGS, RateCheck, RateVerdict, cap_from, check_limit, checked_b_noise,
    failed_from, judge, mark_no_gain, reference_updates, seeds_settled, unreached_to,
};

/// Rounds of check-then-decide: each round checks the batches the last
/// decision names that no round has checked; a failed batch moves the
/// recommendation below it, so a few rounds reach a batch that trains.
/// The first round checks a fixed ladder and names nothing.
pub const ROUNDS: usize = 5;

/// What the checks found, for the next decision.
#[derive(Clone, Debug, Default)]
pub struct RateFindings {
    pub checks: Vec<RateCheck>,
    /// The batch the rule is held at ([`cap_from`]).
    pub cap: Option<u64>,
    /// The smallest batch where no rate trained ([`failed_from`]).
    pub failed_from: Option<u64>,
    /// The largest batch whose check was slower than predicted ([`unreached_to`]).
    pub unreached_to: Option<u64>,
    /// B_noise as the checks measured it ([`checked_b_noise`]).
    pub b_noise: Option<f64>,
    /// The reference check's mean updates ([`reference_updates`]).
    pub reference_updates: Option<f64>,
}

/// Checks the batches `decide` names, deciding again after each round, until
/// the named batches have all been checked (or [`ROUNDS`] are spent).
/// Returns the last decision and the findings it was made with.
pub fn checked_decision(
    graph: &Graph,
    base: &TrainConfig,
    data: &Dataset,
    mut decide: impl FnMut(&RateFindings) -> Decision,
) -> Result<(Decision, RateFindings)> {
    let mut found = RateFindings::default();
    let mut decision = decide(&found);
    // The checks are held to the noise run's own curve, whatever a round refitted.
    let Some(run_basis) = decision.basis.clone() else {
        return Ok((decision, found));
    };
    let Some(run) = run_basis.run() else {
        return Ok((decision, found));
    };
    // The reference: the run's own batch and rate, which S(B) says takes the
    // run's updates; the other checks are read relative to it.
    found
        .checks
        .extend(check_rates(graph, base, data, &run_basis, &[run.batch], 0)?);
    // The checks B_noise is refitted to: the reference and the first round's,
    // which rest on the noise run alone (see [`to_check`]), with the verdicts
    // they had then: a later check that trained faster at a smaller batch
    // marks one of them [`RateVerdict::NoGain`], and which later batches are
    // checked depends on the timings.
    let mut fitted: Vec<RateCheck> = found.checks.clone();
    for round in 0..ROUNDS {
        let Some(basis) = decision.basis.clone() else {
            break;
        };
        let first = round == 0;
        let batches = to_check(&decision, &found.checks, first);
        if batches.is_empty() && !first {
            break;
        }
        found
            .checks
            .extend(check_rates(graph, base, data, &basis, &batches, HALVINGS)?);
        mark_no_gain(&mut found.checks, None);
        if first {
            fitted = found.checks.clone();
        }
        // Never below the run's own batch, whose rate the run trained with.
        found.cap = cap_from(&basis.lr, &found.checks).map(|c| c.max(run.batch));
        found.failed_from = failed_from(&found.checks);
        found.unreached_to = unreached_to(&found.checks);
        let advised = LrScaling {
            cap_batch: match (run_basis.lr.cap_batch, found.cap) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
            ..run_basis.lr
        };
        // The later rounds' checks depend on which of two tied batches timed a
        // little faster; a refit to them sent runs of `advise` on raw MNIST to
        // noise scales of 1,620 and 2,844. They still cap the rate and stop a
        // batch that does not train.
        found.b_noise = checked_b_noise(&run_basis, &advised, &fitted);
        found.reference_updates = reference_updates(&run_basis, &fitted);
        let next = decide(&found);
        if next
            .recommendations
            .iter()
            .all(|r| r.recommended_batch.is_none())
        {
            // Nothing between the failed and the unreached batches to
            // recommend: keep the named batch, which the report says did not
            // train.
            found.failed_from = None;
            found.unreached_to = None;
            decision = decide(&found);
            break;
        }
        decision = next;
    }
    Ok((decision, found))
}

/// The batches to check next. The first round: the table's largest batch
/// (the far end of the fit) and [`first_round_ladder`], which rest on the
/// noise run alone, so every run of `advise` checks the same batches and
/// refits B_noise to the same results. Each round after it: every device's
/// recommended batch and its neighbours in the time-to-target table (the
/// next smaller and larger single-step batch: the choice is between them, so
/// S(B) is measured there). None already checked at the rate the decision
/// now gives it (a cap changes the rate of the batches above it). Ascending.
fn to_check(d: &Decision, checked: &[RateCheck], first: bool) -> Vec<u64> {
    let Some(basis) = &d.basis else {
        return Vec::new();
    };
    let mut wanted = Vec::new();
    for r in &d.recommendations {
        let Some(b) = r.recommended_batch else {
            continue;
        };
        let mut on_device: Vec<u64> = d
            .time_to_target
            .iter()
            .filter(|t| t.option.device == r.device && t.option.accumulation == 1)
            .map(|t| t.option.micro_batch)
            .collect();
        on_device.sort_unstable();
        on_device.dedup();
        let ladder = || {
            let Some(run) = basis.run() else {
                return Vec::new();
            };
            // Each batch's predicted updates over the run's own.
            let at_run = basis.curve.steps(run.batch as f64);
            let rows: Vec<(u64, f64)> = on_device
                .iter()
                .map(|&b| (b, basis.curve.steps(b as f64) / at_run))
                .collect();
            first_round_ladder(&rows, run.batch)
        };
        wanted.extend(round_batches(&on_device, b, first, ladder));
    }
    let at_rate = |b: u64| {
        let rate = basis.lr.at(b);
        checked
            .iter()
            .any(|c| c.batch == b && (c.lr - rate).abs() <= 1e-9 * rate)
    };
    wanted.retain(|&b| !at_rate(b));
    wanted.sort_unstable();
    wanted.dedup();
    wanted
}

/// One device's batches for a round (`on_device`: its table's single-step
/// batches, ascending): in the first round the largest and the `ladder`,
/// whatever the recommended batch `b`; after it `b` and its neighbours.
fn round_batches(
    on_device: &[u64],
    b: u64,
    first: bool,
    ladder: impl FnOnce() -> Vec<u64>,
) -> Vec<u64> {
    if first {
        let mut wanted = ladder();
        wanted.extend(on_device.last());
        return wanted;
    }
    let mut wanted = vec![b];
    wanted.extend(on_device.iter().rev().find(|&&x| x < b));
    wanted.extend(on_device.iter().find(|&&x| x > b));
    wanted
}

/// The first round's fixed part: the table's powers of two from half the
/// noise run's batch up, and below that those predicted to take at most
/// [`LADDER_UPDATES`] times the run's own updates (`rows`: batch and predicted
/// updates over the run's). The rounds after it follow the decision, and a
/// check that fails moves every decision after it, so a first round that
/// depended on which of two tied batches measured a little faster would send
/// two runs of `advise` down different paths; this one rests on the noise run
/// alone (its seeds fix it), not on timed steps, so it is the same in every
/// run. It measures S(B) on both sides of the run's batch, over the range the
/// table is read in: a B_noise fitted to checks near the run's batch alone
/// extrapolates to small batches with a slope it never measured.
fn first_round_ladder(rows: &[(u64, f64)], run_batch: u64) -> Vec<u64> {
    rows.iter()
        .filter(|&&(x, updates)| {
            x.is_power_of_two() && (2 * x >= run_batch || updates <= LADDER_UPDATES)
        })
        .map(|&(x, _)| x)
        .collect()
}

/// Below half the noise run's batch, the first round checks the powers of two
/// predicted to take at most this many times the noise run's updates: a
/// smaller batch's step costs no more than the run's, so each such check costs
/// at most this many noise runs' worth of training.
pub const LADDER_UPDATES: f64 = 4.0;

/// Each batch's check: the rule's rate under `basis` trained to its target,
/// then up to `halvings` halvings of it until one trains.
fn check_rates(
    graph: &Graph,
    base: &TrainConfig,
    data: &Dataset,
    basis: &PredictionBasis,
    batches: &[u64],
    halvings: u32,
) -> Result<Vec<RateCheck>> {
    let mut checks = Vec::new();
    let run_batch = basis.run().map_or(0, |run| run.batch);
    for &batch in batches.iter().filter(|&&b| b as usize <= data.rows) {
        let rule = basis.lr.at(batch);
        // Below the run's batch the rule's rate is below the one the run trained
        // with: a check there that misses its limit says S(B) was mispredicted.
        let below_run = batch < run_batch;
        for h in 0..=if below_run { 0 } else { halvings } {
            let lr = rule / 2f64.powi(h as i32);
            let max_steps = check_limit(basis, batch, lr);
            let train = |cfg: &TrainConfig| {
                run_to_target(
                    graph,
                    cfg,
                    data,
                    batch as usize,
                    lr,
                    basis.target_loss,
                    max_steps,
                )
            };
            let (start, end, reached) = train(base)?;
            let verdict = match judge(start, end, reached) {
                RateVerdict::Stalled if below_run => RateVerdict::SlowerThanPredicted,
                v => v,
            };
            // A rate that trained is trained again from other seeds until its
            // mean updates are known (the verdict stays the first seed's).
            let (mut steps_to_target, mut seeds, mut steps_sd) = (reached, 1, None);
            if let (RateVerdict::Trains, Some(first)) = (verdict, reached) {
                let mut steps = vec![first];
                for k in 1..CHECK_SEEDS {
                    let seeded = TrainConfig {
                        seed: base.seed + k,
                        ..base.clone()
                    };
                    let (_, _, r) = train(&seeded)?;
                    steps.push(r.unwrap_or(max_steps as f64));
                    let (mean, sd, settled) = seeds_settled(&steps);
                    (steps_to_target, seeds, steps_sd) = (Some(mean), k + 1, sd);
                    if settled {
                        break;
                    }
                }
            }
            checks.push(RateCheck {
                batch,
                lr,
                rule_rate: h == 0,
                max_steps,
                loss_start: start,
                loss_end: end,
                steps_to_target,
                predicted_steps: basis.curve.steps(batch as f64),
                verdict,
                projected_steps: None,
                seeds,
                steps_sd,
            });
            if verdict == RateVerdict::Trains {
                break;
            }
        }
    }
    Ok(checks)
}

#[cfg(test)]
mod tests {
    use super::{first_round_ladder, round_batches};

    #[test]
    fn the_first_round_is_the_same_whichever_batch_the_timings_named() {
        // Two runs whose timings named 203 and 406 (tied batches): the first
        // round checks the same batches, and each later round the named
        // batch and its neighbours.
        let table = [32, 64, 128, 203, 256, 323, 406, 512, 1024];
        let ladder = || vec![64, 128, 256, 512, 1024];
        assert_eq!(
            round_batches(&table, 203, true, ladder),
            round_batches(&table, 406, true, ladder)
        );
        assert_eq!(
            round_batches(&table, 203, true, ladder),
            vec![64, 128, 256, 512, 1024, 1024]
        );
        assert_eq!(
            round_batches(&table, 203, false, ladder),
            vec![203, 128, 256]
        );
        assert_eq!(round_batches(&table, 1024, false, ladder), vec![1024, 512]);
    }

    #[test]
    fn the_first_round_checks_the_ladder_from_half_the_run_batch() {
        // Updates over the run's: 128 / B below the run (perfect scaling), so 32 is
        // the smallest power of two within LADDER_UPDATES.
        let table: Vec<(u64, f64)> = [1, 2, 4, 8, 16, 32, 64, 128, 203, 256, 323, 512, 1024]
            .map(|b| (b, (128.0 / b as f64).max(1.0)))
            .to_vec();
        assert_eq!(
            first_round_ladder(&table, 128),
            vec![32, 64, 128, 256, 512, 1024]
        );
        // A run at a batch off the ladder: from half of it, rounded up.
        let slow_below: Vec<(u64, f64)> = table
            .iter()
            .map(|&(b, _)| (b, if b < 64 { 5.0 } else { 1.0 }))
            .collect();
        assert_eq!(
            first_round_ladder(&slow_below, 100),
            vec![64, 128, 256, 512, 1024]
        );
        assert_eq!(
            first_round_ladder(&[(8, 1.0), (16, 1.0), (24, 1.0)], 16),
            vec![8, 16]
        );
    }
}
