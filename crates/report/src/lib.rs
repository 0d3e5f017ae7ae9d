//! Reports: the evidence and decisions of `batchfit_tune` rendered as terminal
//! tables, JSON documents (schema in `docs/json.md`) and HTML pages. Nothing is
//! decided here; every sentence about a decision is ([`prose`]).

pub mod advise;
pub mod data;
pub mod json;
pub mod lengths;
pub mod noise;
pub mod plan;
pub mod plots;
pub mod probe;
pub mod prose;
pub mod run;
pub mod scale;
pub mod sweep;

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

/// A duration in seconds as every report prints it: "-" when unknown, then
/// ms with three decimals under 10 ms, one under 1 s, seconds to two minutes,
/// minutes above.
pub fn duration(s: f64) -> String {
    if !s.is_finite() {
        "-".into()
    } else if s < 0.01 {
        format!("{:.3} ms", s * 1e3)
    } else if s < 1.0 {
        format!("{:.1} ms", s * 1e3)
    } else if s < 120.0 {
        format!("{s:.2} s")
    } else {
        format!("{:.1} min", s / 60.0)
    }
}

/// What the timings' noise says about a knee: its range when it is not one
/// batch, and where the throughput is flat within the noise.
pub fn knee_noise(r: Option<&batchfit_tune::knee::KneeRange>) -> String {
    let Some(r) = r else {
        return String::new();
    };
    let mut out = String::new();
    if r.low != r.high {
        out.push_str(&format!(
            "; within the timings' noise anywhere from {} to {}",
            thousands(r.low),
            thousands(r.high)
        ));
    }
    out.push_str(&format!(
        "; throughput flat within noise from batch {} up",
        thousands(r.flat_from)
    ));
    out
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

/// Escapes text for HTML.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A self-contained HTML page in batchfit's report style: inline SVG, no
/// scripts, no external fonts, so it opens offline.
pub fn page(title: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>batchfit — {}</title>\n<style>\n\
         body {{ font-family: sans-serif; max-width: 1100px; margin: 2em auto; color: #222; }}\n\
         pre {{ background: #f6f6f6; padding: 1em; white-space: pre-wrap; font-size: 12px; line-height: 1.25; }}\n\
         figure {{ margin: 1.5em 0; }} figcaption {{ font-size: 13px; color: #555; max-width: 760px; }}\n\
         .meta {{ color: #555; font-size: 13px; }} code {{ font-size: 12px; }}\n\
         </style>\n</head>\n<body>\n{}</body>\n</html>\n",
        esc(title),
        body
    )
}

/// Figures with captions as HTML `<figure>` elements.
pub fn figures_html(figs: Vec<(plots::Figure, String)>) -> String {
    let mut out = String::new();
    for (fig, caption) in figs {
        out.push_str("<figure>\n");
        out.push_str(&fig.svg(760, 420));
        out.push_str(&format!(
            "\n<figcaption>{}</figcaption>\n</figure>\n",
            esc(&caption)
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn one_duration_format() {
        assert_eq!(super::duration(f64::NAN), "-");
        assert_eq!(super::duration(0.000_42), "0.420 ms");
        assert_eq!(super::duration(0.0425), "42.5 ms");
        assert_eq!(super::duration(3.456), "3.46 s");
        assert_eq!(super::duration(600.0), "10.0 min");
    }

    #[test]
    fn thousands_separators() {
        assert_eq!(super::thousands(87_229), "87,229");
        assert_eq!(super::thousands(999), "999");
        assert_eq!(super::thousands(1_000_000), "1,000,000");
    }
}
