//! Sequence lengths of a data set (`--lengths FILE[:KEY]`), in the model's
//! sequence axis (frames, tokens): a text file with one length per line, a CSV
//! column, an `.npy` array, an `.npz` key, or a padding mask from which the
//! lengths are counted.

use crate::DataError;
use crate::read::{self, Array, FormatError};
use std::path::Path;

/// Lengths above this are refused as a unit mistake (samples instead of frames).
const MAX_LENGTH: f64 = 1e7;

/// Reads the lengths named by `spec`: `FILE`, or `FILE:KEY` where KEY is a CSV
/// column (header name or 0-based index) or an `.npz` key.
pub fn read_lengths(spec: &str) -> Result<Vec<u64>, DataError> {
    let (path, key) = split_key(spec);
    let p = Path::new(path);
    let fail = |why: FormatError| DataError::File {
        path: path.to_string(),
        source: why,
    };
    let bytes = std::fs::read(p).map_err(|e| fail(FormatError::because("cannot read", e)))?;
    let name = p.file_name().and_then(|n| n.to_str()).unwrap_or(path);
    lengths_bytes(name, key, &bytes).map_err(fail)
}

/// The lengths in a file's `bytes`, its format told by its `name` (see [`read_lengths`]).
pub fn lengths_bytes(name: &str, key: Option<&str>, bytes: &[u8]) -> Result<Vec<u64>, FormatError> {
    let lengths = if name.ends_with(".npz") {
        let arrays = read::npz_bytes(bytes)?;
        let (key, array) = npz_entry(&arrays, key)?;
        from_array(array).map_err(|e| FormatError::because(format!("key `{key}`"), e))?
    } else if name.ends_with(".npy") {
        from_array(&read::npy_bytes(bytes)?)?
    } else {
        let text =
            std::str::from_utf8(bytes).map_err(|e| FormatError::because("not a text file", e))?;
        if name.ends_with(".csv") || name.ends_with(".tsv") {
            from_csv(text, key, name.ends_with(".tsv"))?
        } else if key.is_some() {
            return Err(
                "`:KEY` names a CSV column or an .npz key; a text file holds one length per line"
                    .into(),
            );
        } else {
            from_lines(text)?
        }
    };
    if lengths.is_empty() {
        return Err("holds no lengths".into());
    }
    Ok(lengths)
}

/// `FILE:KEY` splits at the last colon when what follows has no path separator
/// (so `C:\clips.txt` and `./a:b/lengths.txt` stay whole).
fn split_key(spec: &str) -> (&str, Option<&str>) {
    match spec.rsplit_once(':') {
        Some((path, key)) if !path.is_empty() && !key.is_empty() && !key.contains(['/', '\\']) => {
            (path, Some(key))
        }
        _ => (spec, None),
    }
}

/// The `.npz` array named `key`; without a key, `lengths`, else the one array.
fn npz_entry<'a>(
    arrays: &'a [(String, Array)],
    key: Option<&'a str>,
) -> Result<(&'a str, &'a Array), FormatError> {
    let names = || {
        arrays
            .iter()
            .map(|(k, _)| format!("`{k}`"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let wanted = match key {
        Some(k) => k,
        None if arrays.len() == 1 => &arrays[0].0,
        None => "lengths",
    };
    arrays
        .iter()
        .find(|(k, _)| k == wanted)
        .map(|(k, a)| (k.as_str(), a))
        .ok_or_else(|| {
            format!(
                "no key `{wanted}` (the archive holds {}); name one with FILE.npz:KEY",
                names()
            )
            .into()
        })
}

/// A 1-d array of lengths, or a 2-d padding mask (rows x frames) of 0s and 1s.
fn from_array(a: &Array) -> Result<Vec<u64>, FormatError> {
    match a.shape.as_slice() {
        [_] => a
            .values
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                whole(f64::from(v)).map_err(|why| format!("row {}: {why}", i + 1).into())
            })
            .collect(),
        [_, frames] if *frames > 0 => from_mask(&a.values, *frames),
        shape => Err(format!(
            "shape {shape:?}: expected one length per row (1-d) or a padding mask (rows x frames)"
        )
        .into()),
    }
}

/// Lengths from a mask. An attention mask marks real frames with 1 and is a run of
/// 1s then 0s; PyTorch's `key_padding_mask` marks padding with 1 and, right-padded,
/// is a run of 0s then 1s. Every row must follow one and the same convention;
/// anything else is refused rather than guessed.
fn from_mask(values: &[f32], frames: usize) -> Result<Vec<u64>, FormatError> {
    let mut real_first = true; // every row is 1..1 0..0
    let mut pad_last = true; // every row is 0..0 1..1
    let mut ones = Vec::new();
    for (r, row) in values.chunks_exact(frames).enumerate() {
        if let Some(c) = row.iter().position(|&v| v != 0.0 && v != 1.0) {
            return Err(format!(
                "row {} frame {c}: {} in a padding mask, which holds 0s and 1s",
                r + 1,
                row[c]
            )
            .into());
        }
        let n = row.iter().filter(|&&v| v == 1.0).count();
        real_first &= row[..n].iter().all(|&v| v == 1.0);
        pad_last &= row[frames - n..].iter().all(|&v| v == 1.0);
        ones.push(n as u64);
    }
    let lengths: Vec<u64> = match (real_first, pad_last) {
        (true, _) => ones,
        (false, true) => ones.iter().map(|&n| frames as u64 - n).collect(),
        (false, false) => {
            return Err(
                "a mask whose rows are neither 1s then 0s (attention mask) nor 0s then 1s (padding mask): give the lengths instead"
                    .into(),
            );
        }
    };
    match lengths.iter().position(|&n| n == 0) {
        Some(r) => Err(format!("row {}: a mask with no real frame", r + 1).into()),
        None => Ok(lengths),
    }
}

fn from_lines(text: &str) -> Result<Vec<u64>, FormatError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let v: f64 = line
            .parse()
            .map_err(|_| format!("line {}: `{line}` is not a number", i + 1))?;
        out.push(whole(v).map_err(|why| format!("line {}: {why}", i + 1))?);
    }
    Ok(out)
}

fn from_csv(text: &str, key: Option<&str>, tabs: bool) -> Result<Vec<u64>, FormatError> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .delimiter(if tabs { b'\t' } else { b',' })
        .from_reader(text.as_bytes());
    let mut rows = reader.records();
    let first = match rows.next() {
        Some(r) => r.map_err(|e| FormatError::because("row 1", e))?,
        None => return Err("no rows".into()),
    };
    let header = first.iter().any(|f| f.trim().parse::<f64>().is_err());
    let col = match key {
        Some(k) if header => first
            .iter()
            .position(|f| f.trim() == k)
            .or_else(|| k.parse().ok().filter(|&c: &usize| c < first.len())),
        Some(k) => k.parse().ok().filter(|&c: &usize| c < first.len()),
        None if first.len() == 1 => Some(0),
        None => None,
    };
    let Some(col) = col else {
        return Err(match key {
            Some(k) => format!("no column `{k}` among {} columns", first.len()),
            None => format!(
                "{} columns: name the lengths column with FILE:COLUMN",
                first.len()
            ),
        }
        .into());
    };
    let mut out = Vec::new();
    let data_rows = (!header).then_some(Ok(first)).into_iter().chain(rows);
    for (i, rec) in data_rows.enumerate() {
        let row = i + 1 + usize::from(header);
        let rec = rec.map_err(|e| FormatError::because(format!("row {row}"), e))?;
        let field = rec
            .get(col)
            .ok_or_else(|| format!("row {row} has no column {col}"))?
            .trim();
        let v: f64 = field
            .parse()
            .map_err(|_| format!("row {row}: `{field}` is not a number"))?;
        out.push(whole(v).map_err(|why| format!("row {row}: {why}"))?);
    }
    Ok(out)
}

/// A length: a positive whole number of frames or tokens.
fn whole(v: f64) -> Result<u64, String> {
    if !(v.is_finite() && v >= 1.0 && v.fract() == 0.0 && v <= MAX_LENGTH) {
        return Err(format!(
            "{v} is not a length: lengths are whole numbers of the model's sequence steps (frames, tokens), 1 to {MAX_LENGTH:e}; convert seconds to frames first"
        ));
    }
    Ok(v as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn array(shape: &[usize], values: &[f32]) -> Array {
        Array {
            shape: shape.to_vec(),
            values: values.to_vec(),
            integral: true,
        }
    }

    #[test]
    fn lines_skip_blanks_and_comments() {
        assert_eq!(from_lines("# clips\n120\n\n 75 \n").unwrap(), vec![120, 75]);
        let e = from_lines("120\n7.5\n").unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("7.5"), "{e}");
        assert!(from_lines("0\n").is_err());
        assert!(
            from_lines("abc\n")
                .unwrap_err()
                .to_string()
                .contains("line 1")
        );
    }

    #[test]
    fn csv_by_header_or_index() {
        let text = "path,frames\na.wav,100\nb.wav,250\n";
        assert_eq!(
            from_csv(text, Some("frames"), false).unwrap(),
            vec![100, 250]
        );
        assert_eq!(from_csv(text, Some("1"), false).unwrap(), vec![100, 250]);
        let e = from_csv(text, None, false).unwrap_err().to_string();
        assert!(e.contains("FILE:COLUMN"), "{e}");
        assert_eq!(from_csv("5\n6\n", None, false).unwrap(), vec![5, 6]);
        let e = from_csv("n\n5\nx\n", None, false).unwrap_err().to_string();
        assert!(e.contains("row 3"), "{e}");
        assert_eq!(from_csv("a\tn\nx\t9\n", Some("n"), true).unwrap(), vec![9]);
    }

    #[test]
    fn masks_in_either_convention() {
        // Attention masks: 1s for real frames, then padding.
        let attention = array(&[2, 4], &[1., 1., 0., 0., 1., 1., 1., 1.]);
        assert_eq!(from_array(&attention).unwrap(), vec![2, 4]);
        // key_padding_mask: 1s mark the padding at the end.
        let padding = array(&[2, 4], &[0., 0., 1., 1., 0., 0., 0., 1.]);
        assert_eq!(from_array(&padding).unwrap(), vec![2, 3]);
        let mixed = array(&[2, 3], &[1., 0., 0., 0., 0., 1.]);
        assert!(
            from_array(&mixed)
                .unwrap_err()
                .to_string()
                .contains("neither")
        );
        let empty_row = array(&[1, 3], &[0., 0., 0.]);
        assert!(from_array(&empty_row).is_err());
        assert!(from_array(&array(&[1, 2], &[1., 2.])).is_err());
        assert_eq!(
            from_array(&array(&[3], &[4., 5., 6.])).unwrap(),
            vec![4, 5, 6]
        );
    }

    #[test]
    fn keys_split_only_where_unambiguous() {
        assert_eq!(split_key("a.csv:frames"), ("a.csv", Some("frames")));
        assert_eq!(split_key("lengths.txt"), ("lengths.txt", None));
        assert_eq!(split_key("./x:y/lengths.txt"), ("./x:y/lengths.txt", None));
    }

    #[test]
    fn npz_key_chosen_or_refused() {
        let arrays = vec![
            ("x".to_string(), array(&[1], &[1.])),
            ("lengths".to_string(), array(&[1], &[3.])),
        ];
        assert_eq!(npz_entry(&arrays, None).unwrap().0, "lengths");
        assert_eq!(npz_entry(&arrays, Some("x")).unwrap().0, "x");
        let e = npz_entry(&arrays, Some("mask")).unwrap_err().to_string();
        assert!(e.contains("`x`, `lengths`"), "{e}");
    }
}
