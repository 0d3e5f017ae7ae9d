use super::*;
use batchfit_tune::basis::NoiseRunAt;
use batchfit_tune::target::StepsCurve;

/// The reason for `tied`, the fastest single median at 256, judged on `line`.
fn time_to_target(tied: Vec<u64>, line: Option<(f64, f64)>) -> String {
    reason(&Reason::TimeToTarget {
        tied,
        band: batchfit_tune::advice::NoiseBand {
            b_noise: 249.0,
            low: 204.0,
            high: Some(388.0),
        },
        fastest_batch: 256,
        fastest_step_s: 7.07e-5,
        step_line: line,
        tie_break: TieBreak::MeasuredFastest,
    })
}

/// Judged on the line through the step times, a batch the table's single
/// medians put behind another is named with the line, and the other named
/// as the medians' first (raw MNIST: 128 named, 256 at 1.00x in the table).
#[test]
fn a_batch_named_on_the_line_says_which_the_medians_put_first() {
    let line = Some((1.17e-3, 1.6e-5));
    let apart = time_to_target(vec![128], line);
    assert!(apart.contains("1.170 ms + 0.0160 ms per sample"), "{apart}");
    assert!(
        apart.contains("single medians of the table put B = 256 first"),
        "{apart}"
    );
    let same = time_to_target(vec![256], line);
    assert!(same.contains("line through every measured one"), "{same}");
    assert!(!same.contains("single medians"), "{same}");
    let medians = time_to_target(vec![128], None);
    assert!(!medians.contains("line"), "{medians}");
}

/// A tie of one batch is no tie: the reason says nothing came near it.
#[test]
fn a_single_batch_is_not_called_a_tie() {
    let of = |tied: Vec<u64>| time_to_target(tied, None);
    let alone = of(vec![256]);
    assert!(alone.contains("no other batch comes within"), "{alone}");
    assert!(!alone.contains("cannot be told apart"), "{alone}");
    let pair = of(vec![256, 203]);
    assert!(
        pair.contains("batches 256, 203 cannot be told apart"),
        "{pair}"
    );
    assert!(pair.contains("measured step times put fastest"), "{pair}");
}

/// Once the checks anchor S(B), the report gives their updates beside the run's.
#[test]
fn the_anchor_names_the_checks_updates_and_the_runs() {
    let mut basis = PredictionBasis {
        lr: LrScaling {
            rule: LrRule::Sqrt,
            ref_batch: 16,
            ref_lr: 1e-3,
            cap_batch: None,
        },
        warmup_epochs: 0.0,
        target_loss: 0.1,
        curve: StepsCurve {
            s_min: 50.0,
            b_noise: 128.0,
            rows: None,
        },
        source: BasisSource::EndValue {
            run: NoiseRunAt {
                batch: 128,
                lr: 2.8e-3,
            },
            updates: 146.0,
            b_simple_end: 128.0,
        },
        b_noise_run: None,
        reference_updates: None,
    };
    assert_eq!(reference_anchor(&basis), None, "not anchored");
    basis.reference_updates = Some(82.0);
    let text = reference_anchor(&basis).unwrap();
    assert!(
        text.contains("82 updates")
            && text.contains("batch 128 and the noise run's rate (the run itself took 146)"),
        "{text}"
    );
}

/// A check trained from several seeds gives their mean and spread.
#[test]
fn a_check_of_several_seeds_states_their_spread() {
    use batchfit_tune::stability::{RateCheck, RateVerdict};
    let mut c = RateCheck {
        batch: 64,
        lr: 2e-3,
        rule_rate: true,
        max_steps: 700,
        loss_start: 2.3,
        loss_end: 0.04,
        steps_to_target: Some(381.4),
        predicted_steps: 343.0,
        verdict: RateVerdict::Trains,
        projected_steps: None,
        seeds: 2,
        steps_sd: Some(12.2),
    };
    let line = rate_check(&c);
    assert!(
        line.contains("reached the target in 381 ± 12 updates (2 seeds)"),
        "{line}"
    );
    c.seeds = 1;
    c.steps_sd = None;
    assert!(rate_check(&c).contains("reached the target in 381 updates"));
}

/// A noise run that learned nothing is explained by the data where the
/// data leaves nothing to learn (one target, one class: ignoring the
/// inputs costs nothing), and by the inputs or the rate otherwise.
#[test]
fn learning_nothing_from_one_target_blames_the_labels_not_the_scale() {
    let knee = |prior_loss: f64| {
        reason(&Reason::Knee {
            efficiency: 0.9,
            hint: NoiseHint::NotLearning {
                run_loss: 0.9,
                prior_loss,
            },
        })
    };
    for nothing in [0.0, -0.0] {
        let why = knee(nothing);
        assert!(
            why.contains("nothing to learn: check the label column"),
            "{why}"
        );
        assert!(!why.contains("--standardize"), "{why}");
    }
    assert!(knee(0.5).contains("scale the inputs (--standardize) or lower --lr"));
}

/// A check that did not hold says whether the advice had stated the
/// faster batch among those it could not tell apart.
#[test]
fn a_verdict_that_did_not_hold_names_a_stated_tie() {
    let line = |fastest_in_tie| {
        verdict_line(
            128,
            VerdictOutcome::NotHeld {
                fastest_in_tie,
                seconds: 0.02,
                ratio: 1.1,
                fastest: 256,
                fastest_seconds: 0.018,
            },
        )
    };
    assert!(line(true).ends_with(
        "The advice had stated 256 among the batches its timings could not tell apart from 128."
    ));
    assert!(
        line(false).ends_with("beyond the seeds' noise."),
        "{}",
        line(false)
    );
}

/// Checks none of which reached the target are said to show no rate that
/// trains; one that reached it silences the line, as do no checks at all.
#[test]
fn no_check_at_the_target_is_said() {
    use batchfit_tune::stability::{RateCheck, RateVerdict};
    let check = |steps: Option<f64>, verdict| RateCheck {
        batch: 128,
        lr: 2.8e-3,
        rule_rate: true,
        max_steps: 385,
        loss_start: 3.7e6,
        loss_end: 235.6,
        steps_to_target: steps,
        predicted_steps: 192.0,
        verdict,
        projected_steps: None,
        seeds: 1,
        steps_sd: None,
    };
    let stalled = check(None, RateVerdict::Stalled);
    let line = none_trained(&[stalled, stalled]).unwrap();
    assert!(line.contains("no check reached the target"), "{line}");
    assert_eq!(
        none_trained(&[stalled, check(Some(180.0), RateVerdict::Trains)]),
        None
    );
    assert_eq!(none_trained(&[]), None);
}
