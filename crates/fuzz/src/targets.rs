//! The targets: one per reader, each with its generator.

use crate::Target;
use crate::mutate;
use crate::onnx::onnx;
use arbitrary::{Result, Unstructured};
use serde_json::Value;
use std::path::Path;

/// Every target, in the order CI runs them.
pub const TARGETS: &[Target] = &[
    Target {
        name: "onnx",
        generate: onnx,
        check: |b| batchfit_graph::onnx::parse(b).is_ok_and(|g| plans(&g)),
    },
    Target {
        name: "toml_spec",
        generate: toml_spec,
        check: |b| {
            batchfit_graph::spec::parse(&String::from_utf8_lossy(b)).is_ok_and(|g| plans(&g))
        },
    },
    Target {
        name: "npy",
        generate: npy,
        check: |b| batchfit_data::read::npy_bytes(b).is_ok(),
    },
    Target {
        name: "npz",
        generate: npz,
        check: |b| batchfit_data::read::npz_bytes(b).is_ok(),
    },
    Target {
        name: "csv",
        generate: csv,
        check: |b| {
            // The label column rides in the first byte, so it is fuzzed too.
            let (col, body) = b.split_first().map_or((0, b), |(c, rest)| (*c, rest));
            let label = (col != 0).then_some(batchfit_data::LabelCol::Index(col as i8 as isize));
            batchfit_data::read::csv_bytes(body, label.as_ref()).is_ok()
        },
    },
    Target {
        name: "idx",
        generate: idx,
        check: |b| batchfit_data::read::idx_bytes(b).is_ok(),
    },
    Target {
        name: "lengths",
        generate: lengths,
        check: check_lengths,
    },
    Target {
        name: "step_line",
        generate: step_lines,
        check: check_step_lines,
    },
    Target {
        name: "advice_json",
        generate: advice_json,
        check: |b| {
            let text = String::from_utf8_lossy(b);
            let Ok(advice) =
                batchfit_pipeline::verify::parse_advice(Path::new("advice.json"), &text)
            else {
                return false;
            };
            // What `sweep --verify` does next with it.
            for batch in advice.default_batches() {
                let _ = advice.epochs_for(batch, 1000);
            }
            true
        },
    },
    Target {
        name: "sweep_records",
        generate: sweep_records,
        check: check_sweep_records,
    },
];

/// `--lengths`: the format rides in the first byte (text, CSV with a column, `.npy`,
/// `.npz`); what is read is then cut into buckets and epochs as `plan --lengths` does.
fn check_lengths(b: &[u8]) -> bool {
    let (format, body) = b.split_first().map_or((0, b), |(f, rest)| (*f, rest));
    let (name, key) = match format % 4 {
        0 => ("lengths.txt", None),
        1 => ("lengths.csv", Some("frames")),
        2 => ("lengths.npy", None),
        _ => ("lengths.npz", None),
    };
    let Ok(lengths) = batchfit_data::lengths::lengths_bytes(name, key, body) else {
        return false;
    };
    use batchfit_tune::buckets::{EpochCost, LengthStats, Scheme, bucket_bounds, epoch};
    let stats = LengthStats::of(&lengths);
    let bounds = bucket_bounds(&lengths, 1 + usize::from(format) % 9);
    let batches: Vec<u64> = (0..bounds.len() as u64).map(|i| 1 + i * 3 % 17).collect();
    for scheme in [
        Scheme::Fixed { batch: 7 },
        Scheme::Buckets { bounds, batches },
        Scheme::Frames {
            budget: stats.max * 3,
        },
    ] {
        let e = epoch(&lengths, &scheme, 0);
        let cost = EpochCost::of(&e);
        assert_eq!(
            e.iter().map(|b| b.samples).sum::<u64>(),
            stats.samples,
            "every sequence in one batch"
        );
        assert!(cost.padding_waste >= 0.0 && cost.padding_waste < 1.0);
    }
    true
}

/// What every command does with a model it loaded: plan it, for each
/// runtime, on the CPU and a GPU (whose pages the plan packs), at a few
/// batches. A graph that loads must plan.
fn plans(graph: &batchfit_graph::Graph) -> bool {
    use batchfit_plan::host::{CpuHost, GemmKernel};
    use batchfit_plan::{Runtime, TrainOptions};
    let host = CpuHost {
        threads: 2,
        l2_bytes: 1 << 20,
        l2_ways: 8,
        gemm_kernel: GemmKernel::AVX2,
    };
    for (runtime, gpu) in [
        (Runtime::Burn, false),
        (Runtime::Burn, true),
        (Runtime::Pytorch, true),
    ] {
        let options = TrainOptions {
            runtime,
            gpu,
            ..TrainOptions::default()
        };
        let plan = batchfit_plan::plan::plan_on(graph, &options, host);
        for batch in [1, 64, 1 << 20] {
            let _ = plan.bytes_at(batch);
        }
    }
    true
}

// ---------------------------------------------------------------- lengths

/// A lengths file: text lines, a CSV with a `frames` column, or an `.npy`/`.npz`
/// array of lengths or of a padding mask; the first byte says which.
fn lengths(u: &mut Unstructured) -> Result<Vec<u8>> {
    let format: u8 = u.arbitrary()?;
    let n = u.int_in_range(0..=40)?;
    let mut values = Vec::with_capacity(n);
    for _ in 0..n {
        values.push(match u.int_in_range(0..=9)? {
            0 => 0,
            1 => u.int_in_range(1..=20_000_000)?,
            _ => u.int_in_range(1..=800)?,
        });
    }
    let body = match format % 4 {
        0 => values
            .iter()
            .map(|v| format!("{v}\n"))
            .collect::<String>()
            .into_bytes(),
        1 => {
            let mut t = String::from("path,frames\n");
            for (i, v) in values.iter().enumerate() {
                t.push_str(&format!("clip{i}.wav,{v}\n"));
            }
            t.into_bytes()
        }
        2 => npy_array(
            &[values.len()],
            &values.iter().map(|&v| v as f32).collect::<Vec<_>>(),
        ),
        _ => {
            // A padding mask: rows of 1s then 0s.
            let frames = u.int_in_range(1..=12)?;
            let mut mask = Vec::with_capacity(values.len() * frames);
            for v in &values {
                let ones = (*v as usize).min(frames);
                mask.extend((0..frames).map(|j| if j < ones { 1.0 } else { 0.0 }));
            }
            npz_of(&[("lengths", npy_array(&[values.len(), frames], &mask))])
        }
    };
    let mut out = vec![format];
    out.extend(body);
    if u.ratio(1, 4)? {
        mutate::bytes(u, &mut out)?;
    }
    Ok(out)
}

/// A valid little-endian f32 `.npy` file of `shape`.
fn npy_array(shape: &[usize], values: &[f32]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    let shape_text = match dims.as_slice() {
        [one] => format!("({one},)"),
        _ => format!("({})", dims.join(", ")),
    };
    let mut out = npy_header(format!(
        "{{'descr': '<f4', 'fortran_order': False, 'shape': {shape_text}, }}"
    ));
    out.extend(values.iter().flat_map(|v| v.to_le_bytes()));
    out
}

/// An `.npy` file's magic, version and header `dict`, padded as numpy pads it.
fn npy_header(dict: String) -> Vec<u8> {
    let mut header = dict.into_bytes();
    while !(10 + header.len() + 1).is_multiple_of(64) {
        header.push(b' ');
    }
    header.push(b'\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend((header.len() as u16).to_le_bytes());
    out.extend(header);
    out
}

/// An `.npz` archive holding `entries` (key, `.npy` bytes), stored.
fn npz_of(entries: &[(&str, Vec<u8>)]) -> Vec<u8> {
    use std::io::Write as _;
    let mut zip = zip_writer();
    for (key, body) in entries {
        let options =
            zip::write::FileOptions::default().compression_method(zip::CompressionMethod::Stored);
        if zip.start_file(format!("{key}.npy"), options).is_ok() {
            let _ = zip.write_all(body);
        }
    }
    zip.finish().map(|c| c.into_inner()).unwrap_or_default()
}

// ---------------------------------------------------------------- TOML

/// The specs the project ships, and shapes the tests write.
const TOML_SEEDS: &[&str] = &[
    include_str!("../../../examples/seed2-dual.toml"),
    include_str!("../../../bench/bilstm.toml"),
    include_str!("../seeds/spec-families.toml"),
];

/// Layer ops of the spec, with keys they take.
const SPEC_OPS: &[(&str, &[&str])] = &[
    ("linear", &["out_features", "bias"]),
    (
        "conv2d",
        &["out_channels", "kernel", "stride", "padding", "groups"],
    ),
    ("conv1d", &["out_channels", "kernel", "stride", "padding"]),
    ("maxpool", &["kernel", "stride", "padding"]),
    ("avgpool1d", &["kernel", "stride"]),
    ("global_avgpool", &[]),
    ("batchnorm", &[]),
    ("layernorm", &[]),
    ("rmsnorm", &[]),
    ("lstm", &["hidden", "bidirectional", "layers", "first"]),
    ("gru", &["hidden", "bidirectional", "bias"]),
    ("matmul", &["inputs"]),
    ("expand", &["shape"]),
    ("relu", &[]),
    ("softmax", &["dim"]),
    ("slice", &["dim", "start", "end"]),
    ("reduce_mean", &["dim", "keep_dims"]),
    ("transpose", &["perm"]),
    ("reshape", &["shape"]),
    ("flatten", &[]),
    ("concat", &["inputs", "dim"]),
    ("add", &["inputs"]),
    ("div", &["inputs"]),
    ("reduce_l2", &["dim", "keep_dims"]),
    ("mul_const", &["shape", "values"]),
    ("pad", &["pads", "value"]),
    ("embedding", &["vocab", "dim"]),
    ("add_param", &["shape"]),
    ("dropout", &[]),
    ("lrn", &["size"]),
];

fn toml_value(u: &mut Unstructured) -> Result<String> {
    Ok(match u.int_in_range(0..=5)? {
        0 => u.choose(mutate::NASTY_NUMBERS)?.to_string(),
        1 => u.int_in_range(0..=64u32)?.to_string(),
        2 => format!(
            "[{}]",
            (0..u.int_in_range(0..=4)?)
                .map(|_| Ok(u.int_in_range(0..=16i32)?.to_string()))
                .collect::<Result<Vec<_>>>()?
                .join(", ")
        ),
        3 => u.choose(&["true", "false"])?.to_string(),
        4 => format!(
            "\"{}\"",
            u.choose(&["same", "valid", "x", "prev", "l0", ""])?
        ),
        _ => "[\"x\", \"l0\"]".into(),
    })
}

/// A spec from the grammar: inputs, a chain of layers with keys they take
/// (and sometimes keys they do not), a loss.
fn toml_random(u: &mut Unstructured) -> Result<String> {
    let mut s = String::from("name = \"fuzz\"\n");
    if u.ratio(1, 3)? {
        s += &format!("seq_len = {}\n", toml_value(u)?);
    }
    let rank = u.int_in_range(0..=3)?;
    let shape: Vec<String> = (0..rank)
        .map(|_| Ok(u.int_in_range(0..=12u32)?.to_string()))
        .collect::<Result<_>>()?;
    s += &format!("[[input]]\nname = \"x\"\nshape = [{}]\n", shape.join(", "));
    if u.ratio(1, 4)? {
        s += &format!("kind = \"tokens\"\nvocab = {}\n", toml_value(u)?);
    }
    for i in 0..u.int_in_range(0..=6)? {
        let (op, keys) = *u.choose(SPEC_OPS)?;
        s += &format!("[[layer]]\nname = \"l{i}\"\nop = \"{op}\"\n");
        for key in keys.iter() {
            if u.ratio(3, 4)? {
                s += &format!("{key} = {}\n", toml_value(u)?);
            }
        }
        if u.ratio(1, 10)? {
            s += &format!(
                "{} = {}\n",
                u.choose(&["input", "kernel", "nonsense"])?,
                toml_value(u)?
            );
        }
    }
    if u.arbitrary()? {
        let kind = u.choose(&[
            "mse",
            "cross_entropy",
            "ctc",
            "cross_entropy_per_frame",
            "x",
        ])?;
        s += &format!("[loss]\nkind = \"{kind}\"\n");
        // The class axis and blank, in range or not (the batch, past the end).
        for key in ["class_axis", "blank"] {
            if u.arbitrary()? {
                s += &format!("{key} = {}\n", u.int_in_range(-4i64..=5)?);
            }
        }
    }
    Ok(s)
}

fn toml_spec(u: &mut Unstructured) -> Result<Vec<u8>> {
    let text = if u.arbitrary()? {
        let seed = *u.choose(TOML_SEEDS)?;
        mutate::text(u, seed)?
    } else {
        toml_random(u)?
    };
    Ok(text.into_bytes())
}

// ---------------------------------------------------------------- npy, npz, IDX

/// An `.npy` file from its grammar: magic, version, a header dict (dtype,
/// order, shape) padded as numpy pads it, and data of the right length or not.
fn npy_file(u: &mut Unstructured) -> Result<Vec<u8>> {
    let descr = *u.choose(&[
        "<f4", "<f8", "|u1", "<i4", "<i8", "<u4", "<u8", ">f4", "<f2", "|b1", "<c8", "O",
    ])?;
    let fortran = u.ratio(1, 8)?;
    let shape: Vec<u64> = (0..u.int_in_range(0..=4)?)
        .map(|_| {
            Ok(if u.ratio(1, 16)? {
                *u.choose(&[u64::MAX, 1 << 40, 1 << 32, 0])?
            } else {
                u.int_in_range(0..=6)?
            })
        })
        .collect::<Result<_>>()?;
    let shape_text = match shape.len() {
        1 => format!("({},)", shape[0]),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let dict = format!(
        "{{'descr': '{descr}', 'fortran_order': {}, 'shape': {shape_text}, }}",
        if fortran { "True" } else { "False" }
    );
    let mut out = npy_header(dict);
    let item: u64 = descr[descr.len() - 1..].parse().unwrap_or(1);
    let elements = shape
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d))
        .filter(|&n| n <= 512)
        .unwrap_or(4);
    let len = if u.ratio(1, 6)? {
        u.int_in_range(0..=64)?
    } else {
        elements * item
    };
    for _ in 0..len {
        out.push(u.arbitrary()?);
    }
    Ok(out)
}

fn npy(u: &mut Unstructured) -> Result<Vec<u8>> {
    let mut out = npy_file(u)?;
    if u.ratio(1, 4)? {
        mutate::bytes(u, &mut out)?;
    }
    Ok(out)
}

/// A zip archive of `.npy` entries (stored or deflated), by numpy's naming.
fn npz(u: &mut Unstructured) -> Result<Vec<u8>> {
    use std::io::Write as _;
    let mut zip = zip_writer();
    for i in 0..u.int_in_range(0..=3)? {
        let name = match u.int_in_range(0..=3)? {
            0 => format!("arr_{i}.npy"),
            1 => "x.npy".to_string(),
            2 => format!("dir/y{i}.npy"),
            _ => format!("labels{i}"),
        };
        let method = if u.arbitrary()? {
            zip::CompressionMethod::Stored
        } else {
            zip::CompressionMethod::Deflated
        };
        let options = zip::write::FileOptions::default().compression_method(method);
        let body = npy_file(u)?;
        if zip.start_file(name, options).is_ok() {
            let _ = zip.write_all(&body);
        }
    }
    let mut out = zip.finish().map(|c| c.into_inner()).unwrap_or_default();
    if u.ratio(1, 3)? {
        mutate::bytes(u, &mut out)?;
    }
    Ok(out)
}

fn zip_writer() -> zip::ZipWriter<std::io::Cursor<Vec<u8>>> {
    zip::ZipWriter::new(std::io::Cursor::new(Vec::new()))
}

/// An IDX file from its grammar: magic, element type, rank, big-endian
/// dimensions, data of the right length or not.
fn idx(u: &mut Unstructured) -> Result<Vec<u8>> {
    let type_code = *u.choose(&[0x08u8, 0x09, 0x0B, 0x0C, 0x0D, 0x0E, 0x0A])?;
    let rank = u.int_in_range(0..=4u8)?;
    let mut out = vec![0, 0, type_code, rank];
    let mut elements = 1u64;
    for _ in 0..rank {
        let d: u32 = if u.ratio(1, 10)? {
            *u.choose(&[u32::MAX, 1 << 16, 0])?
        } else {
            u.int_in_range(0..=8)?
        };
        elements = elements.saturating_mul(d as u64);
        out.extend(d.to_be_bytes());
    }
    let width = match type_code {
        0x0B => 2,
        0x0C | 0x0D => 4,
        0x0E => 8,
        _ => 1,
    };
    let len = if u.ratio(1, 5)? || elements > 4096 {
        u.int_in_range(0..=64)?
    } else {
        elements * width
    };
    for _ in 0..len {
        out.push(u.arbitrary()?);
    }
    if u.ratio(1, 5)? {
        mutate::bytes(u, &mut out)?;
    }
    Ok(out)
}

// ---------------------------------------------------------------- CSV

fn csv(u: &mut Unstructured) -> Result<Vec<u8>> {
    let label: i8 = *u.choose(&[0, 0, 1, 3, -1, -2, 100, -100])?;
    let width = u.int_in_range(0..=6)?;
    let mut text = String::new();
    if u.ratio(1, 3)? {
        text += &(0..width)
            .map(|i| format!("col{i}"))
            .collect::<Vec<_>>()
            .join(",");
        text.push('\n');
    }
    for _ in 0..u.int_in_range(0..=12)? {
        let cells: Vec<String> = (0..width)
            .map(|_| {
                Ok(match u.int_in_range(0..=7)? {
                    0 => u.choose(mutate::NASTY_NUMBERS)?.to_string(),
                    1 => String::new(),
                    2 => format!("\"{}\"", u.int_in_range(0..=9)?),
                    3 => format!("{:.3}", u.int_in_range(-1000..=1000)? as f64 / 7.0),
                    _ => u.int_in_range(0..=255)?.to_string(),
                })
            })
            .collect::<Result<_>>()?;
        text += &cells.join(*u.choose(&[",", ",", ",", ";", "\t"])?);
        text.push('\n');
    }
    let mut text = if u.ratio(1, 3)? {
        mutate::text(u, &text)?
    } else {
        text
    };
    if u.ratio(1, 10)? {
        text.insert(0, '\u{feff}');
    }
    let mut out = vec![label as u8];
    out.extend(text.into_bytes());
    Ok(out)
}

// ---------------------------------------------------------------- step lines

/// Lines as a user's command prints them: `BATCHFIT {json}` with every field
/// the protocol knows (sometimes of the wrong type or out of range), among
/// other output; the last line is a throughput regex's pattern.
fn step_lines(u: &mut Unstructured) -> Result<Vec<u8>> {
    let mut lines = Vec::new();
    for step in 0..u.int_in_range(0..=12)? {
        let mut doc = serde_json::json!({
            "step": step,
            "samples": 32,
            "seconds": 0.01,
        });
        if u.arbitrary()? {
            doc["loss"] = Value::from(0.5);
        }
        if u.arbitrary()? {
            doc["rank"] = Value::from(u.int_in_range(0..=3)?);
        }
        if u.arbitrary()? {
            doc["noise"] = serde_json::json!({
                "b_small": 4, "g_small_sq": 2.0, "b_big": 32, "g_big_sq": 1.1
            });
        }
        if u.ratio(1, 2)? {
            mutate::json(u, &mut doc)?;
        }
        let line = match u.int_in_range(0..=5)? {
            0 => format!(
                "epoch 1 step {step} loss 0.5 {:.4} samples/s",
                u.arbitrary::<f32>()?
            ),
            1 => format!("BATCHFIT {}", mutate::text(u, &doc.to_string())?),
            _ => format!("  BATCHFIT {doc}"),
        };
        lines.push(line);
    }
    lines.push(
        u.choose(&[
            r"(?P<samples_per_s>[0-9.e+-]+) samples/s",
            r"step (?P<step>\d+) .* (?P<seconds>[0-9.]+)",
            r"(?P<seconds>\S+)",
            r"(?P<samples>\d+) (?P<samples_per_s>\S+)",
        ])?
        .to_string(),
    );
    Ok(lines.join("\n").into_bytes())
}

fn check_step_lines(b: &[u8]) -> bool {
    use batchfit_exec::StepReader;
    let text = String::from_utf8_lossy(b);
    let mut lines: Vec<&str> = text.lines().collect();
    let pattern = lines.pop().unwrap_or_default();
    let mut readers = vec![StepReader::Protocol];
    readers.extend(StepReader::regex(pattern).ok());
    let mut read = false;
    for reader in readers {
        let reports: Vec<_> = lines
            .iter()
            .flat_map(|l| reader.read_line(l, 32))
            .filter_map(|r| r.ok())
            .collect();
        for warmup in [0, 1, 100] {
            read |= batchfit_exec::protocol::step_stats(&reports, 32, warmup).is_some();
        }
    }
    read
}

// ---------------------------------------------------------------- advice, sweep records

/// `batchfit advise --json` on the built-in model (tests/fixtures' quick flags).
const ADVICE_SEED: &str = include_str!("../seeds/advice.json");

fn advice_json(u: &mut Unstructured) -> Result<Vec<u8>> {
    let mut doc: Value = serde_json::from_str(ADVICE_SEED).expect("the seed is JSON");
    mutate::json(u, &mut doc)?;
    let mut text = serde_json::to_vec(&doc).expect("serialises");
    if u.ratio(1, 6)? {
        mutate::bytes(u, &mut text)?;
    }
    Ok(text)
}

/// A finished `batchfit sweep --out DIR` on the built-in model.
const SWEEP_SEEDS: &[(&str, &str)] = &[
    ("sweep.json", include_str!("../seeds/sweep/sweep.json")),
    (
        "run-b8-s0.json",
        include_str!("../seeds/sweep/run-b8-s0.json"),
    ),
    (
        "run-b32-s0.json",
        include_str!("../seeds/sweep/run-b32-s0.json"),
    ),
    (
        "run-b128-s0.json",
        include_str!("../seeds/sweep/run-b128-s0.json"),
    ),
];

/// A sweep folder as files separated by NUL: `name\0text\0name\0text...`,
/// one of them mutated (a record cut short, a field of the wrong type).
fn sweep_records(u: &mut Unstructured) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    for (name, text) in SWEEP_SEEDS {
        if u.ratio(1, 8)? {
            continue;
        }
        let mut body = text.as_bytes().to_vec();
        if u.ratio(1, 2)? {
            let mut doc: Value = serde_json::from_str(text).expect("the seed is JSON");
            mutate::json(u, &mut doc)?;
            body = serde_json::to_vec(&doc).expect("serialises");
        }
        if u.ratio(1, 6)? {
            mutate::bytes(u, &mut body)?;
        }
        body.retain(|&b| b != 0);
        out.extend(name.as_bytes());
        out.push(0);
        out.extend(body);
        out.push(0);
    }
    Ok(out)
}

fn check_sweep_records(b: &[u8]) -> bool {
    use std::sync::atomic::{AtomicU64, Ordering};
    static FOLDER: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "batchfit-fuzz-sweep-{}-{}",
        std::process::id(),
        FOLDER.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("temporary folder");
    let mut parts = b.split(|&c| c == 0);
    while let (Some(name), Some(text)) = (parts.next(), parts.next()) {
        let name = String::from_utf8_lossy(name).replace(['/', '\\'], "_");
        if !name.is_empty() && name != "." && name != ".." {
            let _ = std::fs::write(dir.join(name), text);
        }
    }
    let read = batchfit_pipeline::sweep::read_measured_steps(&dir, &Quiet).is_ok();
    let _ = std::fs::remove_dir_all(&dir);
    read
}

/// Skipped records are the expected answer here, not news.
struct Quiet;

impl batchfit_pipeline::Progress for Quiet {
    fn warn(&self, _msg: String) {}
}
