use super::*;

/// Points on a curve give it back, S_min and B_noise both; a point off
/// it moves the fit less than a fit through one anchor would; two
/// batches cannot test two parameters.
#[test]
fn a_free_fit_recovers_the_curve_from_three_batches() {
    let truth = StepsCurve {
        s_min: 40.0,
        b_noise: 380.0,
        rows: None,
    };
    let points: Vec<(f64, f64)> = [32.0, 128.0, 1024.0]
        .iter()
        .map(|&b| (b, truth.steps(b)))
        .collect();
    let c = StepsCurve::fit(&points, 1e5, None).unwrap();
    assert!((c.b_noise / 380.0 - 1.0).abs() < 0.02, "{c:?}");
    assert!((c.s_min / 40.0 - 1.0).abs() < 0.02, "{c:?}");
    assert_eq!(StepsCurve::fit(&points[..2], 1e5, None), None);
    let repeated = [points[0], points[0], points[1]];
    assert_eq!(StepsCurve::fit(&repeated, 1e5, None), None);
    // Every point 10 % high: the same B_noise, S_min 10 % higher.
    let high: Vec<(f64, f64)> = points.iter().map(|&(b, s)| (b, 1.1 * s)).collect();
    let c = StepsCurve::fit(&high, 1e5, None).unwrap();
    assert!((c.b_noise / 380.0 - 1.0).abs() < 0.02, "{c:?}");
    assert!((c.s_min / 44.0 - 1.0).abs() < 0.02, "{c:?}");
}

fn opt(device: &str, micro: u64, acc: u64, s: f64) -> TrainingOption {
    TrainingOption {
        device: device.parse().unwrap(),
        micro_batch: micro,
        accumulation: acc,
        micro_step_s: s,
    }
}

/// One fixed rate, the best at batch 32, with B_noise = 96: x = 1/4. At 32
/// it is the scaled count (4); at 128, 2x - x^2 x 1.75 = 0.390625 of the
/// best gain (2.56x S_min, where the scaled rule needs 1.75x); at 8,
/// 0.5 - 0.8125 < 0: the rate is too large for that noise.
#[test]
fn a_fixed_rate_gains_less_above_its_batch_and_fails_far_below() {
    let fixed = RateModel::Fixed { best_at: 32.0 };
    assert!((fixed.updates_vs_min(96.0, 32.0, None) - 4.0).abs() < 1e-12);
    assert!((fixed.updates_vs_min(96.0, 128.0, None) - 1.0 / 0.390625).abs() < 1e-12);
    assert!(fixed.updates_vs_min(96.0, 8.0, None).is_infinite());
    assert!((RateModel::Scaled.updates_vs_min(96.0, 128.0, None) - 1.75).abs() < 1e-12);
    // On 256 rows both batches are noise-effective: at its own batch the
    // fixed rate is still the scaled count, 1 + 96 (1/32 - 1/256) = 3.625.
    let rows = crate::target::sgd_rows(256.0);
    assert!((fixed.updates_vs_min(96.0, 32.0, rows) - 3.625).abs() < 1e-12);
    let (x, at_128) = (1.0 / 3.625, 1.0 + 96.0 * (1.0 / 128.0 - 1.0 / 256.0));
    let want = 1.0 / (2.0 * x - x * x * at_128);
    assert!((fixed.updates_vs_min(96.0, 128.0, rows) - want).abs() < 1e-12);
    assert!(want < 1.0 / 0.390625);
    let r = rank_at(
        &[
            opt("cpu", 8, 1, 1e-3),
            opt("cpu", 32, 1, 2e-3),
            opt("cpu", 128, 1, 6e-3),
        ],
        96.0,
        Some(100.0),
        None,
        fixed,
    );
    assert_eq!(r.len(), 2, "batch 8 never reaches the target at that rate");
    assert_eq!(r[0].option.micro_batch, 32);
    assert!((r[0].steps.unwrap() - 400.0).abs() < 1e-9);
}

/// The 6 GB card question by hand: B_noise = 250. GPU at 25 takes 10 ms a
/// step, CPU at 250 takes 400 ms.
#[test]
fn gpu_at_25_vs_cpu_at_250_by_hand() {
    let options = [
        opt("gpu", 25, 1, 0.010),
        opt("cpu", 250, 1, 0.400),
        opt("gpu", 25, 10, 0.010),
    ];
    let r = rank(&options, 250.0, Some(1000.0), None);
    // GPU at 25: 1000 x (1 + 10) x 0.010 = 110 s; GPU 25x10: 1000 x 2 x 0.1 = 200 s;
    // CPU at 250: 1000 x 2 x 0.4 = 800 s.
    assert_eq!(r[0].option.accumulation, 1);
    assert!((r[0].seconds.unwrap() - 110.0).abs() < 1e-9);
    assert!((r[1].seconds.unwrap() - 200.0).abs() < 1e-9);
    assert!((r[2].seconds.unwrap() - 800.0).abs() < 1e-9);
    assert!((r[2].vs_best - 800.0 / 110.0).abs() < 1e-9);
    assert_eq!(r[1].option.effective_batch(), 250);
}

#[test]
fn steps_curve_through_one_run() {
    // 300 updates at B = 128 with B_noise = 256: S_min = 300 / 3 = 100.
    let c = StepsCurve::through(300.0, 128.0, 256.0, None);
    assert!((c.s_min - 100.0).abs() < 1e-12);
    assert!((c.steps(256.0) - 200.0).abs() < 1e-12);
    assert!((c.seconds(256.0, 0.5) - 100.0).abs() < 1e-12);
    assert!((updates_vs_min(100.0, 25.0) - 5.0).abs() < 1e-12);
}

/// Without replacement from N rows the noise term is B_noise (1/B - 1/N):
/// a quarter of the rows is a third less noisy, all of them not noisy.
#[test]
fn a_batch_of_distinct_rows_is_less_noisy() {
    assert_eq!(noise_batch(64.0, None), 64.0);
    assert!(
        (noise_batch(64.0, crate::target::sgd_rows(256.0)) - 64.0 * 256.0 / 192.0).abs() < 1e-9
    );
    assert!(noise_batch(256.0, crate::target::sgd_rows(256.0)).is_infinite());
    assert!(noise_batch(300.0, crate::target::sgd_rows(256.0)).is_infinite());
    assert_eq!(
        updates_vs_min_on(256.0, 64.0, crate::target::sgd_rows(256.0)),
        updates_vs_min(256.0, noise_batch(64.0, crate::target::sgd_rows(256.0)))
    );
    let c = StepsCurve::through(300.0, 128.0, 256.0, crate::target::sgd_rows(512.0));
    // 1 + 256 (1/128 - 1/512) = 2.5: S_min 120.
    assert!((c.s_min - 120.0).abs() < 1e-9);
    assert!((c.steps(512.0) - 120.0).abs() < 1e-9);
    assert!((c.steps(1024.0) - 120.0).abs() < 1e-9);
    // Read back, and from a document written before the rows.
    let v = serde_json::to_value(c).unwrap();
    assert_eq!(serde_json::from_value::<StepsCurve>(v).unwrap(), c);
    let old: StepsCurve =
        serde_json::from_value(serde_json::json!({"s_min": 100.0, "b_noise": 256.0})).unwrap();
    assert_eq!(old.rows, None);
    // The fit recovers a curve measured on a finite data set.
    let points: Vec<(f64, f64)> = [16.0, 32.0, 64.0, 128.0, 256.0]
        .iter()
        .map(|&b| (b, c.steps(b)))
        .collect();
    let fitted = StepsCurve::fit(&points, 1e5, crate::target::sgd_rows(512.0)).unwrap();
    assert!((fitted.b_noise / 256.0 - 1.0).abs() < 0.02, "{fitted:?}");
}

/// Adam's step is slowed by the noise's standard deviation: on N rows
/// the noise term is (B_noise / B) sqrt(1 - B/N), which keeps the
/// unlimited data's 1 + B_noise / B far below N and, near N, falls
/// faster than SGD's B_noise (1/B - 1/N) (iris: 129 updates at all 135
/// rows against 190 at 128, where SGD's form has them 8 % apart).
#[test]
fn adams_finite_data_term_is_the_noise_standard_deviation() {
    let adam = |n: f64| Some(Rows { n, adaptive: true });
    assert!((noise_batch(64.0, adam(256.0)) - 64.0 / 0.75f64.sqrt()).abs() < 1e-9);
    assert!(noise_batch(256.0, adam(256.0)).is_infinite());
    let (bn, n) = (200.0, 135.0);
    let term = |b: f64, rows| updates_vs_min_on(bn, b, rows) - 1.0;
    assert!((term(128.0, adam(n)) - bn / 128.0 * (7.0f64 / 135.0).sqrt()).abs() < 1e-12);
    // Far below N both forms are the unlimited data's.
    let unlimited = term(16.0, None);
    for rows in [adam(1e7), sgd_rows(1e7)] {
        assert!((term(16.0, rows) / unlimited - 1.0).abs() < 1e-5);
    }
    // Near N Adam's keeps more of the noise: 128 of 135 needs more
    // updates over the full batch than SGD's form gives it.
    assert!(term(128.0, adam(n)) > 3.0 * term(128.0, sgd_rows(n)));
    // Written and read back with its optimizer; absent, SGD's form.
    let c = StepsCurve::through(190.0, 128.0, bn, adam(n));
    let v = serde_json::to_value(c).unwrap();
    assert_eq!(v["adaptive"], serde_json::json!(true));
    assert_eq!(serde_json::from_value::<StepsCurve>(v).unwrap(), c);
    let old: StepsCurve = serde_json::from_value(
        serde_json::json!({"s_min": 100.0, "b_noise": 256.0, "rows": 512.0}),
    )
    .unwrap();
    assert_eq!(old.rows, sgd_rows(512.0));
}

fn scale(world: u64, micro: u64, acc: u64, update_s: f64) -> ScaleOption {
    ScaleOption {
        world_size: world,
        strategy: batchfit_plan::distributed::Strategy::Ddp,
        micro_batch: micro,
        accumulation: acc,
        update_s,
    }
}

/// The critical batch is where S(B) = 2 S_min, on finite rows too.
#[test]
fn the_critical_batch_on_finite_rows_doubles_the_minimum() {
    assert_eq!(critical_batch_on(300.0, None), 300.0);
    for adaptive in [false, true] {
        for (bn, n) in [(300.0, 1_000.0), (2_000.0, 1_100.0), (50.0, 60.0)] {
            let rows = Some(Rows { n, adaptive });
            let b = critical_batch_on(bn, rows);
            assert!(b < bn.min(n), "{b} on {n} rows with B_noise {bn}");
            assert!((updates_vs_min_on(bn, b, rows) - 2.0).abs() < 1e-9);
        }
    }
    assert_eq!(epochs_vs_min_on(300.0, 600.0, None), 3.0);
    // SGD: 1 + B / B_noise - B / N, at 500 of 1,000 rows.
    let (bn, b, n) = (300.0, 500.0, 1_000.0);
    let want = 1.0 + b / bn - b / n;
    assert!((epochs_vs_min_on(bn, b, sgd_rows(n)) - want).abs() < 1e-12);
    // A full batch takes S_min updates, N / B_noise epochs over the fewest.
    let adam = Some(Rows { n, adaptive: true });
    assert!((epochs_vs_min_on(bn, 2.0 * n, adam) - n / bn).abs() < 1e-12);
    use batchfit_plan::Optimizer;
    assert_eq!(rows_drawn_from(0, Optimizer::Adam), None);
    assert_eq!(rows_drawn_from(135, Optimizer::Momentum), sgd_rows(135.0));
    assert_eq!(
        rows_drawn_from(135, Optimizer::Adamw),
        Some(Rows {
            n: 135.0,
            adaptive: true
        })
    );
}

/// On a finite data set a global batch counts its rows without
/// replacement: 8 x 32 of 512 rows is as noisy as 512 drawn with it.
#[test]
fn world_sizes_count_a_global_batch_of_distinct_rows() {
    let opts = [scale(1, 32, 1, 1.0), scale(8, 32, 1, 1.0)];
    let t = time_across_world_sizes(&opts, 1000.0, Some(100.0), sgd_rows(512.0));
    assert!((t[1].updates_vs_min - (1.0 + 1000.0 / 512.0)).abs() < 1e-9);
    let unlimited = time_across_world_sizes(&opts, 1000.0, Some(100.0), None);
    assert!(t[1].updates.unwrap() < unlimited[1].updates.unwrap());
}

/// B_noise = 1000, S_min = 100, 32 per device, 1 s per update whatever N.
#[test]
fn time_across_world_sizes_by_hand() {
    let opts = [
        scale(1, 32, 1, 1.0),
        scale(8, 32, 1, 1.0),
        scale(8, 32, 4, 4.0),
    ];
    let t = time_across_world_sizes(&opts, 1000.0, Some(100.0), None);
    // N = 1: B = 32, S = 100 x (1 + 31.25) = 3225 s. N = 8: B = 256, S = 100 x 4.90625.
    assert_eq!(t[1].global_batch, 256);
    assert!((t[0].seconds.unwrap() - 3225.0).abs() < 1e-9);
    assert!((t[1].seconds.unwrap() - 490.625).abs() < 1e-9);
    // x4 accumulation: B = 1024, 100 x 1.9765625 x 4 s.
    assert!((t[2].seconds.unwrap() - 790.625).abs() < 1e-9);
    assert!((t[1].vs_best - 1.0).abs() < 1e-12);
    assert!((t[0].vs_best - 3225.0 / 490.625).abs() < 1e-9);
    // Without S_min: only ratios.
    let r = time_across_world_sizes(&opts, 1000.0, None, None);
    assert_eq!(r[0].seconds, None);
    assert!((r[0].vs_best - t[0].vs_best).abs() < 1e-12);
}

/// Constant step time, global batch doubling with N: the limit is where the global batch
/// passes B_noise (the continuous rule's e = 1/2 at B = B_noise).
#[test]
fn extra_devices_stop_paying_past_the_critical_batch() {
    assert!((updates_elasticity(500.0, 500.0) - 0.5).abs() < 1e-12);
    let b_noise = 1024.0;
    let opts: Vec<ScaleOption> = [1, 2, 4, 8, 16, 32, 64, 128]
        .iter()
        .map(|&n| scale(n, 32, 1, 1.0))
        .collect();
    let t = time_across_world_sizes(&opts, b_noise, None, None);
    let l = scaling_limit(&t).unwrap();
    // Doubling from B to 2B: e = log2((1 + b/B) / (1 + b/2B)). From 32 x 16 = 512 to 1024:
    // (1 + 2) / (1 + 1) = 1.5, e = 0.585 (pays); from 1024 to 2048: 2 / 1.5, e = 0.415.
    assert_eq!(l.stop_after, Some(32));
    assert!((l.elasticity.unwrap() - (2.0f64 / 1.5).log2()).abs() < 1e-12);
    assert_eq!(l.fastest_world_size, 128);
}

/// A step that slows with N (communication) stops paying earlier; a perfect one never.
#[test]
fn slower_steps_bring_the_limit_earlier() {
    let opts = [
        scale(1, 16, 1, 1.0),
        scale(2, 16, 1, 1.0),
        scale(4, 16, 1, 1.8),
    ];
    let t = time_across_world_sizes(&opts, 1e6, None, None);
    // Far below B_noise the updates halve per doubling; 1 -> 2 pays (e = 1), 2 -> 4:
    // T falls by 2 / 1.8, e = log2(1.111) = 0.152.
    let l = scaling_limit(&t).unwrap();
    assert_eq!(l.stop_after, Some(2));
    assert_eq!(
        l.fastest_world_size, 4,
        "still fastest, at 1.8x the device-hours for 1.1x the speed"
    );
    let perfect = time_across_world_sizes(&opts[..2], 1e6, None, None);
    assert_eq!(scaling_limit(&perfect).unwrap().stop_after, None);
    assert_eq!(scaling_limit(&[]), None);
}
