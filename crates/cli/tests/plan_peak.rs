//! The CPU plan held to the engine's measured peak, so a change to a CPU kernel
//! (`crates/engine/src/cpu/`) cannot drift from its rule
//! (`crates/plan/src/rules/burn/`): three zoo models whose steps run through
//! different kernel families (dense layers; convolution, pooling and dense;
//! the fused LSTM and CTC), each at two batches, planned within 5 % of the peak
//! the counting allocator measured.

mod common;

use common::json;

/// The plan's error at each batch `probe` measured, percent.
fn plan_errors(model: &str, extra: &[&str]) -> Vec<(u64, f64)> {
    let mut args = vec![
        "probe",
        model,
        "--batches",
        "8,64",
        "--threads",
        "2",
        "--warmup",
        "1",
        "--time-cap",
        "0.3",
    ];
    args.extend_from_slice(extra);
    let doc = json(&args);
    doc["devices"][0]["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["batch"].as_u64().unwrap(),
                p["plan_error_pct"].as_f64().expect("a measured peak"),
            )
        })
        .collect()
}

#[test]
fn the_cpu_plan_is_within_5_percent_of_the_measured_peak() {
    for (model, extra) in [
        ("zoo:mnist-mlp", &[][..]),
        ("zoo:seed2-dual", &[][..]),
        ("zoo:rnn-tutorial", &["--seq-len", "50"][..]),
    ] {
        let errors = plan_errors(model, extra);
        assert_eq!(errors.len(), 2, "{model}: {errors:?}");
        for (batch, error) in errors {
            assert!(
                error.abs() <= 5.0,
                "{model} at batch {batch}: planned {error:+.1} % from the measured peak"
            );
        }
    }
}
