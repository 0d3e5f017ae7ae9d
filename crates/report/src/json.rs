//! The JSON of the decisions: each typed value with its prose beside its
//! code, as the documents have always written them (`docs/json.md`). The
//! values serialise their data and codes themselves; these add the words.

use crate::prose;
use batchfit_tune::advice::Recommendation;
use batchfit_tune::basis::PredictionBasis;
use batchfit_tune::diagnose::{Finding, Rule};
use batchfit_tune::schedule::DeviceSchedule;
use batchfit_tune::sweep::ScheduleSummary;
use batchfit_tune::verify::{Verdict, VerifyReport, VerifyRow};
use serde::Serialize;

/// A recommendation with `reason` and `learning_rate_rule` in words.
#[derive(Serialize)]
pub struct RecommendationJson<'a> {
    #[serde(flatten)]
    pub rec: &'a Recommendation,
    pub reason: String,
    pub learning_rate_rule: &'static str,
}

impl<'a> RecommendationJson<'a> {
    pub fn new(rec: &'a Recommendation) -> Self {
        RecommendationJson {
            rec,
            reason: prose::reason(&rec.reason),
            learning_rate_rule: prose::learning_rate_rule(rec),
        }
    }
}

/// A finding: its rule and its message.
#[derive(Serialize)]
pub struct FindingJson {
    pub rule: Rule,
    pub message: String,
}

impl FindingJson {
    pub fn new(f: &Finding) -> FindingJson {
        FindingJson {
            rule: f.rule(),
            message: prose::finding(f),
        }
    }

    pub fn all(findings: &[Finding]) -> Vec<FindingJson> {
        findings.iter().map(FindingJson::new).collect()
    }
}

/// A prediction's basis with `method` and `step_time` in words.
#[derive(Serialize)]
pub struct BasisJson<'a> {
    #[serde(flatten)]
    pub basis: &'a PredictionBasis,
    pub method: String,
    pub step_time: &'static str,
    pub step_time_code: &'static str,
}

impl<'a> BasisJson<'a> {
    pub fn new(basis: &'a PredictionBasis) -> Self {
        BasisJson {
            basis,
            method: prose::basis_method(basis),
            step_time: prose::STEP_TIME,
            step_time_code: prose::STEP_TIME_CODE,
        }
    }
}

/// A device's ramp with its `statement`.
#[derive(Serialize)]
pub struct DeviceScheduleJson<'a> {
    #[serde(flatten)]
    pub schedule: &'a DeviceSchedule,
    pub statement: String,
    pub statement_code: &'static str,
}

impl<'a> DeviceScheduleJson<'a> {
    pub fn new(schedule: &'a DeviceSchedule) -> Self {
        DeviceScheduleJson {
            schedule,
            statement: prose::schedule_statement(schedule),
            statement_code: prose::schedule_statement_code(schedule),
        }
    }

    pub fn all(s: &'a [DeviceSchedule]) -> Vec<Self> {
        s.iter().map(DeviceScheduleJson::new).collect()
    }
}

/// A trained schedule's summary with its `source` and `statement`.
#[derive(Serialize)]
pub struct ScheduleSummaryJson<'a> {
    #[serde(flatten)]
    pub summary: &'a ScheduleSummary,
    pub source: String,
    pub statement: String,
    pub statement_code: &'static str,
}

impl<'a> ScheduleSummaryJson<'a> {
    pub fn new(summary: &'a ScheduleSummary) -> Self {
        ScheduleSummaryJson {
            summary,
            source: prose::schedule_source(&summary.source),
            statement: prose::schedule_summary_statement(summary),
            statement_code: prose::schedule_summary_code(summary),
        }
    }
}

/// A check's verdict with its `line`.
#[derive(Serialize)]
pub struct VerdictJson<'a> {
    #[serde(flatten)]
    pub verdict: &'a Verdict,
    pub line: String,
}

/// `sweep --verify`'s report.
#[derive(Serialize)]
pub struct VerifyJson<'a> {
    pub advice: &'a str,
    pub device: batchfit_tune::device::DeviceSpec,
    pub basis: BasisJson<'a>,
    pub rows: &'a [VerifyRow],
    pub verdict: VerdictJson<'a>,
}

impl<'a> VerifyJson<'a> {
    pub fn new(v: &'a VerifyReport) -> Self {
        VerifyJson {
            advice: &v.advice,
            device: v.device,
            basis: BasisJson::new(&v.basis),
            rows: &v.rows,
            verdict: VerdictJson {
                verdict: &v.verdict,
                line: prose::verdict_line(v.verdict.recommended, v.verdict.outcome),
            },
        }
    }
}
