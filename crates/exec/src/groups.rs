//! Ending a trial's process groups: SIGTERM, a grace period, SIGKILL, and
//! waiting until nothing of them is left. Shared by the runner, the signal
//! handler and the reaper.

use std::time::{Duration, Instant};

/// How long a trial's processes get between SIGTERM and SIGKILL when batchfit
/// is ended: frameworks release a GPU on SIGTERM; a hung one ignores it. Short,
/// because whoever ended batchfit (a scheduler, `timeout`) may follow with
/// SIGKILL soon after.
pub const GRACE: Duration = Duration::from_secs(1);

/// Whether any process of group `pgid` still exists (zombies included).
pub(crate) fn group_alive(pgid: i32) -> bool {
    // SAFETY: signal 0 only checks for existence and permission.
    unsafe { libc::kill(-pgid, 0) == 0 }
}

/// SIGTERM to every process of the group, SIGKILL to what is left after a
/// grace period.
pub fn terminate_group(pgid: i32) {
    terminate_groups(&[pgid], GRACE);
}

/// [`terminate_group`] for several groups at once (a launcher's workers each
/// have their own), sharing one grace period.
pub fn terminate_groups(pgids: &[i32], grace: Duration) {
    for &g in pgids {
        // SAFETY: kill with a negative pid signals that process group only.
        unsafe { libc::kill(-g, libc::SIGTERM) };
    }
    let start = Instant::now();
    while pgids.iter().any(|&g| group_alive(g)) && start.elapsed() < grace {
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
