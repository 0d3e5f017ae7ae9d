//! Mutations at three levels: bytes, text tokens, JSON nodes. Every choice is
//! drawn from the `Unstructured` source, so an input is replayed from its seed.

use arbitrary::{Result, Unstructured};
use serde_json::Value;

/// Numbers that break arithmetic: zero, negatives, the edges of integer
/// types, floats that overflow or underflow, NaN and infinities as text.
pub const NASTY_NUMBERS: &[&str] = &[
    "0",
    "-0",
    "-1",
    "1",
    "2",
    "0.5",
    "1e308",
    "-1e308",
    "1e-320",
    "4294967295",
    "4294967296",
    "9223372036854775807",
    "18446744073709551615",
    "18446744073709551616",
    "-9223372036854775808",
    "nan",
    "inf",
    "-inf",
    "1e9",
    "3.5",
];

/// A few byte-level edits: flips, interesting bytes, inserted, deleted,
/// duplicated and truncated ranges.
pub fn bytes(u: &mut Unstructured, data: &mut Vec<u8>) -> Result<()> {
    for _ in 0..u.int_in_range(1..=6)? {
        let len = data.len();
        match u.int_in_range(0..=5)? {
            0 if len > 0 => {
                let i = u.choose_index(len)?;
                data[i] ^= 1 << u.int_in_range(0..=7)?;
            }
            1 if len > 0 => {
                let i = u.choose_index(len)?;
                data[i] = *u.choose(&[0u8, 0xff, 0x7f, 0x80, 1, b'\n', b'"'])?;
            }
            2 => {
                let i = u.int_in_range(0..=len)?;
                let extra: Vec<u8> = (0..u.int_in_range(1..=16)?)
                    .map(|_| u.arbitrary())
                    .collect::<Result<_>>()?;
                data.splice(i..i, extra);
            }
            3 if len > 0 => {
                let i = u.choose_index(len)?;
                let n = u.int_in_range(1..=(len - i).min(64))?;
                data.drain(i..i + n);
            }
            4 if len > 0 => {
                let i = u.choose_index(len)?;
                let n = u.int_in_range(1..=(len - i).min(64))?;
                let copy = data[i..i + n].to_vec();
                let at = u.int_in_range(0..=len)?;
                data.splice(at..at, copy);
            }
            5 if len > 0 => {
                let keep = u.int_in_range(0..=len)?;
                data.truncate(keep);
            }
            _ => {}
        }
    }
    Ok(())
}

/// Token-level edits of a text format: a number swapped for a nasty one,
/// lines deleted, duplicated or swapped, a delimiter inserted.
pub fn text(u: &mut Unstructured, text: &str) -> Result<String> {
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    for _ in 0..u.int_in_range(1..=4)? {
        if lines.is_empty() {
            lines.push(String::new());
        }
        let i = u.choose_index(lines.len())?;
        match u.int_in_range(0..=5)? {
            0 | 1 => lines[i] = swap_number(u, &lines[i])?,
            2 => {
                lines.remove(i);
            }
            3 => {
                let copy = lines[i].clone();
                lines.insert(i, copy);
            }
            4 => {
                let j = u.choose_index(lines.len())?;
                lines.swap(i, j);
            }
            _ => {
                let at = u.int_in_range(0..=lines[i].len())?;
                if lines[i].is_char_boundary(at) {
                    let c = *u.choose(&[',', ';', '"', '\'', '[', ']', '{', '}', '=', ' ', '#'])?;
                    lines[i].insert(at, c);
                }
            }
        }
    }
    Ok(lines.join("\n"))
}

/// `line` with one of its numbers (a run of digits, signs, dots and
/// exponents) replaced by a nasty one.
fn swap_number(u: &mut Unstructured, line: &str) -> Result<String> {
    let spans: Vec<(usize, usize)> = number_spans(line);
    if spans.is_empty() {
        return Ok(line.to_string());
    }
    let (start, end) = spans[u.choose_index(spans.len())?];
    Ok(format!(
        "{}{}{}",
        &line[..start],
        u.choose(NASTY_NUMBERS)?,
        &line[end..]
    ))
}

fn number_spans(line: &str) -> Vec<(usize, usize)> {
    let mut spans = Vec::new();
    let mut start = None;
    for (i, c) in line.char_indices() {
        let part = c.is_ascii_digit() || (start.is_some() && matches!(c, '.' | 'e' | 'E' | '-'));
        match (part, start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                spans.push((s, i));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        spans.push((s, line.len()));
    }
    spans
}

/// A JSON value that breaks a reader expecting another: every type, and
/// numbers at the edges.
pub fn json_scalar(u: &mut Unstructured) -> Result<Value> {
    Ok(match u.int_in_range(0..=9)? {
        0 => Value::Null,
        1 => Value::Bool(u.arbitrary()?),
        2 => Value::from(0),
        3 => Value::from(-1),
        4 => Value::from(u64::MAX),
        5 => Value::from(1e308),
        6 => Value::from(u.arbitrary::<f64>()?.clamp(-1e300, 1e300)),
        7 => Value::String(u.arbitrary::<String>()?),
        8 => Value::Array(Vec::new()),
        _ => Value::from(u.arbitrary::<i64>()?),
    })
}

/// A few edits of a JSON document: a node replaced, a key removed, an array
/// element duplicated or removed.
pub fn json(u: &mut Unstructured, doc: &mut Value) -> Result<()> {
    for _ in 0..u.int_in_range(1..=4)? {
        let depth = u.int_in_range(0..=6)?;
        let node = pick(u, doc, depth)?;
        match u.int_in_range(0..=3)? {
            0 => *node = json_scalar(u)?,
            1 => {
                if let Value::Object(map) = node
                    && !map.is_empty()
                {
                    let key = map.keys().nth(u.choose_index(map.len())?).cloned();
                    key.map(|k| map.remove(&k));
                }
            }
            2 => {
                if let Value::Array(items) = node
                    && !items.is_empty()
                {
                    let i = u.choose_index(items.len())?;
                    let copy = items[i].clone();
                    items.insert(i, copy);
                }
            }
            _ => {
                if let Value::Array(items) = node
                    && !items.is_empty()
                {
                    let i = u.choose_index(items.len())?;
                    items.remove(i);
                }
            }
        }
    }
    Ok(())
}

/// A node about `depth` levels below `doc`, walking into random children.
fn pick<'a>(u: &mut Unstructured, doc: &'a mut Value, depth: usize) -> Result<&'a mut Value> {
    if depth == 0 {
        return Ok(doc);
    }
    let children = match doc {
        Value::Object(map) => map.len(),
        Value::Array(items) => items.len(),
        _ => 0,
    };
    if children == 0 {
        return Ok(doc);
    }
    let i = u.choose_index(children)?;
    match doc {
        Value::Object(map) => pick(u, map.values_mut().nth(i).expect("in range"), depth - 1),
        Value::Array(items) => pick(u, &mut items[i], depth - 1),
        _ => unreachable!("only containers have children"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_found_where_they_are() {
        assert_eq!(number_spans("a = 12, b = -3.5e2"), [(4, 6), (13, 18)]);
        assert_eq!(number_spans("x"), []);
    }
}
