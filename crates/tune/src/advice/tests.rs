use super::*;
use crate::target::rank;

fn pts(v: &[(u64, f64)]) -> Vec<StepPoint> {
    v.iter()
        .map(|&(batch, step_s)| StepPoint {
            batch,
            step_s,
            rel_err: 0.0,
        })
        .collect()
}

fn evidence<'a>(points: &'a [StepPoint], max: Option<u64>) -> DeviceEvidence<'a> {
    DeviceEvidence {
        device: DeviceSpec::Cpu,
        points,
        knee_batch: Some(64),
        efficiency: 0.9,
        max_batch: max,
        max_batch_source: if max.is_some() {
            MaxBatchSource::Measured
        } else {
            MaxBatchSource::NotSearched
        },
        noise_hint: NoiseHint::GiveData,
        rate_failed_from: None,
        rate_unreached_to: None,
        rows: None,
    }
}

const ADAM: LrAdviceInput = LrAdviceInput {
    rule: LrRule::Sqrt,
    reference: None,
};

/// Step time 1 ms + 0.01 ms per sample at 16, 64, 256 and 1,024.
fn one_ms_plus_ten_us_a_sample() -> Vec<StepPoint> {
    pts(&[
        (16, 1.16e-3),
        (64, 1.64e-3),
        (256, 3.56e-3),
        (1024, 11.24e-3),
    ])
}

#[test]
fn with_a_noise_scale_the_fastest_predicted_time_wins() {
    // B_noise = 400: (1 + 400/B)(1 + 0.01 B) ms: B=16: 26 x 1.16 = 30.2;
    // 64: 7.25 x 1.64 = 11.9; 256: 2.5625 x 3.56 = 9.1; 1024: 1.39 x 11.24 =
    // 15.6. 256 wins.
    let p = one_ms_plus_ten_us_a_sample();
    let (rec, options) = recommend(&evidence(&p, None), Some(NoiseBand::exact(400.0)), ADAM);
    assert_eq!(rec.recommended_batch, Some(256));
    assert_eq!(options.len(), 4);
    assert!(rec.accumulation.is_none());
    let table = rank(&options, 400.0, None, None);
    assert_eq!(table[0].option.micro_batch, 256);
    assert!(
        (table[1].vs_best - 11.89 / 9.1225).abs() < 1e-2,
        "{table:?}"
    );
}

/// On the same curve (256 fastest, 64 next, 1,024 last), the rate checks'
/// bounds: no rate trained from 256 up (64 is named), or the check at 256
/// did not reach the target, its updates only a lower bound (1,024, the only
/// batch above it, is named). The table keeps every batch that fits.
#[test]
fn batches_the_rate_checks_rule_out_are_not_recommended_but_stay_in_the_table() {
    let p = one_ms_plus_ten_us_a_sample();
    let failed = DeviceEvidence {
        rate_failed_from: Some(256),
        ..evidence(&p, None)
    };
    let unreached = DeviceEvidence {
        rate_unreached_to: Some(256),
        ..evidence(&p, None)
    };
    for (e, named) in [(failed, 64), (unreached, 1024)] {
        let (rec, options) = recommend(&e, Some(NoiseBand::exact(400.0)), ADAM);
        assert_eq!(rec.recommended_batch, Some(named));
        assert_eq!(options.len(), 4);
    }
}

#[test]
fn without_data_the_knee_is_recommended() {
    let p = pts(&[(16, 1e-3), (64, 2e-3)]);
    let (rec, _) = recommend(&evidence(&p, None), None, ADAM);
    assert_eq!(rec.recommended_batch, Some(64));
    assert!(
        matches!(rec.reason, Reason::Knee { efficiency, .. } if efficiency == 0.9),
        "{:?}",
        rec.reason
    );
}

#[test]
fn memory_below_the_critical_batch_adds_accumulation() {
    // The device fits 32 at most; B_noise = 250: accumulate ceil(250/32) = 8.
    let p = pts(&[(8, 1e-3), (32, 2e-3), (128, 6e-3)]);
    let (rec, options) = recommend(&evidence(&p, Some(32)), Some(NoiseBand::exact(250.0)), ADAM);
    let acc = rec.accumulation.expect("accumulation advised");
    assert_eq!(
        (acc.micro_batch, acc.steps, acc.effective_batch),
        (32, 8, 256)
    );
    assert!((acc.update_s - 16e-3).abs() < 1e-12);
    // 128 does not fit: not an option; the accumulation option is.
    assert!(options.iter().all(|o| o.micro_batch <= 32));
    assert!(options.iter().any(|o| o.accumulation == 8));
    assert_eq!(rec.max_batch_source, MaxBatchSource::Measured);
}

/// `run --batches 64,256` where 256 ran: it is the largest tried, not a
/// memory cap, so B_noise above it asks for no accumulation.
#[test]
fn the_largest_listed_batch_is_not_a_memory_cap() {
    let p = pts(&[(64, 1e-3), (256, 2e-3)]);
    let e = DeviceEvidence {
        max_batch_source: MaxBatchSource::LargestTried,
        ..evidence(&p, Some(256))
    };
    let (rec, options) = recommend(&e, Some(NoiseBand::exact(700.0)), ADAM);
    assert!(rec.accumulation.is_none(), "{:?}", rec.accumulation);
    assert!(options.iter().all(|o| o.accumulation == 1));
    assert_eq!(rec.recommended_batch, Some(256));
}

#[test]
fn a_reference_learning_rate_is_scaled_to_the_recommendation() {
    let p = pts(&[(16, 1e-3), (64, 1e-3)]);
    let lr = LrAdviceInput {
        rule: LrRule::Sqrt,
        reference: Some((16, 1e-3)),
    };
    let (rec, _) = recommend(&evidence(&p, None), Some(NoiseBand::exact(100.0)), lr);
    assert_eq!(rec.recommended_batch, Some(64));
    assert!((rec.learning_rate.unwrap() - 2e-3).abs() < 1e-12);
}

#[test]
fn the_source_serialises_as_before() {
    let v = serde_json::to_value(MaxBatchSource::PredictedForRam).unwrap();
    assert_eq!(v["max_batch_source"], "predicted for this machine's RAM");
    assert_eq!(v["max_batch_source_code"], "predicted_for_ram");
}

/// Step times with 10 % errors: batches within the noise of the fastest
/// tie, and the smallest of them is named; the tie does not depend on
/// which of them happened to measure fastest.
/// Step times 32: 1.4, 128: 3.0, 256: s256, 512: 7.8 ms at 5 % errors;
/// the line through them puts B* = sqrt(B_noise x fixed / per_sample) near
/// 170 for B_noise 400, and `low`..`high` is B_noise's band.
fn tie_of_128_and_256(s256: f64, low: f64, high: f64) -> Recommendation {
    let pts: Vec<StepPoint> = [(32, 1.4e-3), (128, 3.0e-3), (256, s256), (512, 7.8e-3)]
        .iter()
        .map(|&(batch, step_s)| StepPoint {
            batch,
            step_s,
            rel_err: 0.05,
        })
        .collect();
    let band = NoiseBand {
        b_noise: 400.0,
        low,
        high: Some(high),
    };
    recommend(&evidence(&pts, None), Some(band), ADAM).0
}

#[test]
fn ties_within_noise_name_the_batch_nearest_the_optimum() {
    // (1 + 400/B) x step: 128: 4.125 x 3.0 = 12.4; 256: 2.5625 x 4.6 = 11.8;
    // 512: 1.78 x 7.8 = 13.9; 32: 13.5 x 1.4 = 18.9. 128 and 256 are within
    // 5 % errors of each other; 32 is not, at any B_noise of the band. Over
    // the band 370-430 the optimum stays below 181, the midpoint of 128 and
    // 256: whether 256 measures a little faster or slower, 128 is named.
    for s256 in [4.4e-3, 4.6e-3, 4.9e-3] {
        let rec = tie_of_128_and_256(s256, 370.0, 430.0);
        assert!(
            rec.tied_batches.starts_with(&[128, 256]),
            "{s256}: {:?}",
            rec.tied_batches
        );
        assert_eq!(rec.recommended_batch, Some(128));
        assert!(matches!(
            rec.reason,
            Reason::TimeToTarget {
                tie_break: TieBreak::Optimum(_),
                ..
            }
        ));
    }
}

/// Where B_noise's band (300-520) carries the optimum across the midpoint of
/// 128 and 256, the line cannot say which is nearer, and the measured step
/// times name the faster of the two (MNIST scaled to 0..1, one hidden layer:
/// the optimum at 173-179 named 128 in five runs, and `sweep --verify`
/// trained 256 27 % faster, as `advise`'s own step times had put it).
#[test]
fn an_optimum_at_the_midpoint_leaves_the_pair_to_the_measurements() {
    for (s256, named) in [(4.4e-3, 256), (4.9e-3, 128)] {
        let rec = tie_of_128_and_256(s256, 300.0, 520.0);
        assert_eq!(rec.recommended_batch, Some(named), "{s256}");
        let Reason::TimeToTarget {
            tie_break: TieBreak::Midpoint { optimum, low, high },
            ..
        } = rec.reason
        else {
            panic!("{:?}", rec.reason);
        };
        let midpoint = (128.0f64 * 256.0).sqrt();
        assert!(low < midpoint && high.unwrap() > midpoint, "{low} {high:?}");
        assert!(low < optimum && optimum < high.unwrap());
    }
    assert_eq!(
        straddled(&[64, 128, 256], 170.0, 160.0, Some(190.0)),
        Some((128, 256))
    );
    assert_eq!(straddled(&[64, 128, 256], 170.0, 160.0, Some(175.0)), None);
    assert_eq!(straddled(&[128, 256], 170.0, 150.0, None), Some((128, 256)));
    // No tied batch above the optimum: nothing to choose between.
    assert_eq!(straddled(&[64, 128], 170.0, 100.0, None), None);
}

/// A per-step floor up to a hinge inside the tie, then a rise in proportion
/// to the batch (a one-hidden-layer MLP on R's kidtran, 863 rows, steps of
/// 0.06-0.2 ms, as `advise` timed them): no line meets the tie's
/// neighbourhood, so no line's optimum breaks the tie (one through it said
/// 611, and 512 was named where 256 trained 20 % faster in `sweep
/// --verify`); the smallest tied power of two is named.
#[test]
fn a_tie_across_a_hinge_is_not_broken_by_a_line_through_it() {
    let pts: Vec<StepPoint> = [
        (32, 56.9),
        (64, 56.9),
        (128, 74.8),
        (161, 74.8),
        (203, 74.8),
        (256, 74.8),
        (512, 147.4),
        (776, 214.5),
    ]
    .iter()
    .map(|&(batch, us)| StepPoint {
        batch,
        step_s: us * 1e-6,
        rel_err: 0.006,
    })
    .collect();
    let band = NoiseBand {
        b_noise: 1060.0,
        low: 722.0,
        high: None,
    };
    let (rec, _) = recommend(&evidence(&pts, None), Some(band), ADAM);
    assert!(rec.tied_batches.contains(&512), "{:?}", rec.tied_batches);
    assert_eq!(rec.recommended_batch, Some(256), "{:?}", rec.tied_batches);
}

/// Step times that two processes time 13 % apart, flat to 256 and then
/// rising in proportion to the batch (a one-hidden-layer MLP on R's
/// boot::aids, 570 rows, as `advise` timed them): with such errors a line
/// passes for the curve and its optimum (about 360) sits nearer 512, but
/// the measurements put 512's time to target 1.7x 256's, far beyond both
/// errors; `sweep --verify` trained 256 30 % faster. The measured faster
/// one is named, and the report says why.
#[test]
fn a_line_optimum_that_the_measurements_contradict_does_not_name_the_batch() {
    let pts: Vec<StepPoint> = [
        (1, 52.5),
        (2, 54.8),
        (4, 54.8),
        (8, 59.3),
        (16, 60.6),
        (32, 60.6),
        (64, 60.6),
        (128, 63.1),
        (161, 63.1),
        (203, 66.6),
        (256, 71.3),
        (512, 167.5),
        (513, 174.9),
    ]
    .iter()
    .map(|&(batch, us)| StepPoint {
        batch,
        step_s: us * 1e-6,
        rel_err: 0.13,
    })
    .collect();
    let band = NoiseBand {
        b_noise: 331.0,
        low: 262.0,
        high: None,
    };
    let (rec, _) = recommend(&evidence(&pts, None), Some(band), ADAM);
    assert!(rec.tied_batches.contains(&512), "{:?}", rec.tied_batches);
    assert_eq!(rec.recommended_batch, Some(256), "{:?}", rec.tied_batches);
    assert!(
        matches!(
            rec.reason,
            Reason::TimeToTarget {
                tie_break: TieBreak::Measured { .. },
                ..
            }
        ),
        "{:?}",
        rec.reason
    );
}

/// Update times measured to 0.1-1.5 % that bend away from any line (a
/// per-step floor to batch 32, a faster kernel at 1,024: the shipped
/// digits MLP on a 2-core CPU, one `advise`): a line explains 11 of the 13
/// within 10 %, but its median miss is 7 %, more than a second run moves
/// a step time, so the medians stand: the tie holds the batches they show
/// fastest across the band. (Smoothed, the tie was 256 and 512 in two of
/// five runs, 128 and 1,024 in the others.)
#[test]
fn precise_step_times_that_bend_are_not_smoothed_into_a_line() {
    let measured = [
        (1, 58.6, 0.0014),
        (2, 57.5, 0.0017),
        (4, 61.3, 0.0017),
        (8, 62.2, 0.0019),
        (16, 61.4, 0.0013),
        (32, 67.0, 0.0083),
        (64, 82.0, 0.0013),
        (128, 114.9, 0.0012),
        (256, 197.8, 0.0012),
        (512, 361.1, 0.0013),
        (645, 449.1, 0.0027),
        (813, 516.3, 0.0016),
        (1024, 523.6, 0.0150),
    ];
    let pts: Vec<StepPoint> = measured
        .iter()
        .map(|&(batch, us, rel_err)| StepPoint {
            batch,
            step_s: us * 1e-6,
            rel_err,
        })
        .collect();
    assert_eq!(step_time_line(&pts), None);
    let band = NoiseBand {
        b_noise: 461.0,
        low: 392.0,
        high: None,
    };
    let (rec, _) = recommend(&evidence(&pts, None), Some(band), ADAM);
    // (1 + 461/B) x step: 128: 529 us, 256: 554 us, 64: 672 us; 256 is the
    // fastest further up the band, 1,024 at its open end (4 x 461). The
    // line through them would have put 512 in the tie and left 128 out.
    let mut tied = rec.tied_batches.clone();
    tied.sort_unstable();
    assert_eq!(tied, vec![128, 256, 1024]);
    // A curve a line meets within a few per cent (breast-cancer's MLP on
    // the same machine, 0.1 % errors, one outlier at 512) is smoothed:
    // its misses are what a second run would move.
    let near_line: Vec<StepPoint> = [
        (1, 44.5),
        (2, 46.4),
        (4, 49.1),
        (8, 49.0),
        (16, 49.5),
        (32, 52.6),
        (64, 60.7),
        (128, 78.1),
        (256, 113.1),
        (512, 214.3),
    ]
    .iter()
    .map(|&(batch, us)| StepPoint {
        batch,
        step_s: us * 1e-6,
        rel_err: 0.001,
    })
    .collect();
    assert!(step_time_line(&near_line).is_some());
    // The bent times with 20 % errors are noise about a line: smoothed.
    let noisy: Vec<StepPoint> = pts
        .iter()
        .map(|q| StepPoint { rel_err: 0.2, ..*q })
        .collect();
    assert!(step_time_line(&noisy).is_some());
}

/// A tie is broken among the ladder's powers of two and the full batch,
/// which every run measures: the refinement at 203 that one run added does
/// not take the answer from 256 (B* 216, mnist-mlp on scaled MNIST); the
/// full batch (iris's 135 training rows) is as much the ladder's as 128;
/// without a tied batch of the ladder, the nearest of all.
#[test]
fn a_tie_is_broken_among_the_batches_every_run_measures() {
    let nearest = |tied: &[u64], full: Option<u64>, optimum: f64| {
        nearest_tied(&ladder_of(tied, full), optimum)
    };
    assert_eq!(nearest(&[203, 256, 512], None, 216.0), Some(256));
    assert_eq!(nearest(&[256, 406, 512], None, 380.0), Some(512));
    assert_eq!(nearest(&[32, 64, 81, 102], None, 46.0), Some(64));
    assert_eq!(nearest(&[323, 406], None, 380.0), Some(406));
    assert_eq!(nearest(&[], None, 380.0), None);
    assert_eq!(nearest(&[128, 130, 133, 135], Some(135), 135.0), Some(135));
    assert_eq!(nearest(&[128, 130, 133, 135], None, 135.0), Some(128));
    assert_eq!(nearest(&[128, 133], Some(135), 135.0), Some(128));
}

/// A batch that is fastest only inside the band, neither at its ends nor
/// at its centre, is tied: step time 1 + B/256 (B* = sqrt(256 B_noise))
/// puts the fastest at 128 for B_noise 50 and at 2,048 for 20,000; 512 is
/// the fastest around 3,200 and 24 % or more behind at either end.
#[test]
fn a_batch_fastest_inside_the_band_is_tied() {
    let options: Vec<(u64, f64, f64)> = [32u64, 128, 512, 2048]
        .iter()
        .map(|&b| (b, 1.0 + b as f64 / 256.0, 0.0))
        .collect();
    let band = NoiseBand {
        b_noise: 50.0,
        low: 50.0,
        high: Some(20_000.0),
    };
    assert_eq!(tied_batches(&options, band, None), vec![128, 512, 2048]);
}

#[test]
fn exact_measurements_tie_only_at_equal_times() {
    let pts = [(64u64, 1e-3, 0.0), (128, 1.5e-3, 0.0), (256, 3.0e-3, 0.0)];
    // B_noise 128: 64: 3 x 1 = 3.0; 128: 2 x 1.5 = 3.0; 256: 1.5 x 3 = 4.5.
    assert_eq!(
        tied_batches(&pts, NoiseBand::exact(128.0), None),
        vec![64, 128]
    );
}

/// On a data set of 1,100 rows a batch of 1,024 is nearly the full gradient:
/// with B_noise 2,000 it needs 1 + 2000 (1/1024 - 1/1100) = 1.13x S_min, not
/// the 2.95x of unlimited data, and it wins; on unlimited data 256 is named.
#[test]
fn on_a_small_data_set_a_batch_near_all_its_rows_is_counted_as_nearly_noiseless() {
    let p = one_ms_plus_ten_us_a_sample();
    let unlimited = recommend(&evidence(&p, None), Some(NoiseBand::exact(2000.0)), ADAM).0;
    assert_eq!(unlimited.recommended_batch, Some(256));
    let small = DeviceEvidence {
        rows: crate::target::sgd_rows(1100.0),
        ..evidence(&p, None)
    };
    let (rec, options) = recommend(&small, Some(NoiseBand::exact(2000.0)), ADAM);
    assert_eq!(rec.recommended_batch, Some(1024));
    assert_eq!(rec.tied_batches, vec![1024]);
    let table = rank(&options, 2000.0, None, crate::target::sgd_rows(1100.0));
    assert_eq!(table[0].option.micro_batch, 1024);
    let at_256 = table.iter().find(|t| t.option.micro_batch == 256).unwrap();
    assert!((at_256.steps_vs_min - (1.0 + 2000.0 * (1.0 / 256.0 - 1.0 / 1100.0))).abs() < 1e-9);
}

/// Step times flat to a hinge past 256 (R's texmex summer, 578 rows, a
/// one-hidden-layer MLP, as `advise` timed them): no line fits around the
/// tie of 203 and 256, and the tie is not broken towards its smallest
/// batch: at nearly the same step time 256 takes the fewest updates, and
/// `sweep --verify` trained it 12 % faster than 203. The tied power of two
/// the measurements put fastest is named.
#[test]
fn a_tie_without_a_line_names_the_tied_power_of_two_measured_fastest() {
    // The update times `advise` ranked (step mean plus gathering the batch),
    // at its errors (the process's own and 0.8 % between processes).
    let pts: Vec<StepPoint> = [
        (1, 45.4),
        (2, 47.3),
        (4, 47.3),
        (8, 47.5),
        (16, 47.5),
        (32, 52.6),
        (64, 52.6),
        (128, 56.5),
        (161, 60.3),
        (203, 64.4),
        (256, 70.7),
        (512, 136.5),
        (520, 136.5),
    ]
    .iter()
    .map(|&(batch, us)| StepPoint {
        batch,
        step_s: us * 1e-6,
        rel_err: 0.009,
    })
    .collect();
    let band = NoiseBand {
        b_noise: 249.0,
        low: 204.0,
        high: Some(388.0),
    };
    let e = DeviceEvidence {
        rows: crate::target::sgd_rows(520.0),
        ..evidence(&pts, None)
    };
    let (rec, _) = recommend(&e, Some(band), ADAM);
    assert!(rec.tied_batches.contains(&203), "{:?}", rec.tied_batches);
    assert_eq!(rec.recommended_batch, Some(256), "{:?}", rec.reason);
    assert!(matches!(
        rec.reason,
        Reason::TimeToTarget {
            tie_break: TieBreak::MeasuredFastest,
            ..
        }
    ));
}

/// The optimum of a step-time line: SGD's closed form, and for Adam's
/// finite-data form the least of its grid, which is the closed form on data
/// far larger than the batch and a full batch where the noise outlasts it.
#[test]
fn the_optimum_batch_under_each_optimizers_form() {
    let (bn, fixed, per_sample): (f64, f64, f64) = (400.0, 1e-3, 1e-5);
    let unlimited = (bn * fixed / per_sample).sqrt();
    assert!((optimum_batch(bn, fixed, per_sample, None) - unlimited).abs() < 1e-9);
    let adam = |n: f64| Some(Rows { n, adaptive: true });
    let far = optimum_batch(bn, fixed, per_sample, adam(1e8));
    assert!(
        (far / unlimited - 1.0).abs() < 0.01,
        "{far} against {unlimited}"
    );
    // On 1,000 rows: no batch of the grid's neighbourhood is faster.
    let rows = adam(1000.0);
    let time = |b: f64| crate::target::updates_vs_min_on(bn, b, rows) * (fixed + per_sample * b);
    let best = optimum_batch(bn, fixed, per_sample, rows);
    assert!(best > 1.0 && best <= 1000.0);
    for b in [best * 0.97, best * 1.03] {
        assert!(
            time(b.min(1000.0)) >= time(best) - 1e-12,
            "{b} beats {best}"
        );
    }
    // Where the time dips again into the full batch below the minimum before
    // it (540 rows, B_noise 281, a line of 165 samples' fixed cost: 705
    // against about 755 around 300), the first minimum.
    let fair = adam(540.0);
    let time = |b: f64| crate::target::updates_vs_min_on(281.0, b, fair) * (165.0 + b);
    let first = optimum_batch(281.0, 165.0, 1.0, fair);
    assert!(time(540.0) < time(first), "the dip at the full batch");
    assert!((200.0..400.0).contains(&first), "{first}");
    // A step that costs nothing per sample: the full batch, as SGD's.
    assert_eq!(optimum_batch(bn, fixed, 1e-12, rows), 1000.0);
    assert_eq!(
        optimum_batch(2000.0, fixed, per_sample, crate::target::sgd_rows(1000.0)),
        1000.0
    );
}
