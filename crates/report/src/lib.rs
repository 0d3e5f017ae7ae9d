//! Reports: terminal tables and JSON documents (schema in `docs/json.md`).

pub mod advise;
pub mod noise;
pub mod plan;
pub mod plots;
pub mod probe;

/// Version of the JSON documents; bumped when a field changes meaning or is removed.
pub const SCHEMA_VERSION: u32 = 1;

/// A table in batchfit's terminal style.
pub fn table(header: &[&str]) -> comfy_table::Table {
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::UTF8_BORDERS_ONLY)
        .set_content_arrangement(comfy_table::ContentArrangement::Dynamic)
        .set_header(header.iter().map(comfy_table::Cell::new));
    t
}

/// Right-aligns every column but the first `left` ones.
pub fn align_numbers(t: &mut comfy_table::Table, left: usize) {
    let n = t.column_count();
    for i in left..n {
        if let Some(c) = t.column_mut(i) {
            c.set_cell_alignment(comfy_table::CellAlignment::Right);
        }
    }
}

/// Thousands separators: `87229` -> `87,229`.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn thousands_separators() {
        assert_eq!(super::thousands(87_229), "87,229");
        assert_eq!(super::thousands(999), "999");
        assert_eq!(super::thousands(1_000_000), "1,000,000");
    }
}
