//! A full disk while batchfit writes `--out` records and an `--html` report:
//! the error names the file, the exit status is 1, no truncated file is left,
//! and a report that was there before is as it was.
//!
//! The disk is a real one: a tmpfs of a few pages in a private mount namespace
//! (`unshare -rm`, no privileges needed where user namespaces are allowed),
//! filled up before batchfit starts. Where no namespace can be made, the same
//! checks run with the write failing by `ulimit -f` (EFBIG instead of ENOSPC).

mod common;

use common::fixture;

use std::path::{Path, PathBuf};
use std::process::Command;

/// How the write is made to fail.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// A tmpfs with `free_kib` left when batchfit starts.
    FullDisk { free_kib: u32 },
    /// Files may not grow past `kib` (SIGXFSZ ignored, so writes fail).
    FileSizeLimit { kib: u32 },
}

/// What one run left.
struct Outcome {
    status: Option<i32>,
    stderr: String,
    /// Every file left in the output folder (the filler excluded), with its
    /// contents.
    files: Vec<(String, String)>,
}

/// Whether this machine lets a test make a private tmpfs.
fn can_mount() -> bool {
    Command::new("unshare")
        .args(["-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /tmp"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Runs `batchfit ARGS` with `OUT` in `args` replaced by the output folder,
/// the folder holding `before` (name, contents) first, under `fault`.
fn run(fault: Fault, before: &[(&str, &str)], args: &[&str]) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let copy = dir.path().join("copy");
    let stderr = dir.path().join("stderr");
    std::fs::create_dir(&out).unwrap();
    std::fs::create_dir(&copy).unwrap();
    for (name, text) in before {
        std::fs::write(out.join(name), text).unwrap();
    }
    let args: Vec<String> = args
        .iter()
        .map(|a| a.replace("OUT", out.to_str().unwrap()))
        .collect();
    // $1: the output folder, $2: where its files are copied for the test to
    // read (a tmpfs in a namespace is gone with it), $3: stderr's file.
    let script = match fault {
        Fault::FullDisk { free_kib } => format!(
            r#"set -u
keep=$(mktemp -d)
cp -a "$1/." "$keep"
mount -t tmpfs -o size=256k tmpfs "$1" || exit 97
cp -a "$keep/." "$1"
rm -rf "$keep"
dd if=/dev/zero of="$1/.reserve" bs=1k count={free_kib} 2>/dev/null
dd if=/dev/zero of="$1/.filler" bs=1k 2>/dev/null
rm -f "$1/.reserve"
shift 3
"$@" 2>"$stderr_file"
rc=$?
rm -f "$out_dir/.filler"
cp -a "$out_dir/." "$copy_dir"
exit $rc"#
        ),
        Fault::FileSizeLimit { kib } => format!(
            r#"set -u
trap '' XFSZ
ulimit -f {}
shift 3
"$@" 2>"$stderr_file"
rc=$?
cp -a "$out_dir/." "$copy_dir"
exit $rc"#,
            kib * 2
        ),
    };
    let mut command = match fault {
        Fault::FullDisk { .. } => {
            let mut c = Command::new("unshare");
            c.args(["-rm", "sh", "-c"]);
            c
        }
        Fault::FileSizeLimit { .. } => {
            let mut c = Command::new("sh");
            c.arg("-c");
            c
        }
    };
    let status = command
        .arg(&script)
        .arg("sh")
        .arg(&out)
        .arg(&copy)
        .arg(&stderr)
        .arg(env!("CARGO_BIN_EXE_batchfit"))
        .args(&args)
        .env("out_dir", &out)
        .env("copy_dir", &copy)
        .env("stderr_file", &stderr)
        .status()
        .unwrap();
    assert_ne!(status.code(), Some(97), "the tmpfs could not be mounted");
    let mut files: Vec<(String, String)> = walk(&copy)
        .into_iter()
        .map(|p| {
            (
                p.strip_prefix(&copy).unwrap().display().to_string(),
                String::from_utf8_lossy(&std::fs::read(&p).unwrap()).into_owned(),
            )
        })
        .collect();
    files.sort();
    Outcome {
        status: status.code(),
        stderr: std::fs::read_to_string(&stderr).unwrap_or_default(),
        files,
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let p = entry.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

fn faults() -> Vec<Fault> {
    if can_mount() {
        vec![Fault::FullDisk { free_kib: 4 }]
    } else {
        eprintln!("no private tmpfs here (unshare -rm): failing the writes by ulimit -f instead");
        vec![Fault::FileSizeLimit { kib: 4 }]
    }
}

/// A sweep whose first record does not fit: `sweep.json` (under a page) is
/// written, the record is not, and nothing half-written is left.
#[test]
fn a_full_disk_during_out_names_the_record_and_leaves_no_truncated_file() {
    for fault in faults() {
        let o = run(
            fault,
            &[],
            &[
                "sweep",
                "--batches",
                "8",
                "--seeds",
                "1",
                "--epochs",
                "2",
                "--no-noise",
                "--out",
                "OUT/sweep",
            ],
        );
        assert_eq!(o.status, Some(1), "{fault:?}: {}", o.stderr);
        assert!(
            o.stderr.contains("run-b8-s0.json") && o.stderr.contains("cannot write"),
            "{fault:?}: {}",
            o.stderr
        );
        let names: Vec<&str> = o.files.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["sweep/sweep.json"], "{fault:?}");
        let settings: serde_json::Value = serde_json::from_str(&o.files[0].1).unwrap();
        assert_eq!(settings["batches"][0], 8, "{fault:?}");
    }
}

/// An `--html` report that does not fit: the error names it and the report
/// from before is as it was.
#[test]
fn a_full_disk_during_html_keeps_the_previous_report() {
    let old = "<!DOCTYPE html>\n<html>the report from before</html>";
    for fault in faults() {
        let o = run(
            fault,
            &[("report.html", old)],
            &[
                "run",
                "--batches",
                "8,16",
                "--html",
                "OUT/report.html",
                "--",
                "sh",
                &fixture("fake_trainer.sh"),
                "{batch}",
            ],
        );
        assert_eq!(o.status, Some(1), "{fault:?}: {}", o.stderr);
        assert!(
            o.stderr.contains("report.html") && o.stderr.contains("--html"),
            "{fault:?}: {}",
            o.stderr
        );
        assert_eq!(
            o.files,
            [("report.html".to_string(), old.to_string())],
            "{fault:?}"
        );
    }
}
