//! What the training data looks like before anything is measured on it, and
//! what a user should fix first: inputs far from order one, constant features,
//! classes missing or rare, regression targets on a large scale. `batchfit_data`
//! fills in the profile; the findings are decided here, the report says them.

use serde::{Deserialize, Serialize};

/// One input feature (or, with `--standardize`, the statistics it was scaled by).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct ColumnStats {
    pub min: f64,
    pub max: f64,
    pub mean: f64,
    pub std: f64,
}

/// The targets: class counts, or the values' statistics.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TargetProfile {
    /// Rows (frames, for per-frame losses) per class, for every class the model has.
    Classes {
        counts: Vec<usize>,
    },
    /// CTC's label sequences: labels per class, for every class the model has
    /// (the blank's count is 0: it is never a label).
    Labels {
        counts: Vec<usize>,
        blank: usize,
    },
    Values(ColumnStats),
}

/// The data as batchfit read it, over every row.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DataProfile {
    pub rows: usize,
    /// Numeric input features (token inputs left out), in input order.
    pub features: usize,
    /// The largest |x| of any numeric input, and the feature (0-based) it is in.
    pub max_abs: f64,
    pub max_abs_feature: usize,
    /// Features with one value in every row, and the first of them.
    pub constant_features: usize,
    pub first_constant: Option<usize>,
    pub targets: TargetProfile,
    /// batchfit's own runs train on standardised inputs (and regression targets).
    pub standardized: bool,
    /// The classes' names where the file named them (class i is the i-th,
    /// in sorted order); empty where its labels are numbers.
    pub class_names: Vec<String>,
}

/// Inputs beyond this magnitude are far from the order one that default
/// initialisations and learning rates assume (LeCun et al. 1998, "Efficient
/// BackProp", section 4.3: inputs of zero mean and unit variance); raw pixels
/// (0-255) and physical units (thousands) pass it, features scaled to 0-1 or
/// standardised do not.
pub const UNSCALED_ABOVE: f64 = 10.0;

/// A class holding less than this share of its even share of the rows is rare
/// (a tenth of a class's rows in a 2-class set under 10 % of the rows).
pub const RARE_CLASS_SHARE: f64 = 0.2;

/// Regression targets spread wider than this (in their own units) make MSE and
/// its gradients scale with their square.
pub const WIDE_TARGETS_STD: f64 = 10.0;

/// The CSV column that holds the label (`--label-col`): by 0-based index
/// (negative counts from the end), or by its name in the header.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum LabelCol {
    Index(isize),
    Name(String),
}

impl std::str::FromStr for LabelCol {
    type Err = std::convert::Infallible;

    /// A number is an index, anything else a header name.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        Ok(s.parse::<isize>()
            .map_or_else(|_| LabelCol::Name(s.to_string()), LabelCol::Index))
    }
}

impl std::fmt::Display for LabelCol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LabelCol::Index(i) => write!(f, "{i}"),
            LabelCol::Name(n) => f.write_str(n),
        }
    }
}

/// What the data asks the user to fix.
#[derive(Clone, Debug, PartialEq)]
pub enum DataFinding {
    /// Inputs reach `max_abs` (in feature `feature`).
    Unscaled { max_abs: f64, feature: usize },
    /// `count` of `features` features are constant (the first: `first`).
    ConstantFeatures {
        count: usize,
        features: usize,
        first: usize,
    },
    /// Classes the model has but no row holds.
    MissingClasses { missing: Vec<usize>, classes: usize },
    /// The rarest class holds `share` of the rows (`classes` classes).
    RareClass {
        class: usize,
        share: f64,
        classes: usize,
    },
    /// Regression targets of this mean and spread.
    WideTargets { mean: f64, std: f64 },
    /// Every row's regression target is `value`: nothing to learn.
    ConstantTargets { value: f64 },
}

impl DataFinding {
    /// The machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            DataFinding::Unscaled { .. } => "unscaled_inputs",
            DataFinding::ConstantFeatures { .. } => "constant_features",
            DataFinding::MissingClasses { .. } => "missing_classes",
            DataFinding::RareClass { .. } => "rare_class",
            DataFinding::WideTargets { .. } => "wide_targets",
            DataFinding::ConstantTargets { .. } => "constant_targets",
        }
    }
}

impl DataProfile {
    /// The loss of the best prediction that ignores the inputs: the class
    /// frequencies under cross-entropy (their entropy, in nats), the mean
    /// under MSE (the targets' variance; 1 once `--standardize` scaled them).
    /// A training whose loss is not below it has learned nothing from the
    /// inputs. `None` for CTC's label sequences (no such closed form).
    pub fn prior_loss(&self) -> Option<f64> {
        match &self.targets {
            TargetProfile::Classes { counts } => {
                let total: usize = counts.iter().sum();
                (total > 0).then(|| {
                    counts
                        .iter()
                        .filter(|&&c| c > 0)
                        .map(|&c| {
                            let p = c as f64 / total as f64;
                            -p * p.ln()
                        })
                        .sum()
                })
            }
            TargetProfile::Labels { .. } => None,
            TargetProfile::Values(v) if self.standardized => {
                Some(if v.std > 0.0 { 1.0 } else { 0.0 })
            }
            TargetProfile::Values(v) => Some(v.std * v.std),
        }
    }

    /// What the user should fix, in order of consequence.
    pub fn findings(&self) -> Vec<DataFinding> {
        let mut out = Vec::new();
        if self.max_abs > UNSCALED_ABOVE && !self.standardized {
            out.push(DataFinding::Unscaled {
                max_abs: self.max_abs,
                feature: self.max_abs_feature,
            });
        }
        match &self.targets {
            TargetProfile::Classes { counts } => out.extend(class_finding(counts, None)),
            TargetProfile::Labels { counts, blank } => {
                out.extend(class_finding(counts, Some(*blank)));
            }
            TargetProfile::Values(v) if v.min == v.max => {
                out.push(DataFinding::ConstantTargets { value: v.min });
            }
            TargetProfile::Values(v) => {
                if !self.standardized
                    && (v.std > WIDE_TARGETS_STD
                        || v.mean.abs() > WIDE_TARGETS_STD * v.std.max(1.0))
                {
                    out.push(DataFinding::WideTargets {
                        mean: v.mean,
                        std: v.std,
                    });
                }
            }
        }
        if let Some(first) = self.first_constant {
            out.push(DataFinding::ConstantFeatures {
                count: self.constant_features,
                features: self.features,
                first,
            });
        }
        out
    }
}

/// A class no row holds, or else the rarest one where it is rare: over every
/// class of `counts` but `blank` (CTC's, never a label).
fn class_finding(counts: &[usize], blank: Option<usize>) -> Option<DataFinding> {
    let labelled = |c: &usize| Some(*c) != blank;
    let classes = counts.len();
    let missing: Vec<usize> = (0..classes)
        .filter(labelled)
        .filter(|&c| counts[c] == 0)
        .collect();
    if !missing.is_empty() {
        return Some(DataFinding::MissingClasses { missing, classes });
    }
    let total: usize = counts.iter().sum();
    let (class, n) = (0..classes)
        .filter(labelled)
        .map(|c| (c, counts[c]))
        .min_by_key(|c| c.1)?;
    let share = n as f64 / total.max(1) as f64;
    let labels = classes - usize::from(blank.is_some());
    (total > 0 && share < RARE_CLASS_SHARE / labels as f64).then_some(DataFinding::RareClass {
        class,
        share,
        classes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(max_abs: f64, targets: TargetProfile) -> DataProfile {
        DataProfile {
            rows: 100,
            features: 10,
            max_abs,
            max_abs_feature: 3,
            constant_features: 0,
            first_constant: None,
            targets,
            standardized: false,
            class_names: Vec::new(),
        }
    }

    #[test]
    fn raw_pixels_and_wide_targets_are_found_scaled_data_is_not() {
        let classes = TargetProfile::Classes {
            counts: vec![10, 12, 9],
        };
        let f = profile(255.0, classes.clone()).findings();
        assert_eq!(
            f,
            [DataFinding::Unscaled {
                max_abs: 255.0,
                feature: 3
            }]
        );
        assert!(profile(1.0, classes.clone()).findings().is_empty());
        let standardized = DataProfile {
            standardized: true,
            ..profile(255.0, classes)
        };
        assert!(
            standardized.findings().is_empty(),
            "it says what was done instead"
        );
        let targets = TargetProfile::Values(ColumnStats {
            min: 25.0,
            max: 346.0,
            mean: 152.0,
            std: 77.0,
        });
        assert_eq!(profile(1.0, targets).findings()[0].code(), "wide_targets");
        // One target in every row: nothing to learn, said as such (not as
        // wide targets, even where its value is large).
        for value in [5.0, 500.0] {
            let same = TargetProfile::Values(ColumnStats {
                min: value,
                max: value,
                mean: value,
                std: 0.0,
            });
            assert_eq!(
                profile(1.0, same).findings(),
                [DataFinding::ConstantTargets { value }]
            );
        }
    }

    #[test]
    fn the_prior_loss_is_what_ignoring_the_inputs_costs() {
        let even = profile(
            1.0,
            TargetProfile::Classes {
                counts: vec![5, 5, 0, 5, 5],
            },
        );
        assert!(
            (even.prior_loss().unwrap() - 4f64.ln()).abs() < 1e-12,
            "an empty class costs nothing"
        );
        let one = profile(1.0, TargetProfile::Classes { counts: vec![0, 9] });
        assert_eq!(one.prior_loss(), Some(0.0));
        let values = TargetProfile::Values(ColumnStats {
            min: 0.0,
            max: 9.0,
            mean: 3.0,
            std: 2.0,
        });
        assert_eq!(profile(1.0, values.clone()).prior_loss(), Some(4.0));
        let scaled = DataProfile {
            standardized: true,
            ..profile(1.0, values)
        };
        assert_eq!(scaled.prior_loss(), Some(1.0));
        let ctc = profile(
            1.0,
            TargetProfile::Labels {
                counts: vec![0, 3, 4],
                blank: 0,
            },
        );
        assert_eq!(ctc.prior_loss(), None);
    }

    #[test]
    fn missing_and_rare_classes_and_constant_features() {
        let p = profile(
            1.0,
            TargetProfile::Classes {
                counts: vec![50, 0, 50],
            },
        );
        assert_eq!(
            p.findings(),
            [DataFinding::MissingClasses {
                missing: vec![1],
                classes: 3
            }]
        );
        // 2 of 102 rows: under a fifth of an even third.
        let p = DataProfile {
            constant_features: 2,
            first_constant: Some(0),
            ..profile(
                1.0,
                TargetProfile::Classes {
                    counts: vec![50, 2, 50],
                },
            )
        };
        let codes: Vec<&str> = p.findings().iter().map(DataFinding::code).collect();
        assert_eq!(codes, ["rare_class", "constant_features"]);
    }
}
