//! The data as batchfit read it: its profile and what to fix, for `advise`
//! and `noise` (text and JSON).

use crate::{prose, thousands};
use batchfit_tune::dataset::{DataProfile, TargetProfile};
use serde::Serialize;

/// A finding on the data: its code and its sentence.
#[derive(Serialize)]
pub struct DataFindingJson {
    pub code: &'static str,
    pub message: String,
}

/// The profile with its findings.
#[derive(Serialize)]
pub struct DataJson<'a> {
    #[serde(flatten)]
    pub profile: &'a DataProfile,
    pub findings: Vec<DataFindingJson>,
}

impl<'a> DataJson<'a> {
    pub fn new(profile: &'a DataProfile) -> Self {
        DataJson {
            profile,
            findings: profile
                .findings()
                .iter()
                .map(|f| DataFindingJson {
                    code: f.code(),
                    message: prose::data_finding(f, &profile.class_names),
                })
                .collect(),
        }
    }
}

/// Class names the DATA section lists (the JSON has them all).
const CLASS_NAMES_SHOWN: usize = 12;

/// The DATA section: what was read, then each finding with its fix.
pub fn section(p: &DataProfile) -> String {
    let targets = match &p.targets {
        TargetProfile::Classes { counts } => format!("{} classes", counts.len()),
        TargetProfile::Labels { counts, blank } => {
            format!("label sequences of {} classes, blank {blank}", counts.len())
        }
        TargetProfile::Values(v) => format!("targets {:.4} ± {:.4}", v.mean, v.std),
    };
    let mut out = format!(
        "\nDATA ({} rows, {} numeric features, |x| up to {:.4}, {targets}{})\n",
        thousands(p.rows as u64),
        p.features,
        p.max_abs,
        if p.standardized {
            "; batchfit's runs trained on it standardised (--standardize)"
        } else {
            ""
        }
    );
    if !p.class_names.is_empty() {
        let mut named: Vec<String> = p
            .class_names
            .iter()
            .take(CLASS_NAMES_SHOWN)
            .enumerate()
            .map(|(i, n)| format!("{i} {n}"))
            .collect();
        if p.class_names.len() > CLASS_NAMES_SHOWN {
            named.push("...".into());
        }
        out.push_str(&format!(
            "  classes named in the label column, numbered in sorted order: {}\n",
            named.join(", ")
        ));
    }
    let findings = p.findings();
    if findings.is_empty() {
        out.push_str("  nothing to fix\n");
    }
    for f in &findings {
        out.push_str(&format!("  - {}\n", prose::data_finding(f, &p.class_names)));
    }
    out
}
