//! `batchfit advise`: the recommendation, its JSON, and the HTML report.

mod common;

use common::{QUICK_ADVISE as QUICK, batchfit};
use scraper::{Html, Selector};

#[test]
fn advise_writes_a_self_contained_report_with_one_plot_per_figure() {
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("report.html");
    let out = batchfit()
        .arg("advise")
        .args(QUICK)
        .args(["--html", page.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("RECOMMENDATION") && text.contains("train with batch"),
        "{text}"
    );
    let html = std::fs::read_to_string(&page).unwrap();
    let doc = Html::parse_document(&html);
    let figures = doc.select(&Selector::parse("figure").unwrap()).count();
    let svgs = doc
        .select(&Selector::parse("figure > svg").unwrap())
        .count();
    // Throughput, memory, noise scale, time to target.
    assert_eq!((figures, svgs), (4, 4));
    let captions: Vec<String> = doc
        .select(&Selector::parse("figcaption").unwrap())
        .map(|c| c.text().collect())
        .collect();
    assert!(
        captions.iter().all(|c| {
            let c = c.to_lowercase();
            c.contains("measured") || c.contains("predicted")
        }),
        "{captions:?}"
    );
    assert_eq!(doc.select(&Selector::parse("script").unwrap()).count(), 0);
    assert!(
        !html.contains("src=\"http") && !html.contains("href=\"http"),
        "nothing external"
    );
    assert!(!dir.path().join("report.html.partial").exists());
}

#[test]
fn advise_json_has_the_recommendation_and_the_options() {
    let out = batchfit()
        .arg("advise")
        .args(QUICK)
        .args(["--ref-batch", "32", "--ref-lr", "0.001", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rec = &v["recommendations"][0];
    let b = rec["recommended_batch"].as_u64().unwrap();
    assert!([8, 32, 128].contains(&b));
    let lr = rec["learning_rate"].as_f64().unwrap();
    assert!(
        (lr - 0.001 * (b as f64 / 32.0).sqrt()).abs() < 1e-12,
        "square-root rule for Adam"
    );
    let options = v["time_to_target"].as_array().unwrap();
    assert_eq!(options.len(), 3);
    assert_eq!(options[0]["vs_best"].as_f64().unwrap(), 1.0);
    assert!(v["noise"]["b_simple"].as_f64().unwrap() > 0.0);
}

#[test]
fn html_into_a_missing_folder_is_bad_input_and_leaves_nothing() {
    batchfit()
        .args(["advise", "--html", "/nonexistent-dir/r.html"])
        .assert()
        .code(2);
}

/// `advise --gpus`: time to target across world sizes on the shipped digits,
/// and the world size past which the global batch exceeds B_noise.
#[test]
fn gpus_give_time_to_target_across_world_sizes() {
    let doc = common::json(&[
        "advise",
        "--gpus",
        "1,2,4,8",
        "--noise-steps",
        "50",
        "--batches",
        "16,64,256",
        "--time-cap",
        "0.2",
    ]);
    let w = &doc["world_sizes"];
    let table = w["table"].as_array().unwrap();
    let sizes: Vec<u64> = table
        .iter()
        .map(|r| r["world_size"].as_u64().unwrap())
        .collect();
    assert_eq!(sizes, [1, 2, 4, 8]);
    let b_noise = w["b_noise"].as_f64().unwrap();
    for r in table {
        let global = r["global_batch"].as_u64().unwrap();
        assert_eq!(
            global,
            r["world_size"].as_u64().unwrap() * r["micro_batch"].as_u64().unwrap()
        );
        assert!([16, 64, 256].contains(&r["micro_batch"].as_u64().unwrap()));
        assert!(r["vs_best"].as_f64().unwrap() >= 1.0 - 1e-9);
    }
    // The table's S(B) is the prediction's curve, on the rows it was drawn from.
    let curve = &doc["prediction"]["curve"];
    assert_eq!(w["b_noise"].as_f64(), curve["b_noise"].as_f64());
    let rows = curve["rows"].as_f64().expect("digits' training rows");
    // The named world size is the largest whose global batch is within the
    // critical batch on those rows, where S(B) is twice S_min.
    // Trained by Adam, the noise term is (B_noise / B) sqrt(1 - B/N): the
    // root of B^2 + (B_noise^2 / N) B - B_noise^2.
    assert_eq!(curve["adaptive"].as_bool(), Some(true), "{curve}");
    let critical = w["critical_batch"].as_f64().unwrap();
    let a = b_noise * b_noise / rows;
    let want = (-a + (a * a + 4.0 * b_noise * b_noise).sqrt()) / 2.0;
    assert!(
        (critical - want).abs() < 1e-9 * want,
        "{critical} vs {want}"
    );
    let within = table
        .iter()
        .filter(|r| r["global_batch"].as_f64().unwrap() <= critical)
        .map(|r| r["world_size"].as_u64().unwrap())
        .max();
    assert_eq!(w["within_critical_batch"].as_u64(), within);
    for r in table {
        let global = r["global_batch"].as_f64().unwrap();
        // Adam's form; a global batch of every row has no noise: S_min.
        let want = 1.0 + b_noise / global * (1.0 - global / rows).max(0.0).sqrt();
        let got = r["updates_vs_min"].as_f64().unwrap();
        assert!(
            (got - want).abs() < 1e-9 * want,
            "{got} against {want} at {global}"
        );
        let steps = curve["s_min"].as_f64().unwrap() * want;
        assert!((r["updates"].as_f64().unwrap() - steps).abs() < 1e-6 * steps);
    }

    let out = common::batchfit()
        .args(["advise", "--gpus", "1,2,4,8", "--noise-steps", "50"])
        .args(["--batches", "16,64,256", "--time-cap", "0.2"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("ACROSS WORLD SIZES"), "{text}");
    assert!(text.contains("B_noise"), "{text}");
}

/// An 8-16-2 MLP for the rows of [`unscaled_blobs`] and [`uninformative`].
fn two_class_mlp(dir: &std::path::Path) -> String {
    let model = dir.join("blobs.toml");
    std::fs::write(
        &model,
        "[[input]]\nname = \"x\"\nshape = [8]\n\
         [[layer]]\nname = \"fc1\"\nop = \"linear\"\nout_features = 16\n\
         [[layer]]\nname = \"relu\"\nop = \"relu\"\n\
         [[layer]]\nname = \"fc2\"\nop = \"linear\"\nout_features = 2\n\
         [loss]\nkind = \"cross_entropy\"\n",
    )
    .unwrap();
    model.to_str().unwrap().to_string()
}

/// 400 rows of two classes whose 8 features sit around ±1 times 300 (raw
/// units), a deterministic hash for the noise, and an 8-16-2 MLP for them.
fn unscaled_blobs(dir: &std::path::Path) -> (String, String) {
    let model = two_class_mlp(dir);
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut noise = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64 - 0.5
    };
    let rows: String = (0..400)
        .map(|i| {
            let class = i % 2;
            let sign = if class == 0 { -1.0 } else { 1.0 };
            let features: Vec<String> = (0..8)
                .map(|_| format!("{:.3}", 300.0 * (0.5 * sign + noise())))
                .collect();
            format!("{},{class}\n", features.join(","))
        })
        .collect();
    let data = dir.join("blobs.csv");
    std::fs::write(&data, rows).unwrap();
    (model, data.to_str().unwrap().to_string())
}

/// 400 rows whose 8 features are the same in every row, a quarter of them
/// class 1: nothing to learn beyond the class frequencies, so no training
/// can end below their entropy.
fn uninformative(dir: &std::path::Path) -> (String, String) {
    let rows: String = (0..400)
        .map(|i| format!("{}{}\n", "0.5,".repeat(8), u8::from(i % 4 == 0)))
        .collect();
    let data = dir.join("flat.csv");
    std::fs::write(&data, rows).unwrap();
    (two_class_mlp(dir), data.to_str().unwrap().to_string())
}

fn advise_json(args: &[&str]) -> serde_json::Value {
    let out = batchfit()
        .arg("advise")
        .args(args)
        .args([
            "--noise-steps",
            "60",
            "--batches",
            "8,32,128",
            "--time-cap",
            "0.2",
        ])
        .args(["--warmup", "1", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn unscaled_data_is_named_with_its_fix_and_standardize_trains_on_it_scaled() {
    let dir = tempfile::tempdir().unwrap();
    let (model, data) = unscaled_blobs(dir.path());
    let codes = |v: &serde_json::Value| -> Vec<String> {
        v["data_profile"]["findings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["code"].as_str().unwrap().to_string())
            .collect()
    };
    let raw = advise_json(&[&model, "--data", &data]);
    assert!(
        codes(&raw).contains(&"unscaled_inputs".to_string()),
        "{raw}"
    );
    assert_eq!(raw["data_profile"]["rows"], 400);
    assert_eq!(raw["inputs"]["standardize"], false);
    let scaled = advise_json(&[&model, "--data", &data, "--standardize"]);
    assert_eq!(scaled["inputs"]["standardize"], true);
    assert_eq!(scaled["data_profile"]["standardized"], true);
    assert!(
        !codes(&scaled).contains(&"unscaled_inputs".to_string()),
        "{scaled}"
    );
    let learning = &scaled["learning"];
    assert_eq!(learning["learned"], true, "{learning}");
    // Row i is class i % 2: the prior is the entropy over the fixed rows.
    let prior = fixed_rows_entropy(400, |i| i % 2 == 1);
    assert!((learning["prior_loss"].as_f64().unwrap() - prior).abs() < 1e-9);
    assert_eq!(scaled["target_loss"], learning["run_loss"]);
}

/// The entropy of two classes over the fixed rows of a data set of `rows`
/// rows (those the noise run's loss is evaluated on: advise trains on the
/// default split's training rows), `class_one(i)` saying row i's class.
fn fixed_rows_entropy(rows: usize, class_one: impl Fn(usize) -> bool) -> f64 {
    let fixed = common::advice_fixed_rows(rows);
    let p = fixed.iter().filter(|&&i| class_one(i)).count() as f64 / fixed.len() as f64;
    -(p * p.ln() + (1.0 - p) * (1.0 - p).ln())
}

/// 40 rows, under one big batch of the default estimator (8 x 16): advise
/// trains on the 36 rows a training holds (sweep holds 4 out), so the noise
/// run measures with micro-batches of 36 / 8 = 4 and says so, and the curve
/// stops at 36, so `sweep --verify` can train every batch the advice names
/// (iris, 150 rows: advise named 150 and the check refused it).
#[test]
fn a_data_set_smaller_than_one_big_batch_shrinks_the_noise_runs_micro_batches() {
    let dir = tempfile::tempdir().unwrap();
    let (model, data) = unscaled_blobs(dir.path());
    let small = dir.path().join("small.csv");
    let rows: String = std::fs::read_to_string(&data)
        .unwrap()
        .lines()
        .take(40)
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&small, rows).unwrap();
    let out = batchfit()
        .arg("advise")
        .args([&model, "--data", small.to_str().unwrap(), "--standardize"])
        .args(["--noise-steps", "60", "--time-cap", "0.2", "--warmup", "1"])
        .arg("--json")
        .output()
        .unwrap();
    let v = common::document(out);
    assert_eq!(v["b_small_asked"], 16, "the default --b-small");
    assert_eq!(
        (v["noise"]["b_small"].as_u64(), v["noise"]["b_big"].as_u64()),
        (Some(4), Some(32))
    );
    let batches: Vec<u64> = v["devices"][0]["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["batch"].as_u64().unwrap())
        .collect();
    assert_eq!(batches.iter().max(), Some(&36), "{batches:?}");
    let named = v["recommendations"][0]["recommended_batch"]
        .as_u64()
        .unwrap();
    assert!(named <= 36, "named {named}");
    let advice = dir.path().join("advice.json");
    std::fs::write(&advice, v.to_string()).unwrap();
    let out = batchfit()
        .args([
            "sweep",
            "--verify",
            advice.to_str().unwrap(),
            "--seeds",
            "1",
        ])
        .args(["--batches", &named.to_string()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("training rows"), "{err}");
    assert!(out.status.success(), "{err}");
}

/// Inputs that carry nothing: the noise run ends no lower than the class
/// frequencies' entropy, so the advice names the knee by throughput, predicts
/// no time to target, and `sweep --verify` refuses it saying why.
#[test]
fn a_run_that_learns_nothing_from_the_inputs_predicts_no_time_to_target() {
    let dir = tempfile::tempdir().unwrap();
    let (model, data) = uninformative(dir.path());
    let v = advise_json(&[&model, "--data", &data]);
    let learning = &v["learning"];
    assert_eq!(learning["learned"], false, "{learning}");
    let prior = fixed_rows_entropy(400, |i| i % 4 == 0);
    assert!((learning["prior_loss"].as_f64().unwrap() - prior).abs() < 1e-9);
    assert!(learning["run_loss"].as_f64().unwrap() >= prior);
    assert!(v["target_loss"].is_null() && v["prediction"].is_null());
    assert_eq!(v["time_to_target"].as_array().unwrap().len(), 0);
    let rec = &v["recommendations"][0];
    assert_eq!(rec["reason_code"], "knee");
    assert_eq!(rec["recommended_batch"], rec["knee_batch"]);
    let advice = dir.path().join("advice.json");
    std::fs::write(&advice, v.to_string()).unwrap();
    let out = batchfit()
        .args(["sweep", "--verify", advice.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("learned nothing from the inputs"), "{err}");
}

#[test]
fn advise_pools_two_noise_runs_and_checks_the_rate_from_the_runs_own_batch() {
    let v = advise_json(&[]);
    let seeds = v["noise_seeds"].as_array().unwrap();
    assert_eq!(seeds.len(), 2, "two noise runs by default");
    assert_eq!(
        (seeds[0]["seed"].as_u64(), seeds[1]["seed"].as_u64()),
        (Some(0), Some(1))
    );
    let checks = v["rate_checks"].as_array().unwrap();
    // The reference first: the noise run's own batch at its own rate.
    assert_eq!(checks[0]["batch"], v["noise"]["b_big"], "{checks:?}");
    assert_eq!(checks[0]["rule_rate"], true);
    let recommended = v["recommendations"][0]["recommended_batch"]
        .as_u64()
        .unwrap();
    assert!(
        checks
            .iter()
            .any(|c| c["batch"].as_u64() == Some(recommended)),
        "the recommended batch {recommended} was checked: {checks:?}"
    );
    let one = advise_json(&["--noise-seeds", "1"]);
    assert_eq!(one["noise_seeds"].as_array().unwrap().len(), 0);
}
