//! `sweep --verify ADVICE.json`: the check a careful user runs before a long
//! training. The advice file says what was predicted and under which
//! assumptions (model, data, learning-rate rule, target); the sweep trains the
//! recommended batch and its neighbours exactly so, and puts predicted beside
//! measured.

use crate::noise::{DataSource, LossChoice};
use crate::{Error, Result};
use batchfit_report::advise::AdviceInputs;
use batchfit_report::sweep::{BatchSummary, SweepRun, VerifyReport};
use batchfit_tune::target::{PredictionBasis, TimeToTarget};
use batchfit_tune::verify::{Measured, Predicted, verify};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// The parts of `advise --json` a check needs.
#[derive(Deserialize)]
struct AdviceFile {
    kind: String,
    inputs: AdviceInputs,
    prediction: Option<PredictionBasis>,
    time_to_target: Vec<TimeToTarget>,
    recommendations: Vec<RecommendedBatch>,
}

#[derive(Deserialize)]
struct RecommendedBatch {
    device: String,
    recommended_batch: Option<u64>,
}

/// An advice to check.
#[derive(Clone, Debug)]
pub struct Advice {
    pub path: PathBuf,
    pub inputs: AdviceInputs,
    pub basis: PredictionBasis,
    /// The device of the first recommendation: the one checked.
    pub device: String,
    pub recommended: u64,
    /// Measured seconds per update at each batch of the table on that device
    /// (no accumulation), ascending by batch.
    pub update_s: Vec<(u64, f64)>,
}

/// Reads `advise --json` output; exit 2 when it is not one or has no
/// time-to-target prediction.
pub fn read_advice(path: &Path) -> Result<Advice> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::input_because(format!("--verify {}", path.display()), e))?;
    parse_advice(path, &text)
}

/// [`read_advice`] on the text of the file `path`.
pub fn parse_advice(path: &Path, text: &str) -> Result<Advice> {
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
        return Err(Error::input(format!(
            "--verify {name}: the advice predicts no time to target (it needs the noise run: --data, a learning rate above 0, --noise-steps above 0)"
        )));
    };
    let Some((device, recommended)) = file
        .recommendations
        .iter()
        .find_map(|r| r.recommended_batch.map(|b| (r.device.clone(), b)))
        .filter(|&(_, b)| b > 0)
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
    Ok(Advice {
        path: path.to_path_buf(),
        inputs: file.inputs,
        basis,
        device,
        recommended,
        update_s,
    })
}

impl Advice {
    /// The batches checked by default: the recommended one and its neighbours
    /// in the advice's table.
    pub fn default_batches(&self) -> Vec<u64> {
        let batches: Vec<u64> = self.update_s.iter().map(|p| p.0).collect();
        match batches.iter().position(|&b| b == self.recommended) {
            Some(i) => batches[i.saturating_sub(1)..(i + 2).min(batches.len())].to_vec(),
            None => vec![self.recommended],
        }
    }

    /// The model and data the advice measured, where the command line names none.
    pub fn data_source(&self, given: &DataSource) -> Result<DataSource> {
        let loss = match (&given.loss, &self.inputs.loss) {
            (Some(l), _) => Some(*l),
            (None, Some(s)) => Some(LossChoice::parse(s).ok_or_else(|| {
                Error::input(format!(
                    "--verify {}: unknown loss `{s}`",
                    self.path.display()
                ))
            })?),
            (None, None) => None,
        };
        Ok(DataSource {
            data: given.data.clone().or_else(|| self.inputs.data.clone()),
            labels: given.labels.clone().or_else(|| self.inputs.labels.clone()),
            label_col: given.label_col.or(self.inputs.label_col),
            loss,
        })
    }

    /// Predicted steps, and seconds where the advice measured the batch's step.
    pub fn predicted(&self, batch: u64) -> Predicted {
        let steps = self.basis.curve.steps(batch as f64);
        Predicted {
            batch,
            steps,
            seconds: self
                .update_s
                .iter()
                .find(|p| p.0 == batch)
                .map(|p| p.1 * steps),
        }
    }

    /// Epochs enough for three times the predicted steps at `batch` from `rows` rows.
    pub fn epochs_for(&self, batch: u64, rows: usize) -> u32 {
        let per_epoch = (rows as u64 / batch.max(1)).max(1) as f64;
        (3.0 * self.predicted(batch).steps / per_epoch).ceil() as u32
    }
}

/// The report of a verifying sweep: each batch's predicted figures beside
/// the first device's runs.
pub fn report(advice: &Advice, per_batch: &[BatchSummary], runs: &[SweepRun]) -> VerifyReport {
    let predicted: Vec<Predicted> = per_batch
        .iter()
        .map(|b| advice.predicted(b.batch))
        .collect();
    let measured: Vec<Measured> = per_batch
        .iter()
        .map(|b| {
            let of: Vec<&SweepRun> = runs.iter().filter(|r| r.record.batch == b.batch).collect();
            Measured {
                batch: b.batch,
                runs: of.len(),
                steps: of.iter().filter_map(|r| r.steps_to_target).collect(),
                seconds: of.iter().filter_map(|r| r.seconds_to_target).collect(),
            }
        })
        .collect();
    let (rows, verdict) = verify(&predicted, &measured, advice.recommended);
    VerifyReport {
        advice: advice.path.display().to_string(),
        device: advice.device.clone(),
        basis: advice.basis.clone(),
        rows,
        verdict,
    }
}
