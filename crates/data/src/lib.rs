//! Training data for batchfit.
//!
//! Readers for `.npy`/`.npz`, CSV and IDX (MNIST's format, gzip or not)
//! ([`read`]); binding the arrays to a model's inputs and loss with every shape,
//! label range and value checked before training ([`Dataset::bind`]); shuffled
//! batching with a seed ([`Batcher`]); and the UCI optical digits set shipped
//! as the built-in default ([`digits`]).

pub mod lengths;
pub mod profile;
pub mod read;

use batchfit_graph::{Graph, InputKind, LossKind};
pub use batchfit_tune::dataset::LabelCol;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use read::Array;
use std::path::Path;

/// Why data cannot be used; each names the file, key or row.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("{path}: {source}")]
    File {
        path: String,
        #[source]
        source: read::FormatError,
    },
}

/// Targets, checked against the model's loss.
#[derive(Clone, Debug)]
pub enum Targets {
    /// Regression values, `elems` per row.
    Dense { values: Vec<f32>, elems: usize },
    /// Class indices, `per_row` per row (frames for per-frame losses), each below `classes`.
    Classes {
        labels: Vec<usize>,
        per_row: usize,
        classes: usize,
    },
    /// Label sequences for CTC: row r's labels are the first `lengths[r]` of
    /// `labels[r * width..(r + 1) * width]` (the rest is padding, held as 0),
    /// each a class below `classes` other than `blank`.
    Sequences {
        labels: Vec<usize>,
        width: usize,
        lengths: Vec<usize>,
        classes: usize,
        blank: usize,
    },
}

/// Rows bound to a model: one array per model input, in the model's input order.
#[derive(Clone, Debug)]
pub struct Dataset {
    pub source: String,
    pub rows: usize,
    /// Row-major values of each input; `input_elems[i]` per row.
    pub inputs: Vec<Vec<f32>>,
    pub input_elems: Vec<usize>,
    pub targets: Targets,
    /// The classes' names where the file named them (a CSV's label column of
    /// names): class i is `class_names[i]`.
    pub class_names: Option<Vec<String>>,
}

/// A label column of class names is for a classifier with a class for each:
/// said before binding, naming the classes, rather than as a number out of range.
fn names_fit_the_model(
    path: &str,
    names: &[String],
    graph: &Graph,
    seq_len: usize,
) -> Result<(), DataError> {
    let shown = |names: &[String]| {
        let mut s = names.iter().take(5).cloned().collect::<Vec<_>>().join(", ");
        if names.len() > 5 {
            s.push_str(", ...");
        }
        s
    };
    let why = match graph.loss.kind {
        LossKind::CrossEntropy | LossKind::CrossEntropyPerFrame => {
            let out = graph.output().shape.resolve(seq_len);
            let classes = out.last().copied().unwrap_or(0);
            (names.len() > classes).then(|| {
                format!(
                    "the label column names {} classes ({}), the model predicts {classes}",
                    names.len(),
                    shown(names)
                )
            })
        }
        _ => Some(format!(
            "the label column holds class names ({}), but the model's loss is not cross-entropy: a classifier (--loss ce) predicts classes",
            shown(names)
        )),
    };
    match why {
        Some(why) => Err(DataError::File {
            path: path.to_string(),
            source: why.into(),
        }),
        None => Ok(()),
    }
}

/// How to read `--data`.
#[derive(Clone, Debug, Default)]
pub struct ReadOptions {
    /// Labels for single-array formats (`.npy`, IDX).
    pub labels: Option<String>,
    /// CSV label column (negative counts from the end; default: the last).
    pub label_col: Option<LabelCol>,
}

impl Dataset {
    /// Reads `path` (by extension) and binds it to `graph`, whose sequence length is `seq_len`.
    pub fn load(
        path: &str,
        opts: &ReadOptions,
        graph: &Graph,
        seq_len: usize,
    ) -> Result<Dataset, DataError> {
        let p = Path::new(path);
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or(path);
        let mut class_names = None;
        // Only a single array (.npy, IDX) takes its targets from a file of
        // their own: an .npz holds them, a CSV has its label column.
        if let Some(l) = &opts.labels
            && !(name.ends_with(".npy") || name.contains("idx") || name.contains("ubyte"))
        {
            return Err(DataError::File {
                path: path.to_string(),
                source: format!("--labels {l} is for single-array data (.npy, IDX); this file carries its own targets (an .npz its `target` array, a CSV its label column: --label-col)").into(),
            });
        }
        let arrays: Vec<(String, Array)> = if name.ends_with(".npz") {
            read::npz(p)?
        } else if name.ends_with(".npy") {
            let mut v = vec![("x".to_string(), read::npy(p)?)];
            if let Some(l) = &opts.labels {
                v.push(("target".to_string(), read_single(l)?));
            }
            v
        } else if [".csv", ".csv.gz", ".tsv", ".tsv.gz"]
            .iter()
            .any(|e| name.ends_with(e))
        {
            let read::Csv { x, y, classes } = read::csv(p, opts.label_col.as_ref())?;
            class_names = classes;
            vec![("x".to_string(), x), ("target".to_string(), y)]
        } else if name.contains("idx") || name.contains("ubyte") {
            let mut v = vec![("x".to_string(), read::idx(p)?)];
            if let Some(l) = &opts.labels {
                v.push(("target".to_string(), read_single(l)?));
            }
            v
        } else {
            return Err(DataError::File {
                path: path.to_string(),
                source: "unknown data format: use .npy, .npz, .csv or .tsv (gzipped or not) or an IDX file (*idx*, *ubyte*)".into(),
            });
        };
        if let Some(names) = &class_names {
            names_fit_the_model(path, names, graph, seq_len)?;
        }
        let mut data = Dataset::bind_from(path, opts.labels.as_deref(), arrays, graph, seq_len)?;
        data.class_names = class_names;
        Ok(data)
    }

    /// Matches named arrays to the model's inputs and loss, checking everything.
    pub fn bind(
        source: &str,
        arrays: Vec<(String, Array)>,
        graph: &Graph,
        seq_len: usize,
    ) -> Result<Dataset, DataError> {
        Dataset::bind_from(source, None, arrays, graph, seq_len)
    }

    /// [`Dataset::bind`] with the targets read from a file of their own
    /// (`--labels`): what is wrong with them names that file.
    pub fn bind_from(
        source: &str,
        labels_source: Option<&str>,
        arrays: Vec<(String, Array)>,
        graph: &Graph,
        seq_len: usize,
    ) -> Result<Dataset, DataError> {
        let fail = |why: String| DataError::File {
            path: source.to_string(),
            source: why.into(),
        };
        let target_fail = |why: String| DataError::File {
            path: labels_source.unwrap_or(source).to_string(),
            source: why.into(),
        };
        let keys: Vec<&str> = arrays.iter().map(|(k, _)| k.as_str()).collect();
        let find = |names: &[&str]| {
            arrays
                .iter()
                .find(|(k, _)| names.contains(&k.as_str()))
                .map(|(k, a)| (k.as_str(), a))
        };
        let single = graph.inputs.len() == 1;
        let mut inputs = Vec::new();
        let mut input_elems = Vec::new();
        let mut rows: Option<(usize, String)> = None;
        let mut check_rows = |key: &str, n: usize| -> Result<(), DataError> {
            match &rows {
                None => {
                    rows = Some((n, key.to_string()));
                    Ok(())
                }
                Some((m, k)) if *m != n => {
                    Err(fail(format!("key `{key}` has {n} rows but `{k}` has {m}")))
                }
                _ => Ok(()),
            }
        };
        for input in &graph.inputs {
            let names: Vec<&str> = if single {
                // `x_train`/`y_train`: Keras's datasets (mnist.npz) and the
                // tutorials that save them; their test split is left alone.
                vec![
                    input.name.as_str(),
                    "x",
                    "inputs",
                    "data",
                    "features",
                    "x_train",
                ]
            } else {
                vec![input.name.as_str()]
            };
            let (key, a) = find(&names).ok_or_else(|| {
                fail(format!(
                    "no array for model input `{}` (the file has {}); name it `{}`",
                    input.name,
                    keys.join(", "),
                    input.name
                ))
            })?;
            let want = input.shape.resolve(seq_len);
            let elems: usize = want.iter().product();
            if a.row_elems() != elems {
                return Err(fail(format!(
                    "key `{key}`: expected rows of shape {want:?} ({elems} values) for input `{}`, found {:?} ({} values)",
                    input.name,
                    a.row_shape(),
                    a.row_elems()
                )));
            }
            check_rows(key, a.rows())?;
            check_finite(key, a, &fail)?;
            if let InputKind::Tokens { vocab } = input.kind
                && let Some(i) = a
                    .values
                    .iter()
                    .position(|&v| v < 0.0 || v.fract() != 0.0 || v as usize >= vocab)
            {
                return Err(fail(format!(
                    "key `{key}` row {}: token id {} is not in 0..{vocab}",
                    i / elems + 1,
                    a.values[i]
                )));
            }
            inputs.push(a.values.clone());
            input_elems.push(elems);
        }
        let (key, t) = find(&["target", "y", "labels", "label", "y_train"]).ok_or_else(|| {
            fail(format!("no `target` array (the file has {}); labels for single-array formats come from --labels", keys.join(", ")))
        })?;
        check_rows(key, t.rows())?;
        check_finite(key, t, &target_fail)?;
        let out = graph.output().shape.resolve(seq_len);
        let targets = match graph.loss.kind {
            LossKind::Mse => {
                let elems: usize = out.iter().product();
                if t.row_elems() != elems {
                    return Err(target_fail(format!(
                        "key `{key}`: the model's output has {elems} values per row ({out:?}), the target {:?}",
                        t.row_shape()
                    )));
                }
                Targets::Dense {
                    values: t.values.clone(),
                    elems,
                }
            }
            LossKind::CrossEntropy | LossKind::CrossEntropyPerFrame => {
                let classes = *out.last().expect("logits have classes");
                let per_row: usize = out[..out.len() - 1].iter().product();
                // One-hot rows (Keras's `to_categorical`) are their classes.
                let decoded;
                let values: &[f32] = if classes > 1 && t.row_elems() == per_row * classes {
                    decoded = one_hot_classes(&t.values, classes).map_err(|i| {
                        target_fail(format!(
                            "key `{key}` row {}: {classes} values a label are read as one-hot, and these are not (one 1, the rest 0)",
                            i / per_row + 1
                        ))
                    })?;
                    &decoded
                } else if t.row_elems() == per_row {
                    &t.values
                } else {
                    return Err(target_fail(format!(
                        "key `{key}`: expected {per_row} class label(s) per row (or {} one-hot values), found shape {:?}",
                        per_row * classes,
                        t.row_shape()
                    )));
                };
                // Labels numbered 1..=K (UCI's wine, R's factors as codes) for
                // K classes: the losses of PyTorch and Keras refuse them too.
                let from_one =
                    values.iter().all(|&v| v >= 1.0) && values.contains(&(classes as f32));
                let mut labels = Vec::with_capacity(values.len());
                for (i, &v) in values.iter().enumerate() {
                    if v < 0.0 || v.fract() != 0.0 || v as usize >= classes {
                        return Err(target_fail(format!(
                            "key `{key}` row {}: label {v} is not a class of the model (0..{classes}){}",
                            i / per_row + 1,
                            if from_one {
                                format!(
                                    "; the labels run from 1 to {classes}: number the classes from 0 (subtract 1), as cross-entropy in PyTorch and Keras expects"
                                )
                            } else {
                                String::new()
                            }
                        )));
                    }
                    labels.push(v as usize);
                }
                Targets::Classes {
                    labels,
                    per_row,
                    classes,
                }
            }
            LossKind::Ctc { blank } => {
                sequences(t, &out, blank).map_err(|(row, why)| match row {
                    Some(r) => target_fail(format!("key `{key}` row {r}: {why}")),
                    None => target_fail(format!("key `{key}`: {why}")),
                })?
            }
        };
        let rows = rows.map(|r| r.0).unwrap_or(0);
        if rows == 0 {
            return Err(fail("no rows".into()));
        }
        Ok(Dataset {
            source: source.to_string(),
            rows,
            inputs,
            input_elems,
            targets,
            class_names: None,
        })
    }

    /// The rows `idx` of input `i`.
    pub fn gather_input(&self, i: usize, idx: &[usize]) -> Vec<f32> {
        rows_of(&self.inputs[i], self.input_elems[i], idx)
    }

    /// Training and validation rows: a seeded shuffle, the first `share`
    /// (at least one row, at most all but one) held out.
    pub fn split(&self, share: f64, seed: u64) -> (Dataset, Dataset) {
        let (train, val) = self.split_rows(share, seed);
        (self.subset(&train), self.subset(&val))
    }

    /// The rows [`Dataset::split`] puts in training and in validation, in
    /// the order its subsets hold them.
    pub fn split_rows(&self, share: f64, seed: u64) -> (Vec<usize>, Vec<usize>) {
        split_indices(self.rows, share, seed)
    }

    /// A subset of rows (for train/validation splits).
    pub fn subset(&self, idx: &[usize]) -> Dataset {
        let targets = match &self.targets {
            Targets::Dense { values, elems } => Targets::Dense {
                values: rows_of(values, *elems, idx),
                elems: *elems,
            },
            Targets::Classes {
                labels,
                per_row,
                classes,
            } => Targets::Classes {
                labels: rows_of(labels, *per_row, idx),
                per_row: *per_row,
                classes: *classes,
            },
            Targets::Sequences {
                labels,
                width,
                lengths,
                classes,
                blank,
            } => Targets::Sequences {
                labels: rows_of(labels, *width, idx),
                width: *width,
                lengths: rows_of(lengths, 1, idx),
                classes: *classes,
                blank: *blank,
            },
        };
        Dataset {
            source: self.source.clone(),
            rows: idx.len(),
            inputs: (0..self.inputs.len())
                .map(|i| self.gather_input(i, idx))
                .collect(),
            input_elems: self.input_elems.clone(),
            targets,
            class_names: self.class_names.clone(),
        }
    }
}

fn read_single(path: &str) -> Result<Array, DataError> {
    let p = Path::new(path);
    if path.ends_with(".npy") {
        read::npy(p)
    } else {
        read::idx(p)
    }
}

fn check_finite(key: &str, a: &Array, fail: &dyn Fn(String) -> DataError) -> Result<(), DataError> {
    if let Some(i) = a.values.iter().position(|v| !v.is_finite()) {
        let e = a.row_elems().max(1);
        return Err(fail(format!(
            "key `{key}` row {}: value {} is not finite",
            i / e + 1,
            a.values[i]
        )));
    }
    Ok(())
}

/// `sweep`'s default share of rows held out for validation, and the seed of
/// its split: the split `sweep --verify` checks an advice with unless told otherwise.
pub const DEFAULT_VAL_SPLIT: f64 = 0.1;
pub const DEFAULT_SPLIT_SEED: u64 = 0;

/// Training and validation rows of a data set of `rows` rows: a seeded
/// shuffle, the first `share` (at least one row, at most all but one) held out.
pub fn split_indices(rows: usize, share: f64, seed: u64) -> (Vec<usize>, Vec<usize>) {
    let mut idx: Vec<usize> = (0..rows).collect();
    idx.shuffle(&mut StdRng::seed_from_u64(seed));
    let train = idx.split_off(held_out_rows(rows, share));
    (train, idx)
}

/// Rows [`split_indices`] holds out of `rows` for a `share`.
fn held_out_rows(rows: usize, share: f64) -> usize {
    ((rows as f64 * share).ceil() as usize)
        .clamp(1, rows.saturating_sub(1).max(1))
        .min(rows)
}

/// Draws batches by shuffling the rows each epoch with a seed.
pub struct Batcher {
    order: Vec<usize>,
    pos: usize,
    pub epoch: usize,
    rng: StdRng,
}

impl Batcher {
    pub fn new(rows: usize, seed: u64) -> Batcher {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut order: Vec<usize> = (0..rows).collect();
        order.shuffle(&mut rng);
        Batcher {
            order,
            pos: 0,
            epoch: 0,
            rng,
        }
    }

    /// The next `b` row indices, reshuffling when an epoch runs out (a batch
    /// never straddles two epochs; the remainder of an epoch is dropped).
    pub fn next(&mut self, b: usize) -> Vec<usize> {
        let b = b.min(self.order.len());
        if self.pos + b > self.order.len() {
            self.order.shuffle(&mut self.rng);
            self.pos = 0;
            self.epoch += 1;
        }
        let out = self.order[self.pos..self.pos + b].to_vec();
        self.pos += b;
        out
    }
}

/// The UCI optical digits set (1,797 8x8 images, 10 classes; the scikit-learn
/// copy, BSD-3, see `data/DIGITS.rst`), pixels scaled from 0..16 to 0..1.
pub mod digits {
    use super::*;

    /// The gzipped CSV: 64 pixel columns then the label.
    pub const CSV_GZ: &[u8] = include_bytes!("../data/digits.csv.gz");
    /// The name `--data` accepts for it.
    pub const NAME: &str = "builtin:digits";

    /// The digits bound to `graph` (which must take 64 inputs and predict 10 classes).
    pub fn load(graph: &Graph) -> Result<Dataset, DataError> {
        let read::Csv { mut x, y, .. } = read::csv_bytes(
            &read::gunzip(CSV_GZ).map_err(|source| DataError::File {
                path: NAME.into(),
                source,
            })?,
            None,
        )
        .map_err(|source| DataError::File {
            path: NAME.into(),
            source,
        })?;
        for v in &mut x.values {
            *v /= 16.0;
        }
        Dataset::bind(NAME, vec![("x".into(), x), ("target".into(), y)], graph, 1)
    }
}

/// The class of each one-hot group of `classes` values, or the index of the
/// first group that is not one-hot (a single 1, every other value 0).
fn one_hot_classes(values: &[f32], classes: usize) -> Result<Vec<f32>, usize> {
    values
        .chunks(classes)
        .enumerate()
        .map(|(i, group)| {
            let hot = group.iter().position(|&v| v == 1.0).ok_or(i)?;
            let rest_zero = group.iter().enumerate().all(|(j, &v)| j == hot || v == 0.0);
            if rest_zero { Ok(hot as f32) } else { Err(i) }
        })
        .collect()
}

/// Rows `idx` of a row-major table of `width` values a row.
fn rows_of<T: Copy>(values: &[T], width: usize, idx: &[usize]) -> Vec<T> {
    let mut out = Vec::with_capacity(idx.len() * width);
    for &r in idx {
        out.extend_from_slice(&values[r * width..(r + 1) * width]);
    }
    out
}

/// CTC's label sequences from an array of rows `[N, S]` (or `[N]`, one label
/// each): a row's labels come first and negative values pad it to S, the usual
/// way to store sequences of unequal length in one array (PyTorch's padded
/// `targets` with their `target_lengths`). A failure names the 1-based row.
fn sequences(t: &Array, out: &[usize], blank: usize) -> Result<Targets, (Option<usize>, String)> {
    let [frames, classes] = out[..] else {
        return Err((
            None,
            format!("CTC reads outputs [T, C], the model's is {out:?}"),
        ));
    };
    let width = t.row_elems();
    if t.row_shape().len() > 1 || width == 0 {
        return Err((
            None,
            format!(
                "CTC targets are rows of labels [N, S] padded with negative values, found rows of {:?}",
                t.row_shape()
            ),
        ));
    }
    let mut labels = Vec::with_capacity(t.values.len());
    let mut lengths = Vec::with_capacity(t.rows());
    for (r, row) in t.values.chunks(width).enumerate() {
        let at = |why: String| (Some(r + 1), why);
        let len = row.iter().position(|&v| v < 0.0).unwrap_or(width);
        if let Some(k) = row[len..].iter().position(|&v| v >= 0.0) {
            return Err(at(format!(
                "label {} at position {} follows the padding at {}; pad at the end",
                row[len + k],
                len + k + 1,
                len + 1
            )));
        }
        if len == 0 {
            return Err(at("no label (the row is all padding)".into()));
        }
        for &v in &row[..len] {
            if v.fract() != 0.0 || v as usize >= classes {
                return Err(at(format!(
                    "label {v} is not a class of the model (0..{classes})"
                )));
            }
            if v as usize == blank {
                return Err(at(format!("label {v} is the blank (--blank {blank})")));
            }
        }
        // A path through the frames emits each label and a blank between repeats.
        let repeats = row[..len].windows(2).filter(|w| w[0] == w[1]).count();
        if len + repeats > frames {
            return Err(at(format!(
                "{len} labels ({repeats} repeated) need {} frames, the model outputs {frames}",
                len + repeats
            )));
        }
        labels.extend(row.iter().map(|&v| if v < 0.0 { 0 } else { v as usize }));
        lengths.push(len);
    }
    Ok(Targets::Sequences {
        labels,
        width,
        lengths,
        classes,
        blank,
    })
}

#[cfg(test)]
mod tests;
