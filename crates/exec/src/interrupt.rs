//! Whatever ends batchfit ends its trials. Three layers, each for what the
//! one before cannot cover:
//!
//! 1. SIGINT, SIGTERM and SIGHUP (Ctrl-C, a scheduler's time limit or
//!    `timeout`, a closed terminal) reach [`install`]'s handler, which ends
//!    the running trial's whole process tree (SIGTERM, SIGKILL after a grace
//!    period), removes half-written files, and exits with 128 + the signal's
//!    number, the status a shell reports for it.
//! 2. SIGKILL (the OOM killer, `kill -9`) runs no handler. Every trial's first
//!    process asks the kernel to kill it when batchfit dies
//!    (`PR_SET_PDEATHSIG`, set by [`crate::process::run_process`]).
//! 3. That reaches the first process only: a training script's data loaders,
//!    a launcher's ranks in sessions of their own, live on. The reaper (a
//!    small process of batchfit's own, outside every trial, see
//!    [`crate::reaper`]) holds the list of the trials' process groups and
//!    ends them when its pipe from batchfit closes, which the kernel does
//!    however batchfit died.

pub use crate::groups::{GRACE, kill_group, terminate_group, terminate_groups};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, Once};
use std::time::Duration;

/// Process groups of running trials.
static GROUPS: Mutex<Vec<i32>> = Mutex::new(Vec::new());
/// Files to delete if interrupted (outputs being written).
static PARTIAL_FILES: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
/// What the handler prints on its way out.
static MESSAGE: Mutex<Option<String>> = Mutex::new(None);

/// Set first thing by the handler.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

static INSTALLED: Once = Once::new();

/// Exit status after SIGINT (128 + 2, as shells report it).
pub const INTERRUPTED_EXIT: i32 = 128 + libc::SIGINT;

/// The signals that end batchfit through the handler.
const SIGNALS: [i32; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// Installs the handler (once per process; later calls do nothing) and, when
/// `reaper` names batchfit's own binary and the hidden subcommand that runs
/// [`crate::reaper::serve`], lets trials be watched by a reaper.
pub fn install(reaper: Option<crate::reaper::ReaperCommand>) -> Result<(), crate::ExecError> {
    let mut result = Ok(());
    INSTALLED.call_once(|| {
        result = signal_hook::iterator::Signals::new(SIGNALS)
            .map(|mut signals| {
                std::thread::spawn(move || {
                    if let Some(signal) = signals.forever().next() {
                        end_everything(signal);
                    }
                });
            })
            .map_err(crate::ExecError::Interrupt);
        if let Some(r) = reaper {
            crate::reaper::enable(r);
        }
    });
    result
}

/// What the handler prints after ending the trial (the default says only
/// that the trial was ended).
pub fn set_message(message: impl Into<String>) {
    if let Ok(mut m) = MESSAGE.lock() {
        *m = Some(message.into());
    }
}

/// The handler's work: end every trial, remove partial files, say so, and
/// exit as the signal would have.
fn end_everything(signal: i32) -> ! {
    use std::io::Write as _;
    INTERRUPTED.store(true, Ordering::SeqCst);
    let groups: Vec<i32> = GROUPS.lock().map(|g| g.clone()).unwrap_or_default();
    terminate_groups(&groups, GRACE);
    for f in PARTIAL_FILES.lock().map(|f| f.clone()).unwrap_or_default() {
        let _ = std::fs::remove_file(f);
    }
    let message = MESSAGE
        .lock()
        .ok()
        .and_then(|m| m.clone())
        .unwrap_or_else(|| "the running trial's process tree was ended".into());
    // Not eprintln!: after SIGHUP the terminal may be gone, and a failed write
    // must not turn into a panic on the way out.
    let _ = writeln!(std::io::stderr(), "\n{}: {message}", signal_name(signal));
    std::process::exit(128 + signal);
}

fn signal_name(signal: i32) -> &'static str {
    match signal {
        libc::SIGINT => "interrupted",
        libc::SIGTERM => "terminated (SIGTERM)",
        libc::SIGHUP => "hung up (SIGHUP)",
        _ => "ended by a signal",
    }
}

/// Called by the trial loop when its process ended: if that was the
/// interruption, this thread must not go on to report a half-finished search
/// while the handler cleans up, so it waits for the handler's exit.
pub(crate) fn hold_if_interrupted() {
    while INTERRUPTED.load(Ordering::SeqCst) {
        std::thread::park_timeout(Duration::from_secs(1));
    }
}

pub(crate) fn register_group(pgid: i32) {
    if let Ok(mut g) = GROUPS.lock() {
        g.push(pgid);
    }
    crate::reaper::watch(pgid);
}

pub(crate) fn unregister_group(pgid: i32) {
    if let Ok(mut g) = GROUPS.lock() {
        g.retain(|&x| x != pgid);
    }
    crate::reaper::forget(pgid);
}

/// Marks `path` as being written: removed if interrupted.
pub fn register_partial(path: PathBuf) {
    if let Ok(mut f) = PARTIAL_FILES.lock() {
        f.push(path);
    }
}

/// `path` is complete (or gone): no longer removed if interrupted.
pub fn unregister_partial(path: &std::path::Path) {
    if let Ok(mut f) = PARTIAL_FILES.lock() {
        f.retain(|x| x != path);
    }
}
