//! How a training command tells batchfit its step times.
//!
//! The protocol is one line per training step, on stdout or stderr:
//!
//! ```text
//! BATCHFIT {"step": 12, "samples": 64, "seconds": 0.031}
//! ```
//!
//! `seconds` (the step's wall time, device synchronised) is required; `samples`
//! defaults to the batch size, `step` to the line's position and `rank` (the
//! data-parallel rank that ran the step, under a launcher) to 0. Commands that
//! already print their speed can be read with a regular expression instead
//! (`--throughput-regex`), one match per step, with a named group `seconds` or
//! `samples_per_s` and optionally `samples` and `rank`.

use crate::error::{ExecError, StepLineError};
use batchfit_tune::stats::summarize;
pub use batchfit_tune::trial::{NoiseReport, StepReport, StepStats};
use regex::Regex;

/// Prefix of a protocol line.
pub const PREFIX: &str = "BATCHFIT ";

/// Reads step reports out of a command's output lines.
#[derive(Clone, Debug)]
pub enum StepReader {
    Protocol,
    Regex(Regex),
}

impl StepReader {
    /// A reader for `--throughput-regex PATTERN`, checked: it must compile and
    /// name a `seconds` or `samples_per_s` group.
    pub fn regex(pattern: &str) -> Result<StepReader, ExecError> {
        let re = Regex::new(pattern).map_err(ExecError::Regex)?;
        let named = |n: &str| re.capture_names().flatten().any(|c| c == n);
        if !named("seconds") && !named("samples_per_s") {
            return Err(ExecError::RegexGroups);
        }
        Ok(StepReader::Regex(re))
    }

    /// Every step reported on `line`, in order; `Err` for a protocol report
    /// that does not parse (the caller counts these and says so).
    ///
    /// A line may hold several: torchrun starts its workers as `python -u`,
    /// whose `print` writes the text and its newline in two system calls, so
    /// two ranks printing at once leave `BATCHFIT {..}BATCHFIT {..}` and an
    /// empty line. Each write is whole (a pipe keeps writes under 4 KiB
    /// together), so every report is read from where its prefix starts to the
    /// end of its JSON object, whatever follows.
    pub fn read_line(&self, line: &str, batch: u64) -> Vec<Result<StepReport, StepLineError>> {
        match self {
            StepReader::Protocol => line
                .match_indices(PREFIX)
                .map(|(at, _)| {
                    let json = &line[at + PREFIX.len()..];
                    let shown = || match json.find(PREFIX) {
                        Some(next) => format!("{PREFIX}{}", json[..next].trim()),
                        None => format!("{PREFIX}{}", json.trim()),
                    };
                    let first = serde_json::Deserializer::from_str(json)
                        .into_iter::<StepReport>()
                        .next()
                        .unwrap_or_else(|| serde_json::from_str::<StepReport>(json));
                    let r = first.map_err(|source| StepLineError::Json {
                        line: shown(),
                        source,
                    })?;
                    if !(r.seconds.is_finite() && r.seconds > 0.0) {
                        Err(StepLineError::NotPositive(shown()))
                    } else if r.noise.is_some_and(|n| !n.is_valid()) {
                        Err(StepLineError::BadNoise(shown()))
                    } else {
                        Ok(r)
                    }
                })
                .collect(),
            StepReader::Regex(re) => re
                .captures_iter(line)
                .filter_map(|c| {
                    let num = |n: &str| c.name(n).and_then(|m| m.as_str().parse::<f64>().ok());
                    let samples = num("samples").map(|s| s as u64);
                    let rank = c.name("rank").and_then(|m| m.as_str().parse().ok());
                    let seconds = match (num("seconds"), num("samples_per_s")) {
                        (Some(s), _) => s,
                        (None, Some(rate)) if rate > 0.0 => samples.unwrap_or(batch) as f64 / rate,
                        _ => return Some(Err(StepLineError::NoNumber(line.trim().to_string()))),
                    };
                    (seconds.is_finite() && seconds > 0.0).then_some(Ok(StepReport {
                        step: None,
                        samples,
                        seconds,
                        loss: None,
                        train_loss: None,
                        noise: None,
                        rank,
                    }))
                })
                .collect(),
        }
    }
}

/// Statistics of `steps`, skipping the first `warmup` (all are used when
/// fewer remain, which the caller can see from `steps_used`).
pub fn step_stats(steps: &[StepReport], batch: u64, warmup: usize) -> Option<StepStats> {
    if steps.is_empty() {
        return None;
    }
    let used = if steps.len() > warmup {
        &steps[warmup..]
    } else {
        steps
    };
    let times: Vec<f64> = used.iter().map(|s| s.seconds).collect();
    let samples: f64 = used.iter().map(|s| s.samples.unwrap_or(batch) as f64).sum();
    Some(StepStats {
        steps_reported: steps.len(),
        steps_used: used.len(),
        step_time: summarize(&times),
        samples_per_s: samples / times.iter().sum::<f64>(),
    })
}

/// The step statistics of a data-parallel trial from each rank's
/// (`per_rank`, as `(rank, stats)`): a synchronous step waits for the slowest
/// rank, so the step time is the slowest rank's (by median), and every rank
/// trains its own micro-batch, so samples/s is the slowest rank's samples per
/// step times the world size over its mean step time. `world_size` is the
/// launcher's; more ranks reporting than that count instead. One rank: its
/// own statistics, unchanged.
pub fn combine_ranks(per_rank: &[(u32, StepStats)], world_size: u32) -> Option<StepStats> {
    let (_, slowest) = per_rank
        .iter()
        .max_by(|a, b| a.1.step_time.median.total_cmp(&b.1.step_time.median))?;
    let world = world_size.max(per_rank.len() as u32).max(1) as f64;
    Some(StepStats {
        samples_per_s: slowest.samples_per_s * world,
        ..slowest.clone()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one step on `line`, if any.
    fn read(r: &StepReader, line: &str, batch: u64) -> Option<Result<StepReport, StepLineError>> {
        let mut steps = r.read_line(line, batch);
        assert!(steps.len() <= 1, "{line}: {} steps", steps.len());
        steps.pop()
    }

    #[test]
    fn reads_noise_fields() {
        let r = StepReader::Protocol;
        let s = read(&r,
                r#"BATCHFIT {"step": 3, "samples": 128, "seconds": 0.05, "loss": 0.7, "noise": {"b_small": 16, "g_small_sq": 0.02, "b_big": 128, "g_big_sq": 0.005}}"#,
                128,
            )
            .unwrap()
            .unwrap();
        assert_eq!(s.loss, Some(0.7));
        assert_eq!(s.train_loss, None);
        let fixed = read(
            &r,
            r#"BATCHFIT {"step": 4, "seconds": 0.05, "loss": 0.7, "train_loss": 0.55}"#,
            128,
        );
        assert_eq!(fixed.unwrap().unwrap().train_loss, Some(0.55));
        let n = s.noise.unwrap();
        assert_eq!((n.b_small, n.b_big), (16.0, 128.0));
        assert_eq!((n.g_small_sq, n.g_big_sq), (0.02, 0.005));
        assert_eq!((n.preconditioned, n.rows), (None, None));
        // The data set's rows, where the helper was told them.
        let rows = read(
            &r,
            r#"BATCHFIT {"seconds": 0.05, "noise": {"b_small": 16, "g_small_sq": 0.02, "b_big": 128, "g_big_sq": 0.005, "rows": 5000}}"#,
            128,
        );
        assert_eq!(rows.unwrap().unwrap().noise.unwrap().rows, Some(5000.0));
        // Adam's geometry beside the raw norms; a negative one is refused.
        let pre = |v: &str| {
            read(&r,
                &format!(r#"BATCHFIT {{"seconds": 0.05, "noise": {{"b_small": 16, "g_small_sq": 0.02, "b_big": 128, "g_big_sq": 0.005, "preconditioned": {{"g_small_sq": 40.0, "g_big_sq": {v}}}}}}}"#),
                128,
            )
            .unwrap()
        };
        let p = pre("7.5").unwrap().noise.unwrap().preconditioned.unwrap();
        assert_eq!((p.g_small_sq, p.g_big_sq), (40.0, 7.5));
        assert!(pre("-1").is_err());
        // B_big must exceed B_small.
        assert!(
            read(&r,
                r#"BATCHFIT {"seconds": 0.05, "noise": {"b_small": 16, "g_small_sq": 0.02, "b_big": 16, "g_big_sq": 0.005}}"#,
                16
            )
            .unwrap()
            .is_err()
        );
    }

    #[test]
    fn reads_protocol_lines() {
        let r = StepReader::Protocol;
        let s = read(
            &r,
            r#"BATCHFIT {"step": 12, "samples": 64, "seconds": 0.031}"#,
            64,
        )
        .unwrap()
        .unwrap();
        assert_eq!((s.step, s.samples, s.seconds), (Some(12), Some(64), 0.031));
        let s = read(&r, r#"  BATCHFIT {"seconds": 2e-3}"#, 8)
            .unwrap()
            .unwrap();
        assert_eq!((s.step, s.samples, s.seconds), (None, None, 0.002));
        assert_eq!(s.rank, None);
        let s = read(&r, r#"BATCHFIT {"rank": 3, "seconds": 0.5}"#, 8)
            .unwrap()
            .unwrap();
        assert_eq!(s.rank, Some(3));
        assert!(read(&r, "Epoch 1/3 - loss 0.2", 8).is_none());
        assert!(read(&r, r#"BATCHFIT {"step": 1}"#, 8).unwrap().is_err());
        assert!(read(&r, r#"BATCHFIT {"seconds": 0}"#, 8).unwrap().is_err());
    }

    #[test]
    fn reads_every_report_of_ranks_printing_at_once() {
        // What two `python -u` ranks under torchrun leave in one pipe, as seen
        // with torch 2.15: each print's text whole, the newlines after.
        let r = StepReader::Protocol;
        let line = r#"BATCHFIT {"step": 0, "rank": 0, "seconds": 0.0137}BATCHFIT {"step": 0, "rank": 1, "seconds": 0.0138}"#;
        let steps: Vec<StepReport> = r
            .read_line(line, 64)
            .into_iter()
            .map(|s| s.unwrap())
            .collect();
        let ranks: Vec<_> = steps.iter().map(|s| (s.rank, s.seconds)).collect();
        assert_eq!(ranks, [(Some(0), 0.0137), (Some(1), 0.0138)]);
        assert!(r.read_line("", 64).is_empty());
        // Text another print left before a report, and a broken report beside a whole one.
        let steps = r.read_line(
            r#"epoch 1 doneBATCHFIT {"seconds": 0.5}BATCHFIT {"seconds": }BATCHFIT "#,
            8,
        );
        assert_eq!(steps.len(), 3);
        assert_eq!(steps[0].as_ref().unwrap().seconds, 0.5);
        match &steps[1] {
            Err(StepLineError::Json { line, .. }) => assert_eq!(line, r#"BATCHFIT {"seconds": }"#),
            other => panic!("{other:?}"),
        }
        assert!(steps[2].is_err());
    }

    #[test]
    fn reads_a_regex_for_rate_or_seconds() {
        assert!(StepReader::regex("([0-9.]+) samples/s").is_err());
        assert!(StepReader::regex("(?P<seconds>[0-9.+").is_err());
        let r = StepReader::regex(r"(?P<samples_per_s>[0-9.]+) samples/s").unwrap();
        let s = read(&r, "step 3: 1600.0 samples/s", 32).unwrap().unwrap();
        assert!((s.seconds - 0.02).abs() < 1e-12);
        let r = StepReader::regex(r"(?P<seconds>[0-9.]+)s/step").unwrap();
        assert_eq!(
            read(&r, "10/10 - 0.25s/step", 32).unwrap().unwrap().seconds,
            0.25
        );
        // torchrun --tee prefixes each line with its rank.
        let r = StepReader::regex(r"\[rank(?P<rank>\d+)\]:.* (?P<seconds>[0-9.]+)s/step").unwrap();
        assert_eq!(
            read(&r, "[rank1]: step 4 0.25s/step", 32)
                .unwrap()
                .unwrap()
                .rank,
            Some(1)
        );
    }

    #[test]
    fn statistics_skip_the_warmup_steps() {
        let steps: Vec<StepReport> = [1.0, 0.5, 0.1, 0.1, 0.1, 0.1]
            .iter()
            .map(|&seconds| StepReport {
                step: None,
                samples: None,
                seconds,
                loss: None,
                train_loss: None,
                noise: None,
                rank: None,
            })
            .collect();
        let s = step_stats(&steps, 10, 2).unwrap();
        assert_eq!((s.steps_reported, s.steps_used), (6, 4));
        assert!((s.step_time.median - 0.1).abs() < 1e-12);
        assert!((s.samples_per_s - 100.0).abs() < 1e-9);
        // Too few steps to skip any: all are used.
        assert_eq!(step_stats(&steps[..2], 10, 2).unwrap().steps_used, 2);
        assert!(step_stats(&[], 10, 2).is_none());
    }

    #[test]
    fn the_slowest_rank_sets_the_step_and_every_rank_counts_its_samples() {
        let stats = |secs: &[f64]| {
            let steps: Vec<StepReport> = secs
                .iter()
                .map(|&seconds| StepReport {
                    step: None,
                    samples: None,
                    seconds,
                    loss: None,
                    train_loss: None,
                    noise: None,
                    rank: None,
                })
                .collect();
            step_stats(&steps, 10, 0).unwrap()
        };
        let fast = stats(&[0.1, 0.1, 0.1]);
        let slow = stats(&[0.2, 0.2, 0.2]);
        let c = combine_ranks(&[(0, fast.clone()), (1, slow.clone())], 2).unwrap();
        assert_eq!(c.step_time, slow.step_time);
        // 10 samples per rank per step, 2 ranks, 0.2 s per step.
        assert!((c.samples_per_s - 100.0).abs() < 1e-9);
        // A world of one: the rank's own figures.
        assert_eq!(combine_ranks(&[(0, fast.clone())], 1), Some(fast.clone()));
        // Ranks on other nodes count through the world size.
        let c = combine_ranks(&[(0, fast)], 4).unwrap();
        assert!((c.samples_per_s - 400.0).abs() < 1e-9);
        assert!(combine_ranks(&[], 2).is_none());
    }
}
