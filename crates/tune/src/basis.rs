//! What a time-to-target prediction rests on: the learning-rate rule every
//! batch is assumed to train with, the target loss, S(B), and where S(B) came
//! from: the stretches of a noise run, the noise run's end value alone, or a
//! finished sweep's measured steps. [`prediction_basis`] draws it from a noise
//! run; [`measured_basis`] from a sweep.

use crate::lr::{LrRule, LrScaling};
use crate::noise::NoiseRun;
use crate::target::StepsCurve;
use crate::trajectory::{RunPoint, Segment, trajectory};
use serde::{Deserialize, Serialize};

/// The prediction's assumptions and S(B).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(into = "BasisRecord", from = "BasisRecord")]
pub struct PredictionBasis {
    /// `lr(B) = rule(ref_lr, min(B, cap) / ref_batch)`.
    pub lr: LrScaling,
    /// Epochs of linear warm-up to that rate (0: none).
    pub warmup_epochs: f64,
    /// The loss the prediction is for.
    pub target_loss: f64,
    /// S(B): S_min and the effective B_noise.
    pub curve: StepsCurve,
    /// Where the curve came from.
    pub source: BasisSource,
    /// The noise run's own B_noise where the rate checks measured less
    /// speed-up than it predicts and `curve` was refitted to them
    /// ([`PredictionBasis::held_to_checks`]); `None`: the curve is the run's.
    pub b_noise_run: Option<f64>,
    /// The mean updates the rate checks took at the noise run's own batch and
    /// rate, which `curve` is drawn through after the checks; `None`: through
    /// the run's own updates.
    pub reference_updates: Option<f64>,
}

/// Where S(B) came from. One time of an update is the same in every kind
/// ([`crate::probe::DeviceProbe::update_points`]).
#[derive(Clone, Debug, PartialEq)]
pub enum BasisSource {
    /// S(B) = Σ ΔS_min,i (1 + B_i/B) over the stretches of a noise run, each
    /// with its own noise scale (McCandlish et al. 2018, section 2.3).
    Stretches {
        run: NoiseRunAt,
        /// Updates the run took to the target.
        updates_to_target: f64,
        /// The noise scale at the end of the run, for comparison.
        b_simple_end: Option<f64>,
        segments: Vec<Segment>,
        /// The estimates are of the step Adam takes, g / (sqrt(v) + ε).
        preconditioned: bool,
        /// B_eff's 90 % band over resamples of the stretches' measurements
        /// (high infinite: unbounded).
        band: (f64, f64),
    },
    /// S(B) through the noise run's updates with its final noise scale: its
    /// stretches could not be measured.
    EndValue {
        run: NoiseRunAt,
        updates: f64,
        b_simple_end: f64,
    },
    /// S_min and B_noise fitted to the steps to target of a finished sweep.
    Sweep(SweepFit),
}

/// The batch and learning rate a noise run trained at.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NoiseRunAt {
    pub batch: u64,
    pub lr: f64,
}

/// The sweep a measured basis was fitted to.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SweepFit {
    /// Runs whose steps the fit used.
    pub runs: usize,
    /// The sweep's `--out` folder.
    pub dir: String,
    pub batches: Vec<u64>,
    /// The data the sweep trained on.
    pub data: String,
}

impl PredictionBasis {
    /// The steps were measured by real trainings (a sweep), not predicted.
    pub fn measured(&self) -> bool {
        matches!(self.source, BasisSource::Sweep(_))
    }

    /// The noise run's stretches, empty when the curve came from one value.
    pub fn segments(&self) -> &[Segment] {
        match &self.source {
            BasisSource::Stretches { segments, .. } => segments,
            _ => &[],
        }
    }

    /// The batch and rate of the noise run, when one drew the curve.
    pub fn run(&self) -> Option<NoiseRunAt> {
        match self.source {
            BasisSource::Stretches { run, .. } | BasisSource::EndValue { run, .. } => Some(run),
            BasisSource::Sweep(_) => None,
        }
    }

    /// Updates the run took to the target.
    pub fn updates_to_target(&self) -> Option<f64> {
        match self.source {
            BasisSource::Stretches {
                updates_to_target, ..
            } => Some(updates_to_target),
            BasisSource::EndValue { updates, .. } => Some(updates),
            BasisSource::Sweep(_) => None,
        }
    }

    /// B_simple at the end of the noise run.
    pub fn b_simple_end(&self) -> Option<f64> {
        match self.source {
            BasisSource::Stretches { b_simple_end, .. } => b_simple_end,
            BasisSource::EndValue { b_simple_end, .. } => Some(b_simple_end),
            BasisSource::Sweep(_) => None,
        }
    }

    /// B_noise's 90 % band, where the basis measured one (`None` high:
    /// unbounded); after [`PredictionBasis::held_to_checks`], the run's band
    /// scaled with it.
    pub fn band(&self) -> Option<(f64, Option<f64>)> {
        let scale = self.b_noise_run.map_or(1.0, |b| self.curve.b_noise / b);
        match self.source {
            BasisSource::Stretches { band: (lo, hi), .. } => {
                Some((lo * scale, hi.is_finite().then_some(hi * scale)))
            }
            _ => None,
        }
    }

    /// The curve refitted to what the rate checks measured: through
    /// `reference`, the mean updates of the checks at the run's own batch and
    /// rate (else the run's own updates there), with the noise scale
    /// `b_noise` they measured (else the curve's). The checks train as a
    /// training of the advice does, from several seeds; the run's own updates
    /// are one run's first passage to the level it ends at, which it reaches
    /// only near its end while another seed, fluctuating around that level,
    /// crosses it earlier (breast-cancer at 128: the run 146, the checks and
    /// `sweep --verify` 82 ± 60). A basis without a run is returned as it is.
    pub fn held_to_checks(
        mut self,
        b_noise: Option<f64>,
        reference: Option<f64>,
    ) -> PredictionBasis {
        let Some(run) = self.run() else {
            return self;
        };
        let at = run.batch as f64;
        let reference = reference.filter(|r| r.is_finite() && *r > 0.0);
        let anchor = reference.unwrap_or_else(|| self.curve.steps(at));
        if b_noise.is_some() {
            self.b_noise_run = Some(self.b_noise_run.unwrap_or(self.curve.b_noise));
        }
        let b_noise = b_noise.unwrap_or(self.curve.b_noise);
        self.curve = StepsCurve::through(anchor, at, b_noise, self.curve.rows);
        self.reference_updates = reference.or(self.reference_updates);
        self
    }

    /// The kind, as JSON's `method_code` writes it.
    pub fn method_code(&self) -> MethodCode {
        match self.source {
            BasisSource::Stretches { .. } => MethodCode::Stretches,
            BasisSource::EndValue { .. } => MethodCode::EndValue,
            BasisSource::Sweep(_) => MethodCode::SweepFit,
        }
    }
}

/// How S(B) was obtained, as a code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MethodCode {
    Stretches,
    EndValue,
    SweepFit,
}

/// The basis as JSON writes it: the flat fields of every earlier document,
/// with codes beside the prose the report adds (`method`, `step_time`).
#[derive(Clone, Debug, Serialize, Deserialize)]
struct BasisRecord {
    lr: LrScaling,
    warmup_epochs: f64,
    measured: bool,
    run_batch: Option<u64>,
    run_lr: Option<f64>,
    target_loss: f64,
    updates_to_target: Option<f64>,
    curve: StepsCurve,
    b_simple_end: Option<f64>,
    segments: Vec<Segment>,
    /// Absent in documents written before the codes: read from the other fields.
    #[serde(default)]
    method_code: Option<MethodCode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    preconditioned: Option<bool>,
    /// B_noise's 90 % band (stretches only; high null: unbounded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    b_noise_low: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    b_noise_high: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sweep: Option<SweepFit>,
    /// The noise run's own B_noise when the rate checks refitted the curve.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    b_noise_run: Option<f64>,
    /// The checks' updates at the run's batch the curve is drawn through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reference_updates: Option<f64>,
    /// Read back from earlier documents (the method in words) to tell the
    /// preconditioned estimates apart; written by the report, not here.
    #[serde(default, skip_serializing)]
    method: Option<String>,
}

impl From<PredictionBasis> for BasisRecord {
    fn from(b: PredictionBasis) -> BasisRecord {
        let run = b.run();
        BasisRecord {
            lr: b.lr,
            warmup_epochs: b.warmup_epochs,
            measured: b.measured(),
            run_batch: run.map(|r| r.batch),
            run_lr: run.map(|r| r.lr),
            target_loss: b.target_loss,
            updates_to_target: b.updates_to_target(),
            curve: b.curve,
            b_simple_end: b.b_simple_end(),
            segments: b.segments().to_vec(),
            method_code: Some(b.method_code()),
            preconditioned: match b.source {
                BasisSource::Stretches { preconditioned, .. } => Some(preconditioned),
                _ => None,
            },
            b_noise_low: b.band().map(|(lo, _)| lo),
            b_noise_high: b.band().and_then(|(_, hi)| hi),
            b_noise_run: b.b_noise_run,
            reference_updates: b.reference_updates,
            sweep: match b.source {
                BasisSource::Sweep(s) => Some(s),
                _ => None,
            },
            method: None,
        }
    }
}

impl From<BasisRecord> for PredictionBasis {
    fn from(r: BasisRecord) -> PredictionBasis {
        let code = r.method_code.unwrap_or(if r.measured {
            MethodCode::SweepFit
        } else if r.segments.is_empty() {
            MethodCode::EndValue
        } else {
            MethodCode::Stretches
        });
        let run = NoiseRunAt {
            batch: r.run_batch.unwrap_or(0),
            lr: r.run_lr.unwrap_or(0.0),
        };
        let source = match code {
            MethodCode::Stretches => BasisSource::Stretches {
                run,
                updates_to_target: r.updates_to_target.unwrap_or(f64::NAN),
                b_simple_end: r.b_simple_end,
                segments: r.segments,
                preconditioned: r
                    .preconditioned
                    .unwrap_or_else(|| r.method.is_some_and(|m| m.contains("Adam"))),
                band: (
                    r.b_noise_low.unwrap_or(r.curve.b_noise),
                    r.b_noise_high.unwrap_or(f64::INFINITY),
                ),
            },
            MethodCode::EndValue => BasisSource::EndValue {
                run,
                updates: r.updates_to_target.unwrap_or(f64::NAN),
                b_simple_end: r.b_simple_end.unwrap_or(r.curve.b_noise),
            },
            MethodCode::SweepFit => BasisSource::Sweep(r.sweep.unwrap_or(SweepFit {
                runs: 0,
                dir: String::new(),
                batches: Vec::new(),
                data: String::new(),
            })),
        };
        PredictionBasis {
            lr: r.lr,
            warmup_epochs: r.warmup_epochs,
            target_loss: r.target_loss,
            curve: r.curve,
            source,
            b_noise_run: r.b_noise_run,
            reference_updates: r.reference_updates,
        }
    }
}

/// The noise run as a prediction: its target (the training loss it ended at:
/// the mean of its evaluations on the fixed training rows over its last 10 %
/// of updates) and S(B) summed over its stretches, each with its own noise
/// scale ([`trajectory`]); the end value alone when the stretches cannot be
/// measured. `None` at learning rate 0 (no run to a target) or without a
/// noise scale.
pub fn prediction_basis(
    n: &NoiseRun,
    rule: LrRule,
    reference: (u64, f64),
) -> Option<PredictionBasis> {
    prediction_basis_to(n, rule, reference, None)
}

/// [`prediction_basis`] to `target` instead of the run's final loss.
pub fn prediction_basis_to(
    n: &NoiseRun,
    rule: LrRule,
    reference: (u64, f64),
    target: Option<f64>,
) -> Option<PredictionBasis> {
    if n.lr <= 0.0 || n.history.is_empty() {
        return None;
    }
    let losses: Vec<(f64, f64)> = n
        .history
        .iter()
        .filter_map(|r| r.train_loss.map(|l| (r.step as f64, l)))
        .collect();
    let target = match target {
        Some(t) => t,
        None => crate::trajectory::final_level(&losses, n.history.len())?,
    };
    let points: Vec<RunPoint> = n
        .history
        .iter()
        .map(|r| RunPoint {
            updates: r.step as f64,
            g2_raw: r.g2_raw_preconditioned.unwrap_or(r.g2_raw),
            trace_raw: r.trace_raw_preconditioned.unwrap_or(r.trace_raw),
        })
        .collect();
    let run = NoiseRunAt {
        batch: n.b_big as u64,
        lr: n.lr,
    };
    let preconditioned = n.history.iter().any(|r| r.g2_raw_preconditioned.is_some());
    // The run drew its batches from these rows, as the trainings it predicts do.
    let rows = crate::target::rows_drawn_from(n.rows, n.optimizer);
    let (curve, source) = match trajectory(&points, &losses, n.b_big as f64, rows, target) {
        Some(t) => (
            t.curve(),
            BasisSource::Stretches {
                run,
                updates_to_target: t.updates_to_target,
                b_simple_end: n.b_simple,
                segments: t.segments,
                preconditioned,
                band: t.b_noise_band,
            },
        ),
        None => {
            let b = n.b_simple?;
            (
                StepsCurve::through(n.steps as f64, n.b_big as f64, b, rows),
                BasisSource::EndValue {
                    run,
                    updates: n.steps as f64,
                    b_simple_end: b,
                },
            )
        }
    };
    // The rate grows up to B_noise and is held there; never below the run's own
    // batch, whose rate the run trained with (so the rule contains the run).
    let cap = (curve.b_noise.round() as u64).max(n.b_big as u64);
    Some(PredictionBasis {
        lr: LrScaling {
            rule,
            ref_batch: reference.0,
            ref_lr: reference.1,
            cap_batch: Some(cap),
        },
        warmup_epochs: 0.0,
        target_loss: target,
        curve,
        source,
        b_noise_run: None,
        reference_updates: None,
    })
}

/// S(B) fitted to a finished sweep's steps to target, with the sweep's
/// learning-rate rule: the advice then rests on trainings, not on a prediction.
pub fn measured_basis(
    lr: LrScaling,
    warmup_epochs: f64,
    target_loss: f64,
    curve: StepsCurve,
    fit: SweepFit,
) -> PredictionBasis {
    PredictionBasis {
        lr,
        warmup_epochs,
        target_loss,
        curve,
        source: BasisSource::Sweep(fit),
        b_noise_run: None,
        reference_updates: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_basis_reads_back_what_it_wrote_and_what_earlier_documents_wrote() {
        let basis = PredictionBasis {
            lr: LrScaling {
                rule: LrRule::Sqrt,
                ref_batch: 16,
                ref_lr: 1e-3,
                cap_batch: Some(200),
            },
            warmup_epochs: 0.0,
            target_loss: 0.2,
            curve: StepsCurve {
                s_min: 50.0,
                b_noise: 200.0,
                rows: crate::target::sgd_rows(1000.0),
            },
            source: BasisSource::EndValue {
                run: NoiseRunAt {
                    batch: 128,
                    lr: 2e-3,
                },
                updates: 200.0,
                b_simple_end: 200.0,
            },
            b_noise_run: None,
            reference_updates: Some(150.0),
        };
        let v = serde_json::to_value(&basis).unwrap();
        assert_eq!(v["method_code"], "end_value");
        assert_eq!(v["measured"], false);
        assert_eq!(v["run_batch"], 128);
        let back: PredictionBasis = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(back, basis);
        // Without the codes (an earlier advice file), the kind is read from the fields.
        let mut old = v;
        old.as_object_mut().unwrap().remove("method_code");
        old["measured"] = true.into();
        let back: PredictionBasis = serde_json::from_value(old).unwrap();
        assert!(back.measured());
    }
}
