//! Every sentence a report says about a decision, built from its typed value:
//! why a batch is recommended, each finding, what a prediction rests on, how a
//! schedule compares, the verdict of a check. The decisions (`batchfit_tune`)
//! carry codes and figures; the words are here, once.

use batchfit_tune::advice::{NoiseHint, Reason, Recommendation, TieBreak};
use batchfit_tune::basis::{BasisSource, MethodCode, PredictionBasis};
use batchfit_tune::diagnose::{Finding, FindingKind};
use batchfit_tune::lr::{LrRule, LrScaling};
use batchfit_tune::run::{RunNoise, RunRate};
use batchfit_tune::schedule::DeviceSchedule;
use batchfit_tune::sweep::{QualityVerdict, ScheduleSource, ScheduleSummary, TargetSource};
use batchfit_tune::target::RateModel;
use batchfit_tune::trajectory::SEGMENT_MEASUREMENTS;
use batchfit_tune::verify::{RECOMMENDATION_TOLERANCE, VerdictOutcome};

/// Why the batch is recommended.
pub fn reason(r: &Reason) -> String {
    match r {
        Reason::TimeToTarget {
            tied,
            band,
            fastest_batch,
            fastest_step_s,
            step_line,
            tie_break,
        } => {
            let band_text = format!(
                "B_noise ≈ {:.0}, band {:.0}–{}",
                band.b_noise,
                band.low,
                band.high.map_or("∞".to_string(), |h| format!("{h:.0}"))
            );
            if tied.len() <= 1 {
                let named = tied.first().copied().unwrap_or(*fastest_batch);
                let head = "lowest predicted time to target, (1 + B_noise/B) x step time";
                let step = fastest_step_s * 1e3;
                let Some((fixed, per)) = step_line else {
                    return format!(
                        "{head}; no other batch comes within the measurement's noise of it ({band_text}; step {step:.2} ms measured at B = {fastest_batch})"
                    );
                };
                let on_line = format!(
                    "{head}, with the step times of the line through every measured one ({:.3} ms + {:.4} ms per sample); on it no other batch comes within the measurement's noise",
                    fixed * 1e3,
                    per * 1e3
                );
                // The table ranks by single medians: where one of them puts
                // another batch first, say why the line does not.
                return if named != *fastest_batch {
                    format!(
                        "{on_line} ({band_text}). The single medians of the table put B = {fastest_batch} first (step {step:.2} ms measured): one median moves between runs by more than the line does"
                    )
                } else {
                    format!(
                        "{on_line} ({band_text}; step {step:.2} ms measured at B = {fastest_batch})"
                    )
                };
            }
            let tie_break = match tie_break {
                TieBreak::Optimum(opt) => format!(
                    "the nearest to the fitted curve's optimum B* ≈ {opt:.0} (among the tied powers of two and the full batch, where any)"
                ),
                TieBreak::Measured { optimum } => format!(
                    "the one the measured step times put fastest: the fitted curve's optimum B* ≈ {optimum:.0} lies nearer a batch they measured slower beyond both errors"
                ),
                TieBreak::Midpoint { optimum, low, high } => format!(
                    "the one the measured step times put faster of the two around the fitted curve's optimum B* ≈ {optimum:.0}: over B_noise's band B* moves {low:.0}–{}, across the midpoint between them, so the curve cannot say which is nearer",
                    high.map_or("∞".to_string(), |h| format!("{h:.0}"))
                ),
                TieBreak::MeasuredFastest => "the one the measured step times put fastest (no line fits the step times around them; among the tied powers of two and the full batch, where any)".to_string(),
                TieBreak::Smallest => "the smallest".to_string(),
            };
            format!(
                "lowest predicted time to target, (1 + B_noise/B) x step time, within the measurement's noise: batches {} cannot be told apart ({band_text}; fastest point estimate B = {}, step {:.2} ms measured); of those, {tie_break}",
                tied.iter()
                    .map(|b| b.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                fastest_batch,
                fastest_step_s * 1e3
            )
        }
        Reason::Knee {
            hint:
                NoiseHint::NotLearning {
                    run_loss,
                    prior_loss,
                },
            efficiency,
        } => format!(
            "the smallest batch reaching {:.0} % of the best measured throughput, throughput only: no batch is ranked by time to target, because the noise run learned nothing from the inputs (its loss ended at {run_loss:.4}, no lower than {prior_loss:.4}, the loss of ignoring the inputs); {}",
            efficiency * 100.0,
            // Ignoring the inputs costs nothing where every row has the same
            // target or class: no scaling or rate helps (DATA says which).
            if *prior_loss <= 0.0 {
                "every row has the same target, so there is nothing to learn: check the label column (see DATA)"
            } else {
                "scale the inputs (--standardize) or lower --lr, and measure again"
            }
        ),
        Reason::Knee { efficiency, hint } => format!(
            "the smallest batch reaching {:.0} % of the best measured throughput (the noise scale is unknown, so steps needed are not weighed: {})",
            efficiency * 100.0,
            match hint {
                NoiseHint::GiveData => "add --data to measure it on your data",
                NoiseHint::PythonHelper =>
                    "report it from your training loop with the Python helper, docs/run.md",
                NoiseHint::NoneFromTheRun | NoiseHint::NotLearning { .. } =>
                    "the noise run on your data gave none, its |G|^2 not clearly above zero; a longer run (--noise-steps) or more rows may",
            }
        ),
        Reason::NothingMeasured => "no batch size could be measured".into(),
    }
}

/// How to state the learning rate without a reference.
pub fn learning_rate_rule(r: &Recommendation) -> &'static str {
    match r.lr_rule {
        LrRule::Sqrt => {
            "learning rate: your tuned lr x sqrt(B / your batch), square-root rule for Adam (Malladi et al. 2022); give --ref-batch/--ref-lr for a number"
        }
        _ => {
            "learning rate: your tuned lr x B / your batch, linear rule with warm-up for SGD (Goyal et al. 2017); give --ref-batch/--ref-lr for a number"
        }
    }
}

/// A finding in one sentence, with the figures behind it.
pub fn finding(f: &Finding) -> String {
    let device = f.device;
    match f.kind {
        FindingKind::FlatThroughput {
            from_batch,
            to_batch,
            gain,
            from_samples_per_s,
            to_samples_per_s,
        } => format!(
            "{device}: from batch {from_batch} to {to_batch} throughput changes by {:+.0} % ({from_samples_per_s:.0} -> {to_samples_per_s:.0} samples/s) while updates per epoch fall {}x; above batch {from_batch} a bigger batch mostly means fewer, not faster, updates",
            100.0 * gain,
            to_batch / from_batch,
        ),
        FindingKind::FixedOverhead {
            fixed_s,
            per_sample_s,
            batch,
            share,
        } => format!(
            "{device}: each step costs about {:.2} ms whatever the batch (fit: {:.2} ms + {:.3} ms per sample); at batch {batch} that is {:.0} % of the step, so the device is mostly idle: raise the batch{}",
            fixed_s * 1e3,
            fixed_s * 1e3,
            per_sample_s * 1e3,
            100.0 * share.min(1.0),
            if device.is_gpu() {
                " or train this model on the CPU"
            } else {
                ""
            }
        ),
        FindingKind::GpuIdle { util_pct, batch } => format!(
            "{device}: at batch {batch} the GPU ran kernels {util_pct:.0} % of the time (NVML, measured): the step waits on something else (input pipeline, Python overhead, synchronisation); raise the batch, or prefetch and overlap data loading"
        ),
        FindingKind::InputBound {
            load_s,
            step_s,
            batch,
            share,
        } => format!(
            "{device}: at batch {batch} preparing a batch takes {:.2} ms against {:.2} ms of compute ({:.0} % of the time): the input pipeline limits training; prefetch or prepare batches in parallel",
            load_s * 1e3,
            step_s * 1e3,
            100.0 * share
        ),
        FindingKind::CpuSteal { share, batch } => format!(
            "{device}: while batch {batch} was timed, other virtual machines on this host took {:.0} % of its CPU time (steal time, /proc/stat, measured): step times are slower and noisier than on a quiet machine, and so is every choice made from them; measure again when the host is quiet, or on dedicated hardware",
            100.0 * share
        ),
        FindingKind::AboveCritical {
            batch,
            critical,
            epochs_vs_min,
        } => format!(
            "{device}: batch {batch} is {:.0}x the critical batch on the training rows ({critical:.0}, B_noise N / (N + B_noise)): it needs about {epochs_vs_min:.1}x the epochs of a small batch to reach the same loss (E(B) = E_min (1 + B/B_noise - B/N) on N training rows)",
            batch as f64 / critical,
        ),
        FindingKind::NearMemoryLimit {
            batch,
            max_batch,
            safe,
        } => format!(
            "{device}: batch {batch} is within 10 % of the largest that fits ({max_batch}); fragmentation or a longer sequence can still run it out of memory later; {safe} is the safe value"
        ),
    }
}

/// "1.00e-3 x sqrt(B / 16), held from B = 163".
pub fn formula(lr: &LrScaling) -> String {
    let f = match lr.rule {
        LrRule::Linear => format!("{:.2e} x B / {}", lr.ref_lr, lr.ref_batch),
        LrRule::Sqrt => format!("{:.2e} x sqrt(B / {})", lr.ref_lr, lr.ref_batch),
        LrRule::Fixed => format!("{:.2e}", lr.ref_lr),
    };
    match lr.cap_batch {
        Some(c) if lr.rule != LrRule::Fixed => format!("{f}, held from B = {c}"),
        _ => f,
    }
}

/// How `run`'s trials got their learning rate, and what that means for the prediction.
pub fn run_rate(rate: &RunRate, model: RateModel) -> String {
    match rate {
        RunRate::Handed {
            scaling,
            in_command: true,
        } => format!(
            "learning rate: each trial trained at lr(B) = {} ({}), put where the command has {{lr}} and exported as BATCHFIT_LR, as the time-to-target prediction assumes",
            formula(scaling),
            scaling.rule.source()
        ),
        RunRate::Handed {
            scaling,
            in_command: false,
        } => format!(
            "learning rate: each trial was handed lr(B) = {} ({}) as BATCHFIT_LR only; the command has no {{lr}}, so whether it trained at that rate is the command's to say; the time-to-target prediction assumes it did",
            formula(scaling),
            scaling.rule.source()
        ),
        RunRate::CommandsOwn {
            assumed_rule,
            tuned_at,
        } => {
            let at = match (model, tuned_at) {
                (RateModel::Fixed { best_at }, Some(_)) => {
                    format!(" (the best rate at batch {best_at:.0}, --ref-batch)")
                }
                (RateModel::Fixed { best_at }, None) => format!(
                    " (assumed the best rate at batch {best_at:.0}, the noise trial's; --ref-batch says where it was tuned)"
                ),
                (RateModel::Scaled, _) => String::new(),
            };
            format!(
                "learning rate: the command sets its own, one rate at every batch; the time-to-target table predicts for that fixed rate{at}, and the recommendation assumes the rate follows {} from batch to batch: put {{lr}} where the command takes its rate and give --ref-lr (with --ref-batch) to train each trial at the rule's rate",
                assumed_rule.source()
            )
        }
    }
}

/// How a prediction's S(B) was obtained.
pub fn basis_method(b: &PredictionBasis) -> String {
    let method = basis_source(b);
    match b.curve.rows {
        Some(rows) => format!(
            "{method}; each epoch's batches are distinct rows of the N = {} training rows, so {}",
            crate::thousands(rows.n.round() as u64),
            finite_rows_form(rows.adaptive)
        ),
        None => method,
    }
}

/// How a batch of distinct rows of N counts in S(B), by optimizer family
/// ([`batchfit_tune::target::noise_batch`]).
pub fn finite_rows_form(adaptive: bool) -> &'static str {
    if adaptive {
        "B counts as B / sqrt(1 - B/N) (noise term (B_noise / B) sqrt(1 - B/N): Adam's step is slowed by the noise's standard deviation)"
    } else {
        "B counts as B N / (N - B) (noise term B_noise (1/B - 1/N))"
    }
}

fn basis_source(b: &PredictionBasis) -> String {
    match &b.source {
        BasisSource::Stretches {
            updates_to_target,
            preconditioned,
            ..
        } => format!(
            "S(B) = Σ ΔS_min,i (1 + B_i/B) over stretches of {SEGMENT_MEASUREMENTS} updates of the noise run, each with its own noise scale B_i{} (McCandlish et al. 2018, section 2.3); the run reached the target after {:.0} updates",
            if *preconditioned {
                " of the step Adam takes, g / (sqrt(v) + ε)"
            } else {
                ""
            },
            updates_to_target
        ),
        BasisSource::EndValue { .. } => "S(B) through the noise run's updates with its final noise scale (its stretches could not be measured)".to_string(),
        BasisSource::Sweep(s) => format!(
            "S_min and B_noise fitted to the steps to target of {} runs of the sweep in {} (batches {}, {} data)",
            s.runs,
            s.dir,
            s.batches
                .iter()
                .map(|b| b.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            s.data
        ),
    }
}

/// How `run`'s noise scale was drawn from its noise trial.
pub fn run_noise_method(n: &RunNoise) -> String {
    let geometry = if n.preconditioned {
        " of the step Adam takes, g / (sqrt(v) + ε)"
    } else {
        " of the raw gradient"
    };
    let finite = n
        .data_rows
        .map(|rows| {
            format!(
                ", |G|² corrected for the finite data ({} rows drawn without replacement)",
                rows.n.round()
            )
        })
        .unwrap_or_default();
    let geometry = format!("{geometry}{finite}");
    match n.method {
        MethodCode::Stretches => format!(
            "B_eff of {} stretch{} of up to {SEGMENT_MEASUREMENTS} measurements, each with its own noise scale{geometry} (McCandlish et al. 2018, section 2.3)",
            n.segments.len(),
            if n.segments.len() == 1 { "" } else { "es" }
        ),
        MethodCode::EndValue | MethodCode::SweepFit => {
            format!("the trial's end value{geometry} (its stretches could not be measured)")
        }
    }
}

/// What one update's time is made of.
pub const STEP_TIME: &str = "the 10th-percentile timed step, times the mean-to-10th-percentile ratio over every batch timed, plus gathering the batch from the data";

/// The machine-readable code of [`STEP_TIME`].
pub const STEP_TIME_CODE: &str = "timed_steps_p10_times_interference_plus_batch_gathering";

/// A device's ramp beside its best fixed batch.
pub fn schedule_statement(s: &DeviceSchedule) -> String {
    match (s.seconds, s.best_fixed) {
        (Some(t), Some((b, steps, tb))) => format!(
            "predicted: the ramp takes {:.0} updates and {} to the target, the best fixed batch ({b}) {:.0} updates and {}: the ramp is {:.0} % {} and needs {:.0} % {} updates",
            s.steps,
            seconds_text(t),
            steps,
            seconds_text(tb),
            100.0 * (t / tb - 1.0).abs(),
            if t <= tb { "faster" } else { "slower" },
            100.0 * (s.steps / steps - 1.0).abs(),
            if s.steps <= steps { "fewer" } else { "more" }
        ),
        _ => format!(
            "predicted: the ramp takes {:.0} updates to the target (a stage's update time was not measured)",
            s.steps
        ),
    }
}

/// The code of [`schedule_statement`]: `compared`, or `not_timed`.
pub fn schedule_statement_code(s: &DeviceSchedule) -> &'static str {
    match (s.seconds, s.best_fixed) {
        (Some(_), Some(_)) => "compared",
        _ => "not_timed",
    }
}

fn seconds_text(s: f64) -> String {
    if s < 1.0 {
        format!("{:.0} ms", s * 1e3)
    } else {
        format!("{s:.2} s")
    }
}

/// How the batches of a ramp are chosen.
pub const RAMP_RULE: &str = "each stretch of the run at the largest batch (a power of two in the range) not above the noise scale of training so far, never smaller than before: the batch doubles once that passes twice it";

/// Where a trained schedule came from.
pub fn schedule_source(s: &ScheduleSource) -> String {
    match s {
        ScheduleSource::Ramp => {
            format!("ramp: {RAMP_RULE}, from a noise run on the training split")
        }
        ScheduleSource::File(name) => name.clone(),
    }
}

/// A trained schedule beside the fastest fixed batch.
pub fn schedule_summary_statement(s: &ScheduleSummary) -> String {
    match (s.seconds_ratio.zip(s.seconds_z), s.best_fixed) {
        (Some((r, z)), Some(b)) => format!(
            "the schedule took {:.0} % {} seconds to the target than the fastest fixed batch ({b}), {:.1} standard errors of the seeds: {}; {}",
            100.0 * (r - 1.0).abs(),
            if r < 1.0 { "fewer" } else { "more" },
            z.abs(),
            if s.beats_best_fixed {
                "it beats every fixed batch beyond the seeds' noise"
            } else if z > 2.0 {
                "the fixed batch is faster beyond the seeds' noise"
            } else {
                "within the seeds' noise"
            },
            match s.steps_ratio {
                Some(r) => format!(
                    "{:.0} % {} steps",
                    100.0 * (r - 1.0).abs(),
                    if r < 1.0 { "fewer" } else { "more" }
                ),
                None => String::new(),
            }
        ),
        _ => "the schedule cannot be compared: it, or every fixed batch, did not reach the target in every run".to_string(),
    }
}

/// The code of [`schedule_summary_statement`].
pub fn schedule_summary_code(s: &ScheduleSummary) -> &'static str {
    match (s.seconds_ratio.zip(s.seconds_z), s.best_fixed) {
        (Some(_), Some(_)) if s.beats_best_fixed => "beats_best_fixed",
        (Some((_, z)), Some(_)) if z > 2.0 => "fixed_faster",
        (Some(_), Some(_)) => "within_seed_noise",
        _ => "not_compared",
    }
}

/// Where a sweep's target comes from.
pub fn target_source(t: TargetSource) -> String {
    match t {
        TargetSource::Given => "--target-loss".to_string(),
        TargetSource::LowestReached { max_epochs } => {
            format!("the lowest loss every run reached within {max_epochs} epochs")
        }
    }
}

/// "0.064 s" / "1.27 s" / "95.3 s".
fn seconds(s: f64) -> String {
    if s < 1.0 {
        format!("{s:.3} s")
    } else if s < 10.0 {
        format!("{s:.2} s")
    } else {
        format!("{s:.1} s")
    }
}

/// The verdict of a check in one line.
pub fn verdict_line(recommended: u64, v: VerdictOutcome) -> String {
    match v {
        VerdictOutcome::Fastest { seconds: s, runs } => format!(
            "The advice held: batch {recommended} reached the target fastest ({}, mean of {runs} runs).",
            seconds(s),
        ),
        VerdictOutcome::Within {
            seconds: s,
            ratio,
            fastest,
            fastest_seconds,
            by_tolerance,
        } => format!(
            "The advice held: batch {recommended} took {} ({:+.0} % against the fastest, batch {fastest} at {}), {}.",
            seconds(s),
            100.0 * (ratio - 1.0),
            seconds(fastest_seconds),
            if by_tolerance {
                format!("within {:.0} %", 100.0 * RECOMMENDATION_TOLERANCE)
            } else {
                "within the seeds' noise".to_string()
            }
        ),
        VerdictOutcome::NotHeld {
            fastest_in_tie,
            seconds: s,
            ratio,
            fastest,
            fastest_seconds,
        } => format!(
            "The advice did not hold: batch {recommended} took {}, {:.0} % more than batch {fastest} ({}), beyond the seeds' noise.{}",
            seconds(s),
            100.0 * (ratio - 1.0),
            seconds(fastest_seconds),
            if fastest_in_tie {
                format!(
                    " The advice had stated {fastest} among the batches its timings could not tell apart from {recommended}."
                )
            } else {
                String::new()
            }
        ),
        VerdictOutcome::NotTrained => {
            format!("The advice could not be checked: batch {recommended} was not trained.")
        }
        VerdictOutcome::NotReached => format!(
            "The advice could not be checked: batch {recommended} did not reach the target in every run."
        ),
        VerdictOutcome::AtTargetFromTheStart => format!(
            "The advice could not be checked: batch {recommended}'s runs started at or below the target loss (it was measured on other rows, or the data trains to it at once)."
        ),
    }
}

/// The quality answer in words, from the verdicts.
pub fn quality_statement(
    loss: Option<&QualityVerdict>,
    accuracy: Option<&QualityVerdict>,
    seeds: usize,
) -> String {
    let Some(main) = accuracy.or(loss) else {
        return "quality: not compared (needs two batches with at least two finished seeds each)"
            .into();
    };
    let what = if accuracy.is_some() {
        "validation accuracy"
    } else {
        "validation loss"
    };
    let (diff, se) = if accuracy.is_some() {
        (
            format!("{:.2} points", main.difference * 100.0),
            format!("{:.2}", main.std_err * 100.0),
        )
    } else {
        (
            format!("{:.4}", main.difference),
            format!("{:.4}", main.std_err),
        )
    };
    let verdict = if main.exceeds_seed_noise {
        "exceeds the seed-to-seed noise: on this data and budget the batch size changes the result"
    } else {
        "is within the seed-to-seed noise: these runs show no quality cost of either batch size"
    };
    format!(
        "quality: best {what} at batch {}, worst at batch {}; the difference ({diff}, {:.1} standard errors of {se}) {verdict} ({} seeds per batch; with few seeds only large differences show)",
        main.best_batch, main.worst_batch, main.z, seeds
    )
}

/// The code of [`quality_statement`].
pub fn quality_code(
    loss: Option<&QualityVerdict>,
    accuracy: Option<&QualityVerdict>,
) -> &'static str {
    match accuracy.or(loss) {
        None => "not_compared",
        Some(v) if v.exceeds_seed_noise => "exceeds_seed_noise",
        Some(_) => "within_seed_noise",
    }
}

/// A finding on the data, with its fix; a class is named where the file
/// named it (`class_names`, empty where its labels are numbers).
pub fn data_finding(f: &batchfit_tune::dataset::DataFinding, class_names: &[String]) -> String {
    use batchfit_tune::dataset::{DataFinding, UNSCALED_ABOVE, WIDE_TARGETS_STD};
    match f {
        DataFinding::Unscaled { max_abs, feature } => format!(
            "inputs are unscaled: |x| reaches {max_abs:.4} (feature {feature}), far above the order one initialisations and learning rates assume (over {UNSCALED_ABOVE}); scale them in your pipeline (standardise each feature, or divide pixels by 255) and measure again, or add --standardize to train batchfit's runs on standardised inputs"
        ),
        DataFinding::ConstantFeatures {
            count,
            features,
            first,
        } => format!(
            "{count} of {features} input features hold one value in every row (the first: feature {first}); they carry no signal, and drop out of --standardize"
        ),
        DataFinding::MissingClasses { missing, classes } => format!(
            "no row has class {} of the model's {classes}: the label column or --label-col may be wrong, or the output layer wider than the labels",
            missing
                .iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        DataFinding::RareClass {
            class,
            share,
            classes,
        } => format!(
            "class {class}{} holds {:.1} % of the rows (an even share of {classes} classes is {:.1} %): a loss target is reached mostly on the common classes; weigh or resample the rare one if it matters",
            class_names
                .get(*class)
                .map(|n| format!(" ({n})"))
                .unwrap_or_default(),
            share * 100.0,
            100.0 / *classes as f64
        ),
        DataFinding::WideTargets { mean, std } => format!(
            "regression targets have mean {mean:.4} and spread {std:.4} (over {WIDE_TARGETS_STD}): the squared error and its gradients scale with their square; standardise the targets, or add --standardize"
        ),
        DataFinding::ConstantTargets { value } => format!(
            "every row's regression target is {value:.4}: there is nothing to learn; the label column or --label-col may be wrong"
        ),
    }
}

/// One rate check, as a line: the batch, rate, updates and verdict.
pub fn rate_check(c: &batchfit_tune::stability::RateCheck) -> String {
    use batchfit_tune::stability::{CHECK_LIMIT, RateVerdict};
    format!(
        "batch {} at lr {:.3e}{}: {} (S(B) predicts {:.0}): {}",
        c.batch,
        c.lr,
        if c.rule_rate { " (the rule's)" } else { "" },
        match (c.steps_to_target, c.steps_sd) {
            (Some(s), Some(sd)) if c.seeds > 1 => format!(
                "reached the target in {s:.0} ± {sd:.0} updates ({} seeds)",
                c.seeds
            ),
            (Some(s), _) => format!("reached the target in {s:.0} updates"),
            (None, _) => format!(
                "not at the target after {} updates (loss {:.4} to {})",
                c.max_steps,
                c.loss_start,
                if c.loss_end.is_finite() {
                    format!("{:.4}", c.loss_end)
                } else {
                    "NaN".into()
                }
            ),
        },
        c.predicted_steps,
        match c.verdict {
            RateVerdict::Trains => "trains".to_string(),
            RateVerdict::Diverged => "diverged".to_string(),
            RateVerdict::Stalled => format!("stalled (not there within its limit: {CHECK_LIMIT} x the prediction, and from the run's batch up at least the run's own updates scaled to this rate)"),
            RateVerdict::NoGain => "no gain (no fewer updates than a smaller batch: the rule's rate is past its best here)".to_string(),
            RateVerdict::SlowerThanPredicted => format!("slower than predicted (not there within {CHECK_LIMIT} x the prediction; below the noise run's batch the rate is below the run's, so S(B) underestimates this batch, not a rate that failed)"),
            RateVerdict::Unfinished => format!(
                "unfinished (its steps ended before {CHECK_LIMIT} x the prediction: says nothing about the rate){}",
                match c.projected_steps {
                    Some(p) => format!("; from the loss it reached it projects to {p:.0} updates"),
                    None => String::new(),
                }
            ),
        }
    )
}

/// Where S(B) is drawn through after the checks: the updates the reference
/// check took (its seeds' mean), beside the noise run's own.
pub fn reference_anchor(b: &PredictionBasis) -> Option<String> {
    let (reference, run) = (b.reference_updates?, b.run()?);
    let own = b
        .updates_to_target()
        .filter(|u| u.is_finite())
        .map(|u| format!(" (the run itself took {u:.0})"))
        .unwrap_or_default();
    Some(format!(
        "S(B) goes through the {reference:.0} updates the checks took at batch {} and the noise run's rate{own}: they trained as a training of the advice does, from their seeds",
        run.batch
    ))
}

/// Where no rate check reached the target (nor came far enough to project
/// it), the run's own batch and rate retrained included: nothing shows a
/// rate that trains, and the ranking rests on the noise run alone. `None`
/// where one reached it.
pub fn none_trained(checks: &[batchfit_tune::stability::RateCheck]) -> Option<String> {
    let none = !checks.is_empty()
        && checks
            .iter()
            .all(|c| c.steps_to_target.is_none() && c.projected_steps.is_none());
    none.then(|| {
        "no check reached the target, the noise run's own batch and rate retrained among them: no rate here is shown to train, and the time to target rests on the noise run alone (a training this erratic often has unscaled inputs: --standardize, or lower --lr)".to_string()
    })
}

/// What the rate checks changed: S(B) refitted to them, the cap, and the
/// batch from which no rate tried trained.
pub fn rate_outcome(
    cap: Option<u64>,
    failed_from: Option<u64>,
    unreached_to: Option<u64>,
    checked_b_noise: Option<(f64, f64)>,
) -> Option<String> {
    let mut out = Vec::new();
    if let Some((checked, run)) = checked_b_noise {
        out.push(format!(
            "S(B) is fitted to the updates the checks took: B_noise ≈ {checked:.0} (the noise run's estimate: {run:.0})"
        ));
    }
    if let Some(c) = cap {
        out.push(format!(
            "a rate below the rule's trained where the rule's failed: the rule is held at batch {c}'s rate from there up"
        ));
    }
    if let Some(f) = failed_from {
        out.push(format!(
            "at batch {f} no rate tried made the predicted progress: the prediction there and above is not borne out, and only smaller batches are recommended (scaling the data may mend it)"
        ));
    }
    if let Some(u) = unreached_to {
        out.push(format!(
            "at batch {u} the check did not reach the target within {} x its predicted updates: its updates there and below are known only as a lower bound, so only larger batches are recommended",
            batchfit_tune::stability::CHECK_LIMIT
        ));
    }
    (!out.is_empty()).then(|| out.join("; "))
}

#[cfg(test)]
mod tests;
