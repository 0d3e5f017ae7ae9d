//! Readers: each turns a file into named arrays, with the file named in every error.

use crate::DataError;
use batchfit_tune::dataset::LabelCol;
use flate2::read::GzDecoder;
use std::error::Error as StdError;
use std::io::Read;
use std::path::Path;

/// An array read from a file: shape including the leading row dimension.
#[derive(Clone, Debug, PartialEq)]
pub struct Array {
    pub shape: Vec<usize>,
    pub values: Vec<f32>,
    /// Whether the file stored integers (labels, token ids).
    pub integral: bool,
}

impl Array {
    /// Rows (the leading dimension).
    pub fn rows(&self) -> usize {
        self.shape.first().copied().unwrap_or(0)
    }

    /// Shape of one row.
    pub fn row_shape(&self) -> &[usize] {
        &self.shape[1.min(self.shape.len())..]
    }

    /// Elements per row.
    pub fn row_elems(&self) -> usize {
        self.row_shape().iter().product()
    }
}

/// What is wrong with a file's contents, with the reader library's error
/// behind it when there is one.
#[derive(Debug, thiserror::Error)]
#[error("{why}{}", .source.as_ref().map(|s| format!(": {s}")).unwrap_or_default())]
pub struct FormatError {
    pub why: String,
    #[source]
    pub source: Option<Box<dyn StdError + Send + Sync>>,
}

impl FormatError {
    /// `why`, caused by `source`.
    pub fn because(
        why: impl Into<String>,
        source: impl Into<Box<dyn StdError + Send + Sync>>,
    ) -> Self {
        FormatError {
            why: why.into(),
            source: Some(source.into()),
        }
    }
}

impl From<String> for FormatError {
    fn from(why: String) -> Self {
        FormatError { why, source: None }
    }
}

impl From<&str> for FormatError {
    fn from(why: &str) -> Self {
        why.to_string().into()
    }
}

fn err(path: &Path, why: impl Into<FormatError>) -> DataError {
    DataError::File {
        path: path.display().to_string(),
        source: why.into(),
    }
}

fn read_bytes(path: &Path) -> Result<Vec<u8>, DataError> {
    std::fs::read(path).map_err(|e| err(path, FormatError::because("cannot read", e)))
}

/// Reads one `.npy` array of f32, f64, u8, i32 or i64.
pub fn npy(path: &Path) -> Result<Array, DataError> {
    let bytes = read_bytes(path)?;
    npy_bytes(&bytes).map_err(|why| err(path, why))
}

/// An `.npy` file's bytes to its array; see [`npy()`].
pub fn npy_bytes(bytes: &[u8]) -> Result<Array, FormatError> {
    header_nesting(bytes)?;
    let file =
        npyz::NpyFile::new(bytes).map_err(|e| FormatError::because("not a valid .npy file", e))?;
    npy_file(file, bytes.len() as u64)
}

/// A plain array's header is a dict holding a shape tuple: brackets nest two
/// deep. npyz parses the header with a backtracking grammar whose time grows
/// exponentially with the nesting, so a header nesting deeper than any array
/// we read is refused before it is parsed (a 500-byte file once took minutes).
fn header_nesting(bytes: &[u8]) -> Result<(), FormatError> {
    const DEEPEST: usize = 3;
    if bytes.len() < 10 || !bytes.starts_with(b"\x93NUMPY") {
        return Ok(()); // npyz names what is wrong
    }
    let (start, len) = match bytes[6] {
        1 => (10, u16::from_le_bytes([bytes[8], bytes[9]]) as usize),
        _ if bytes.len() >= 12 => (
            12,
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
        ),
        _ => return Ok(()),
    };
    let text = &bytes[start.min(bytes.len())..start.saturating_add(len).min(bytes.len())];
    let (mut depth, mut deepest, mut quote) = (0usize, 0usize, None);
    for &c in text {
        match (quote, c) {
            (Some(q), _) if c == q => quote = None,
            (Some(_), _) => {}
            (None, b'\'' | b'"') => quote = Some(c),
            (None, b'(' | b'[' | b'{') => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            (None, b')' | b']' | b'}') => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    if deepest > DEEPEST {
        return Err(
            format!("the header nests brackets {deepest} deep; a plain array's nests 2").into(),
        );
    }
    Ok(())
}

/// The array of `file`, whose data can be at most `available` bytes: a header
/// claiming more is refused before anything is allocated for it.
fn npy_file<R: Read>(file: npyz::NpyFile<R>, available: u64) -> Result<Array, FormatError> {
    if file.order() == npyz::Order::Fortran {
        return Err("Fortran-ordered arrays are not supported; save with C order".into());
    }
    let shape: Vec<usize> = file
        .shape()
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| format!("dimension {d} is too large")))
        .collect::<Result<_, _>>()?;
    let item_bytes = match file.dtype() {
        npyz::DType::Plain(t) => t.num_bytes().unwrap_or(0) as u64,
        _ => 0,
    };
    let claimed = shape
        .iter()
        .try_fold(item_bytes, |acc, &d| acc.checked_mul(d as u64));
    if claimed.is_none_or(|c| c > available) {
        return Err(format!(
            "the header's shape {shape:?} needs more data than the file's {available} bytes"
        )
        .into());
    }
    let type_str = match file.dtype() {
        npyz::DType::Plain(t) => t.to_string(),
        other => {
            return Err(
                format!("unsupported dtype {other:?}; use f32, f64, u8 or integers").into(),
            );
        }
    };
    let bad = |e: std::io::Error| {
        FormatError::because(format!("cannot decode the array ({type_str})"), e)
    };
    let kind = type_str.trim_start_matches(['<', '>', '|', '=']);
    let (values, integral): (Vec<f32>, bool) = match kind {
        "f4" => (file.into_vec::<f32>().map_err(bad)?, false),
        "f8" => (
            file.into_vec::<f64>()
                .map_err(bad)?
                .into_iter()
                .map(|x| x as f32)
                .collect(),
            false,
        ),
        "u1" => (
            file.into_vec::<u8>()
                .map_err(bad)?
                .into_iter()
                .map(f32::from)
                .collect(),
            true,
        ),
        "i4" => (
            file.into_vec::<i32>()
                .map_err(bad)?
                .into_iter()
                .map(|x| x as f32)
                .collect(),
            true,
        ),
        "i8" => (
            file.into_vec::<i64>()
                .map_err(bad)?
                .into_iter()
                .map(|x| x as f32)
                .collect(),
            true,
        ),
        "u4" => (
            file.into_vec::<u32>()
                .map_err(bad)?
                .into_iter()
                .map(|x| x as f32)
                .collect(),
            true,
        ),
        "u8" => (
            file.into_vec::<u64>()
                .map_err(bad)?
                .into_iter()
                .map(|x| x as f32)
                .collect(),
            true,
        ),
        other => {
            return Err(
                format!("unsupported dtype `{other}`; use f32, f64, u8 or integers").into(),
            );
        }
    };
    if shape.is_empty() {
        return Err("a 0-d array has no rows".into());
    }
    Ok(Array {
        shape,
        values,
        integral,
    })
}

/// Reads every array of an `.npz` archive, by key.
pub fn npz(path: &Path) -> Result<Vec<(String, Array)>, DataError> {
    let bytes = read_bytes(path)?;
    npz_bytes(&bytes).map_err(|why| err(path, why))
}

/// An `.npz` archive's bytes to its arrays, by key; see [`npz()`].
pub fn npz_bytes(bytes: &[u8]) -> Result<Vec<(String, Array)>, FormatError> {
    let mut archive = npyz::npz::NpzArchive::new(std::io::Cursor::new(bytes))
        .map_err(|e| FormatError::because("not a valid .npz archive", e))?;
    let names: Vec<String> = archive.array_names().map(String::from).collect();
    if names.is_empty() {
        return Err("the archive holds no arrays".into());
    }
    // A compressed entry can hold more than the archive's size; this bounds
    // what a lying header can make us allocate (1,000 times the archive).
    let available = (bytes.len() as u64).saturating_mul(1000);
    let mut out = Vec::new();
    for name in names {
        // The entry is read whole (at most `available` bytes) so that its
        // header is checked before npyz parses it.
        let mut entry = Vec::new();
        archive
            .zip_archive()
            .by_name(&npyz::npz::file_name_from_array_name(&name))
            .map_err(|e| FormatError::because(format!("key `{name}`"), e))?
            .take(available.saturating_add(1 << 16))
            .read_to_end(&mut entry)
            .map_err(|e| FormatError::because(format!("key `{name}`"), e))?;
        header_nesting(&entry).map_err(|e| FormatError::because(format!("key `{name}`"), e))?;
        let file = npyz::NpyFile::new(&entry[..])
            .map_err(|e| FormatError::because(format!("key `{name}`"), e))?;
        let array = npy_file(file, available)
            .map_err(|e| FormatError::because(format!("key `{name}`"), e))?;
        out.push((name, array));
    }
    Ok(out)
}

/// Which field of a CSV row does not parse, by column (and header name,
/// where the file has one), and what an empty one means: pandas writes a
/// missing value as an empty field. The label column (`skip`) may hold class
/// names and is not looked at.
fn not_a_number(
    row: &str,
    rec: &csv::StringRecord,
    header: Option<&csv::StringRecord>,
    skip: Option<usize>,
) -> String {
    let Some((j, field)) = rec
        .iter()
        .enumerate()
        .find(|&(j, f)| Some(j) != skip && number(f).is_none())
    else {
        return format!("row {row}: a field is not a number");
    };
    let name = header
        .and_then(|h| h.get(j))
        .map(|n| format!(" (`{}`)", n.trim()))
        .unwrap_or_default();
    let column = format!("row {row}, column {}{name}", j + 1);
    if field.trim().is_empty() {
        format!("{column} is empty: a missing value; drop or fill the rows that have one")
    } else if is_missing_marker(field) {
        format!(
            "{column}: `{}` marks a missing value; drop or fill the rows that have one",
            field.trim()
        )
    } else {
        format!(
            "{column}: `{}` is not a number (a category: encode it as numbers first, one 0/1 column per value)",
            field.trim()
        )
    }
}

/// A feature field as a number: a decimal, or a boolean as 1 or 0 (R writes
/// `TRUE`/`FALSE`, pandas `True`/`False`; every library trains on them as
/// 0/1).
fn number(field: &str) -> Option<f32> {
    let f = field.trim();
    f.parse::<f32>().ok().or_else(|| {
        if f.eq_ignore_ascii_case("true") {
            Some(1.0)
        } else if f.eq_ignore_ascii_case("false") {
            Some(0.0)
        } else {
            None
        }
    })
}

/// The markers data sets write for a missing value: R's and pandas' `NA`,
/// UCI's `?`, and their kin (`NaN` parses as a number; the data checks find it).
fn is_missing_marker(field: &str) -> bool {
    const MARKERS: [&str; 8] = ["na", "n/a", "?", "null", "none", "nil", "-", "."];
    MARKERS.contains(&field.trim().to_ascii_lowercase().as_str())
}

/// Whether a first row whose features do not all parse is a header: most of
/// them are names. A row of numbers with a `?` or `NA` among them is data
/// with a missing value, which the reader reports by row and column.
fn looks_like_header(rec: &csv::StringRecord, col: usize) -> bool {
    let features: Vec<&str> = rec
        .iter()
        .enumerate()
        .filter(|&(j, _)| j != col)
        .map(|(_, f)| f.trim())
        .collect();
    let names = features
        .iter()
        .filter(|f| number(f).is_none() && !is_missing_marker(f))
        .count();
    2 * names > features.len()
}

/// The field delimiter of CSV text: the comma, unless the first line holds
/// none and more semicolons (UCI's wine-quality files, spreadsheets in locales
/// whose decimal mark is the comma) or tabs (TSV). The csv crate reads one
/// given delimiter and does not guess it.
fn delimiter(bytes: &[u8]) -> u8 {
    let first = bytes.split(|&b| b == b'\n').next().unwrap_or(&[]);
    let count = |d: u8| first.iter().filter(|&&b| b == d).count();
    if count(b',') > 0 {
        return b',';
    }
    match (count(b';'), count(b'\t')) {
        (0, 0) => b',',
        (semi, tab) if semi >= tab => b';',
        _ => b'\t',
    }
}

/// A CSV file's features and labels.
#[derive(Clone, Debug, PartialEq)]
pub struct Csv {
    pub x: Array,
    pub y: Array,
    /// Where the label column holds names (`setosa`, `Gentoo`) rather than
    /// numbers: the names, sorted; each row's label is its name's index here
    /// (as scikit-learn's `LabelEncoder` numbers them). `None`: numeric labels.
    pub classes: Option<Vec<String>>,
}

/// Header names that say a column is the label.
const LABEL_NAMES: [&str; 4] = ["label", "labels", "target", "class"];

/// The column the header names as the label, where it is not `col`, the one
/// the label is read from (one such column only: two leave it open).
fn label_named_elsewhere(header: &csv::StringRecord, col: usize) -> Option<(usize, String)> {
    let named: Vec<(usize, &str)> = header
        .iter()
        .enumerate()
        .filter(|(_, n)| LABEL_NAMES.contains(&n.trim().to_ascii_lowercase().as_str()))
        .map(|(j, n)| (j, n.trim()))
        .collect();
    match named[..] {
        [(j, name)] if j != col => Some((j, name.to_string())),
        _ => None,
    }
}

/// Reads a CSV file: one row per sample, a header optional (detected when
/// most of the first line's features are names, not numbers), fields
/// separated by commas, or by semicolons or tabs where the first line has no
/// comma. The label column may hold numbers or class names ([`Csv::classes`]).
pub fn csv(path: &Path, label_col: Option<&LabelCol>) -> Result<Csv, DataError> {
    let bytes = read_maybe_gz(path)?;
    csv_bytes(&bytes, label_col).map_err(|why| err(path, why))
}

/// A label field as read: a number, or a class name.
enum Label {
    Number(f32),
    Name(String),
}

/// Whether row 0's label, a name, is a header's beside the rows below: it
/// names no other row, and every name below names at least two. (A true
/// class of one row, first in the file, reads as a header: a class that one
/// row shows can be neither learned nor validated.)
fn header_name(labels: &[Label]) -> bool {
    let Some(Label::Name(first)) = labels.first() else {
        return false;
    };
    let mut counts: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for l in &labels[1..] {
        if let Label::Name(n) = l {
            *counts.entry(n.as_str()).or_default() += 1;
        }
    }
    !counts.is_empty() && !counts.contains_key(first.as_str()) && counts.values().all(|&c| c >= 2)
}

/// CSV text to features and labels; see [`csv()`].
pub fn csv_bytes(bytes: &[u8], label_col: Option<&LabelCol>) -> Result<Csv, FormatError> {
    // Spreadsheets (Excel's "CSV UTF-8") start the file with a byte-order mark.
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let mut reader = csv::ReaderBuilder::new()
        .delimiter(delimiter(bytes))
        .has_headers(false)
        .flexible(true)
        .from_reader(bytes);
    let mut x: Vec<f32> = Vec::new();
    let mut labels: Vec<Label> = Vec::new();
    // Per row: whether its features were written as integers.
    let mut integral: Vec<bool> = Vec::new();
    let mut header: Option<csv::StringRecord> = None;
    // (width, label column) from the first record.
    let mut layout: Option<(usize, usize)> = None;
    // Row 0 when only its label is not a number: a header whose other names
    // are numbers ("0,1,...,783,label"), or a first row with a class name.
    let mut first_named = false;
    for (i, rec) in reader.records().enumerate() {
        // Rows are counted as the data's (a header is none of them), as the
        // later checks of the values count them; with a header, the file's
        // line beside it.
        let place = |i: usize, header: bool| match header {
            true => format!("row {i} (line {})", i + 1),
            false => format!("row {}", i + 1),
        };
        let rec = rec.map_err(|e| FormatError::because(place(i, header.is_some()), e))?;
        let (width, col) = match layout {
            Some(l) => l,
            None => {
                let width = rec.len();
                if width < 2 {
                    return Err("needs at least one feature column and a label column".into());
                }
                let col = match label_col.unwrap_or(&LabelCol::Index(-1)) {
                    LabelCol::Index(c) if *c < 0 && (-c) as usize <= width => width - (-c) as usize,
                    LabelCol::Index(c) if *c >= 0 && (*c as usize) < width => *c as usize,
                    LabelCol::Index(c) => {
                        return Err(
                            format!("--label-col {c} is outside the {width} columns").into()
                        );
                    }
                    LabelCol::Name(name) => {
                        let Some(j) = rec.iter().position(|f| f.trim() == name) else {
                            return Err(format!(
                                "--label-col {name}: the first row names no column so (it reads {})",
                                rec.iter().take(8).collect::<Vec<_>>().join(", ")
                            )
                            .into());
                        };
                        // The row that names the label column is the header.
                        layout = Some((width, j));
                        header = Some(rec);
                        continue;
                    }
                };
                *layout.insert((width, col))
            }
        };
        if rec.len() != width {
            return Err(format!(
                "{} has {} fields, the first has {width}",
                place(i, header.is_some()),
                rec.len()
            )
            .into());
        }
        let features: Option<Vec<f32>> = rec
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != col)
            .map(|(_, f)| number(f))
            .collect();
        let Some(features) = features else {
            if i == 0 && looks_like_header(&rec, col) {
                header = Some(rec); // a header
                continue;
            }
            return Err(not_a_number(
                &place(i, header.is_some()),
                &rec,
                header.as_ref(),
                Some(col),
            )
            .into());
        };
        let field = rec[col].trim();
        let label = match field.parse::<f32>() {
            Ok(v) => Label::Number(v),
            Err(_) if field.is_empty() => {
                return Err(
                    not_a_number(&place(i, header.is_some()), &rec, header.as_ref(), None).into(),
                );
            }
            Err(_) if i == 0 => {
                first_named = true;
                Label::Name(field.to_string())
            }
            Err(_) => Label::Name(field.to_string()),
        };
        integral.push(rec.iter().enumerate().all(|(j, f)| {
            let f = f.trim();
            j == col
                || !f.contains(['.', 'e', 'E'])
                || f.eq_ignore_ascii_case("true")
                || f.eq_ignore_ascii_case("false")
        }));
        x.extend(features);
        labels.push(label);
    }
    let (width, _) = layout.ok_or(FormatError::from("no data rows"))?;
    // Row 0's name was a header's where the rows below give it away: their
    // labels are all numbers, or their names each name two rows or more and
    // row 0's names none of them (a header whose feature names are numbers,
    // such as years, over a column of class names: "2000,...,2017,indicator").
    if first_named
        && (labels[1..].iter().all(|l| matches!(l, Label::Number(_))) || header_name(&labels))
    {
        labels.remove(0);
        integral.remove(0);
        x.drain(..width - 1);
    }
    if labels.is_empty() {
        return Err("no data rows".into());
    }
    let n = labels.len();
    let numbers: Option<Vec<f32>> = labels
        .iter()
        .map(|l| match l {
            Label::Number(v) => Some(*v),
            Label::Name(_) => None,
        })
        .collect();
    let (y, classes) = if let Some(y) = numbers {
        (y, None)
    } else {
        // Class names (a number among them is a name too: "1" beside "setosa").
        let text = |l: &Label| match l {
            Label::Number(v) => v.to_string(),
            Label::Name(s) => s.clone(),
        };
        let mut names: Vec<String> = labels.iter().map(text).collect();
        names.sort();
        names.dedup();
        let y = labels
            .iter()
            .map(|l| names.binary_search(&text(l)).unwrap_or(0) as f32)
            .collect();
        (y, Some(names))
    };
    let labels_integral = y.iter().all(|v: &f32| v.fract() == 0.0);
    // The label is the last column unless --label-col says otherwise; a
    // header that names another column the label (Kaggle's MNIST CSV puts
    // `label` first) would otherwise train on a pixel, silently where that
    // pixel is 0 in every row.
    if let (Some(h), None) = (&header, label_col)
        && let Some((j, name)) = label_named_elsewhere(h, width - 1)
    {
        return Err(format!(
            "the header names column {} `{name}`, but the label is read from the last column unless --label-col says otherwise: give --label-col {j} (or --label-col {name}; --label-col -1 for the last)",
            j + 1
        )
        .into());
    }
    Ok(Csv {
        x: Array {
            shape: vec![n, width - 1],
            values: x,
            integral: integral.iter().all(|&b| b),
        },
        y: Array {
            shape: vec![n],
            values: y,
            integral: labels_integral,
        },
        classes,
    })
}

/// Reads an IDX file (MNIST's format), gzipped or not.
pub fn idx(path: &Path) -> Result<Array, DataError> {
    let bytes = read_maybe_gz(path)?;
    idx_bytes(&bytes).map_err(|why| err(path, why))
}

/// An IDX file's (uncompressed) bytes to its array; see [`idx()`].
pub fn idx_bytes(b: &[u8]) -> Result<Array, FormatError> {
    if b.len() < 4 || b[0] != 0 || b[1] != 0 {
        return Err("not an IDX file (bad magic number)".into());
    }
    let (type_code, rank) = (b[2], b[3] as usize);
    let head = 4 + 4 * rank;
    if rank == 0 || b.len() < head {
        return Err("truncated IDX header".into());
    }
    let shape: Vec<usize> = (0..rank)
        .map(|i| u32::from_be_bytes(b[4 + 4 * i..8 + 4 * i].try_into().expect("4 bytes")) as usize)
        .collect();
    let width: usize = match type_code {
        0x08 | 0x09 => 1,
        0x0B => 2,
        0x0C | 0x0D => 4,
        0x0E => 8,
        t => return Err(format!("unknown IDX element type 0x{t:02X}").into()),
    };
    let body = &b[head..];
    let n = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
    let Some(n) = n.filter(|n| {
        n.checked_mul(width)
            .is_some_and(|bytes| bytes <= body.len())
    }) else {
        return Err(format!(
            "truncated: {} bytes of data for the header's shape {shape:?}",
            body.len()
        )
        .into());
    };
    let values: Vec<f32> = match type_code {
        0x08 => body[..n].iter().map(|&v| f32::from(v)).collect(),
        0x09 => body[..n].iter().map(|&v| f32::from(v as i8)).collect(),
        0x0B => body
            .chunks_exact(2)
            .take(n)
            .map(|c| f32::from(i16::from_be_bytes([c[0], c[1]])))
            .collect(),
        0x0C => body
            .chunks_exact(4)
            .take(n)
            .map(|c| i32::from_be_bytes(c.try_into().expect("4")) as f32)
            .collect(),
        0x0D => body
            .chunks_exact(4)
            .take(n)
            .map(|c| f32::from_be_bytes(c.try_into().expect("4")))
            .collect(),
        _ => body
            .chunks_exact(8)
            .take(n)
            .map(|c| f64::from_be_bytes(c.try_into().expect("8")) as f32)
            .collect(),
    };
    Ok(Array {
        shape,
        values,
        integral: type_code <= 0x0C,
    })
}

/// The file's bytes, gunzipped when they start with the gzip magic.
fn read_maybe_gz(path: &Path) -> Result<Vec<u8>, DataError> {
    let bytes = read_bytes(path)?;
    if bytes.starts_with(&[0x1f, 0x8b]) {
        gunzip(&bytes).map_err(|why| err(path, why))
    } else {
        Ok(bytes)
    }
}

/// Decompresses gzip bytes.
pub fn gunzip(bytes: &[u8]) -> Result<Vec<u8>, FormatError> {
    let mut out = Vec::new();
    GzDecoder::new(bytes)
        .read_to_end(&mut out)
        .map_err(|e| FormatError::because("bad gzip data", e))?;
    Ok(out)
}

#[cfg(test)]
mod tests;
