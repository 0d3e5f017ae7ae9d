//! `sweep --verify ADVICE.json`: the check a careful user runs before a long
//! training. The advice file says what was predicted and under which
//! assumptions (model, data, learning-rate rule, target); the sweep trains the
//! recommended batch and its neighbours exactly so, and `batchfit_tune::verify`
//! puts predicted beside measured.

use crate::noise::{DataSource, LossChoice, LossRequest};
use crate::{Error, Result};
use batchfit_tune::basis::PredictionBasis;
use batchfit_tune::decide::{AdviceInputs, Learning};
use batchfit_tune::device::DeviceSpec;
use batchfit_tune::target::TimeToTarget;
use batchfit_tune::verify::CheckedAdvice;
use serde::Deserialize;
use std::path::Path;

/// The parts of `advise --json` a check needs.
#[derive(Deserialize)]
struct AdviceFile {
    kind: String,
    inputs: AdviceInputs,
    prediction: Option<PredictionBasis>,
    time_to_target: Vec<TimeToTarget>,
    recommendations: Vec<RecommendedBatch>,
    /// Absent in documents written before it.
    #[serde(default)]
    learning: Option<Learning>,
    /// One per noise run where there were several (absent before them).
    #[serde(default)]
    noise_seeds: Vec<SeedOf>,
    /// The rate checks, each trained from `inputs.seed` up (absent before them).
    #[serde(default)]
    rate_checks: Vec<SeedsOf>,
}

#[derive(Deserialize)]
struct SeedOf {
    seed: u64,
}

#[derive(Deserialize)]
struct SeedsOf {
    /// Absent where the check trained one seed.
    #[serde(default = "one")]
    seeds: u64,
}

fn one() -> u64 {
    1
}

#[derive(Deserialize)]
struct RecommendedBatch {
    device: DeviceSpec,
    recommended_batch: Option<u64>,
    /// Absent in documents before it.
    #[serde(default)]
    tied_batches: Vec<u64>,
}

/// Reads `advise --json` output; exit 2 when it is not one or has no
/// time-to-target prediction.
pub fn read_advice(path: &Path) -> Result<CheckedAdvice> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::input_because(format!("--verify {}", path.display()), e))?;
    parse_advice(path, &text)
}

/// [`read_advice`] on the text of the file `path`.
pub fn parse_advice(path: &Path, text: &str) -> Result<CheckedAdvice> {
    let name = path.display().to_string();
    let file: AdviceFile = serde_json::from_str(text).map_err(|e| {
        Error::input_because(
            format!("--verify {name}: not the JSON of `batchfit advise --json`"),
            e,
        )
    })?;
    if file.kind != "advise" {
        return Err(Error::input(format!(
            "--verify {name}: a `{}` document; give the JSON of `batchfit advise --json`",
            file.kind
        )));
    }
    let Some(basis) = file.prediction else {
        if let Some(l) = file.learning.filter(|l| !l.learned) {
            return Err(Error::input(format!(
                "--verify {name}: the advice predicts no time to target: its noise run learned nothing from the inputs (loss {:.4}, no lower than {:.4} for ignoring them); scale the inputs (--standardize) or lower --lr, and advise again",
                l.run_loss, l.prior_loss
            )));
        }
        return Err(Error::input(format!(
            "--verify {name}: the advice predicts no time to target (it needs the noise run: --data, a learning rate above 0, --noise-steps above 0)"
        )));
    };
    check_basis(&name, &basis)?;
    let Some((device, recommended, tied)) = file
        .recommendations
        .iter()
        .find_map(|r| {
            r.recommended_batch
                .map(|b| (r.device, b, r.tied_batches.clone()))
        })
        .filter(|&(_, b, _)| b > 0)
    else {
        return Err(Error::input(format!(
            "--verify {name}: the advice recommends no batch"
        )));
    };
    let mut update_s: Vec<(u64, f64)> = file
        .time_to_target
        .iter()
        .filter(|t| t.option.device == device && t.option.accumulation == 1)
        .filter(|t| t.option.micro_batch > 0)
        .map(|t| (t.option.micro_batch, t.option.update_s()))
        .collect();
    update_s.sort_by_key(|p| p.0);
    let first_seed = first_free_seed(file.inputs.seed, &file.noise_seeds, &file.rate_checks);
    Ok(CheckedAdvice {
        path: name,
        inputs: file.inputs,
        basis,
        device,
        recommended,
        tied,
        update_s,
        first_seed,
    })
}

/// The numbers a verification trains with, as `advise` would have written
/// them: a positive rate at a positive batch, a finite target, a curve with
/// positive S_min and B_noise. An edited file with a rate of -5 would
/// otherwise train at -10 (the flags that set them refuse such values).
fn check_basis(name: &str, b: &PredictionBasis) -> Result {
    let bad = if let Some(why) = b.lr.invalid() {
        Some(format!("prediction.lr: {why}"))
    } else if !b.target_loss.is_finite() {
        Some(format!(
            "prediction.target_loss {} is not a loss",
            b.target_loss
        ))
    } else if ![b.curve.s_min, b.curve.b_noise]
        .iter()
        .all(|v| v.is_finite() && *v > 0.0)
    {
        Some("prediction.curve: S_min and B_noise must be positive".to_string())
    } else {
        None
    };
    match bad {
        Some(why) => Err(Error::input(format!(
            "--verify {name}: {why}; give the file `batchfit advise --json` wrote"
        ))),
        None => Ok(()),
    }
}

/// The first seed none of the advice's trainings used: the noise run (its
/// seed, or one per seed), then each rate check from the same seed up.
fn first_free_seed(base: u64, noise_seeds: &[SeedOf], checks: &[SeedsOf]) -> u64 {
    noise_seeds
        .iter()
        .map(|s| s.seed + 1)
        .chain(checks.iter().map(|c| base + c.seeds))
        .fold(base + 1, u64::max)
}

/// The model and data the advice measured, where the command line names none.
pub fn data_source(advice: &CheckedAdvice, given: &DataSource) -> Result<DataSource> {
    let loss = match (&given.loss, &advice.inputs.loss) {
        (Some(l), _) => Some(*l),
        (None, Some(s)) => Some(LossRequest {
            choice: LossChoice::parse(s).ok_or_else(|| {
                Error::input(format!("--verify {}: unknown loss `{s}`", advice.path))
            })?,
            class_axis: advice.inputs.class_axis,
            blank: advice.inputs.blank,
        }),
        (None, None) => None,
    };
    Ok(DataSource {
        data: given.data.clone().or_else(|| advice.inputs.data.clone()),
        labels: given
            .labels
            .clone()
            .or_else(|| advice.inputs.labels.clone()),
        label_col: given
            .label_col
            .clone()
            .or_else(|| advice.inputs.label_col.clone()),
        loss,
        standardize: given.standardize || advice.inputs.standardize,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The seeds of an advice's trainings as its JSON has them: `--seed`,
    /// the noise runs' seeds, each rate check's count (absent: one).
    fn seeds_of(json: &str) -> u64 {
        #[derive(Deserialize)]
        struct Parts {
            inputs: Seed,
            #[serde(default)]
            noise_seeds: Vec<SeedOf>,
            #[serde(default)]
            rate_checks: Vec<SeedsOf>,
        }
        #[derive(Deserialize)]
        struct Seed {
            #[serde(default)]
            seed: u64,
        }
        let p: Parts = serde_json::from_str(json).unwrap();
        first_free_seed(p.inputs.seed, &p.noise_seeds, &p.rate_checks)
    }

    #[test]
    fn the_check_trains_after_every_seed_the_advice_trained() {
        // Before the fields: one noise run at seed 0.
        assert_eq!(seeds_of(r#"{"inputs": {}}"#), 1);
        // Two noise runs, checks of one (absent) and three seeds.
        let json = r#"{"inputs": {"seed": 0}, "noise_seeds": [{"seed": 0}, {"seed": 1}],
            "rate_checks": [{}, {"seeds": 3}, {"seeds": 2}]}"#;
        assert_eq!(seeds_of(json), 3);
        // From --seed 7.
        let json = r#"{"inputs": {"seed": 7}, "rate_checks": [{"seeds": 2}]}"#;
        assert_eq!(seeds_of(json), 9);
    }
}
