//! Runs every fuzz target for a fixed time (`BATCHFIT_FUZZ_SECONDS`, default
//! 2 s each; CI gives each 30 s; 0 replays only) and replays the inputs that once crashed a
//! reader (`regressions/TARGET/`). A panic saves its input under the build's
//! temporary folder and prints the seed that replays it:
//! `ARBTEST_SEED=0x... cargo test -p batchfit-fuzz --test fuzz TARGET`.
//! Each target prints how many inputs it tried. A reader still busy with one
//! input after [`HANG`] is hung: its input is saved the same way and the
//! process exits, so a hang fails the run instead of stalling it.

use batchfit_fuzz::Target;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Inputs are a few KB and read in micro- to milliseconds; one that takes
/// this long (even on a loaded 2-core machine) never ends or is quadratic.
const HANG: Duration = Duration::from_secs(20);

fn budget() -> Duration {
    let seconds = std::env::var("BATCHFIT_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .unwrap_or(2.0);
    Duration::from_secs_f64(seconds)
}

fn regressions(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("regressions")
        .join(target)
}

/// Fuzzes `name` for the budget; on a panic, keeps the input and fails.
fn fuzz(name: &str) {
    let target = Target::named(name);
    let watchdog = Watchdog::start(target.name);
    // Replay first: a fixed crash stays fixed.
    replay(target, &watchdog);
    let budget = budget();
    if budget.is_zero() {
        // Replay only (arbtest cannot run on a zero budget).
        println!("fuzz {name}: regression inputs replayed, no fuzzing (budget 0)");
        return;
    }
    let started = Instant::now();
    let (mut tried, mut read) = (0u64, 0u64);
    let seed = std::env::var("ARBTEST_SEED")
        .ok()
        .and_then(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok());
    let mut test = arbtest::arbtest(|u| {
        let input = (target.generate)(u)?;
        tried += 1;
        match std::panic::catch_unwind(AssertUnwindSafe(|| watchdog.check(target, &input))) {
            Ok(valid) => read += u64::from(valid),
            Err(panic) => {
                save_crash(name, "a panic", &input);
                std::panic::resume_unwind(panic);
            }
        }
        Ok(())
    })
    .budget(budget);
    if let Some(seed) = seed {
        test = test.seed(seed);
    }
    test.run();
    println!(
        "fuzz {name}: {tried} inputs in {:.1} s ({read} read as valid, the rest refused), no panic",
        started.elapsed().as_secs_f64()
    );
}

/// Feeds every saved input of `target` to its reader (valid or refused, it
/// must not panic or hang).
fn replay(target: &Target, watchdog: &Watchdog) {
    let Ok(entries) = std::fs::read_dir(regressions(target.name)) else {
        return;
    };
    for entry in entries.flatten() {
        let input = std::fs::read(entry.path()).expect("a regression input");
        let _ = watchdog.check(target, &input);
    }
}

/// Keeps an input that crashed or hung a reader and says where it is.
fn save_crash(name: &str, what: &str, input: &[u8]) {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fuzz-crashes");
    let _ = std::fs::create_dir_all(&dir);
    let file = dir.join(format!("{name}-{:016x}", fnv1a(input)));
    let _ = std::fs::write(&file, input);
    eprintln!(
        "fuzz {name}: {what}; the input is in {} (copy it to {} to keep it as a regression)",
        file.display(),
        regressions(name).display()
    );
}

/// The input being read and since when (none between inputs).
type Watched = Arc<Mutex<Option<(Instant, Vec<u8>)>>>;

/// The input being read and since when, watched by a thread that ends the
/// process when one takes longer than [`HANG`]. A hung reader cannot be
/// interrupted from outside its thread, and arbtest has no timeout of its own.
struct Watchdog {
    current: Watched,
    done: Arc<AtomicBool>,
}

impl Watchdog {
    fn start(name: &'static str) -> Self {
        let current: Watched = Arc::default();
        let done = Arc::new(AtomicBool::new(false));
        let (watched, finished) = (Arc::clone(&current), Arc::clone(&done));
        std::thread::spawn(move || {
            while !finished.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(500));
                let guard = watched.lock().unwrap_or_else(|e| e.into_inner());
                if let Some((since, input)) = guard.as_ref()
                    && since.elapsed() > HANG
                {
                    save_crash(name, &format!("one input ran past {HANG:?}"), input);
                    std::process::exit(1);
                }
            }
        });
        Watchdog { current, done }
    }

    /// Runs the reader on `input` under watch.
    fn check(&self, target: &Target, input: &[u8]) -> bool {
        /// Clears the watch however the reader returns, a panic included.
        struct Clear<'a>(&'a Watchdog);
        impl Drop for Clear<'_> {
            fn drop(&mut self) {
                self.0.set(None);
            }
        }
        self.set(Some((Instant::now(), input.to_vec())));
        let _clear = Clear(self);
        (target.check)(input)
    }

    fn set(&self, value: Option<(Instant, Vec<u8>)>) {
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = value;
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
    }
}

/// A name for a crashing input (FNV-1a; any stable hash would do).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    })
}

#[test]
fn every_target_is_tested() {
    let names: Vec<&str> = batchfit_fuzz::TARGETS.iter().map(|t| t.name).collect();
    let this = include_str!("fuzz.rs");
    for name in names {
        assert!(
            this.contains(&format!("fn {name}() {{\n    fuzz(\"{name}\")")),
            "no test runs target {name}"
        );
    }
}

#[test]
fn onnx() {
    fuzz("onnx")
}

#[test]
fn toml_spec() {
    fuzz("toml_spec")
}

#[test]
fn npy() {
    fuzz("npy")
}

#[test]
fn lengths() {
    fuzz("lengths")
}

#[test]
fn npz() {
    fuzz("npz")
}

#[test]
fn csv() {
    fuzz("csv")
}

#[test]
fn idx() {
    fuzz("idx")
}

#[test]
fn step_line() {
    fuzz("step_line")
}

#[test]
fn advice_json() {
    fuzz("advice_json")
}

#[test]
fn sweep_records() {
    fuzz("sweep_records")
}
