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
    // The named world size is the largest whose global batch is within B_noise.
    let within = table
        .iter()
        .filter(|r| r["global_batch"].as_f64().unwrap() <= b_noise)
        .map(|r| r["world_size"].as_u64().unwrap())
        .max();
    assert_eq!(w["within_b_noise"].as_u64(), within);

    let out = common::batchfit()
        .args(["advise", "--gpus", "1,2,4,8", "--noise-steps", "50"])
        .args(["--batches", "16,64,256", "--time-cap", "0.2"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("ACROSS WORLD SIZES"), "{text}");
    assert!(text.contains("B_noise"), "{text}");
}
