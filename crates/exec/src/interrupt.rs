//! Ctrl-C (and SIGTERM) while trials run: end the running trial's whole
//! process tree and remove half-written files before exiting, so an
//! interrupted `batchfit run` leaves neither orphans on the GPU nor debris.

use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Process groups of running trials.
static GROUPS: Mutex<Vec<i32>> = Mutex::new(Vec::new());
/// Files to delete if interrupted (outputs being written).
static PARTIAL_FILES: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Set first thing by the handler.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Exit status after an interruption (128 + SIGINT, as shells report it).
pub const INTERRUPTED_EXIT: i32 = 130;

/// Installs the handler, which prints `message` on its way out; call once,
/// before the first trial.
pub fn install(message: String) -> Result<(), crate::error::ExecError> {
    ctrlc::set_handler(move || {
        INTERRUPTED.store(true, Ordering::SeqCst);
        let groups: Vec<i32> = GROUPS.lock().map(|g| g.clone()).unwrap_or_default();
        terminate_groups(&groups);
        for f in PARTIAL_FILES.lock().map(|f| f.clone()).unwrap_or_default() {
            let _ = std::fs::remove_file(f);
        }
        eprintln!("\ninterrupted: {message}");
        std::process::exit(INTERRUPTED_EXIT);
    })
    .map_err(crate::error::ExecError::Interrupt)
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
}

pub(crate) fn unregister_group(pgid: i32) {
    if let Ok(mut g) = GROUPS.lock() {
        g.retain(|&x| x != pgid);
    }
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

/// Whether any process of group `pgid` still exists (zombies included).
fn group_alive(pgid: i32) -> bool {
    // SAFETY: signal 0 only checks for existence and permission.
    unsafe { libc::kill(-pgid, 0) == 0 }
}

/// SIGTERM to every process of the group, SIGKILL to what is left after a
/// grace period (frameworks release the GPU on SIGTERM; a hung one ignores it).
pub fn terminate_group(pgid: i32) {
    terminate_groups(&[pgid]);
}

/// [`terminate_group`] for several groups at once (a launcher's workers each
/// have their own), sharing one grace period.
pub fn terminate_groups(pgids: &[i32]) {
    for &g in pgids {
        // SAFETY: kill with a negative pid signals that process group only.
        unsafe { libc::kill(-g, libc::SIGTERM) };
    }
    let start = Instant::now();
    while pgids.iter().any(|&g| group_alive(g)) && start.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(20));
    }
    pgids.iter().for_each(|&g| kill_group(g));
}

/// Waits up to `limit` until no process of the group is left (SIGKILL is
/// delivered asynchronously; the next trial must not share the machine with
/// this one's leftovers).
pub(crate) fn wait_group_gone(pgid: i32, limit: Duration) {
    let start = Instant::now();
    while group_alive(pgid) && start.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// SIGKILL to every process of the group (nothing if it is gone).
pub fn kill_group(pgid: i32) {
    // SAFETY: as above.
    unsafe { libc::kill(-pgid, libc::SIGKILL) };
}
