//! The reaper: a small process batchfit starts before its first trial, in a
//! process group of its own and outside every trial's tree (so no trial's
//! measured memory includes it). batchfit tells it, over a pipe, which process
//! groups its trials run in (`+PGID`, `-PGID`, a line each). When the pipe
//! closes, batchfit is gone, whatever ended it (SIGKILL and the OOM killer
//! included, which run no handler), and the reaper ends every group it still
//! holds (SIGTERM, SIGKILL after [`crate::groups::GRACE`]), then exits.
//!
//! Hand-written: the kernel's own tools (`PR_SET_PDEATHSIG`) reach a trial's
//! first process only, and cgroups are not ours to create on every machine.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::io::{BufRead, Write};
use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock};

/// How to start the reaper: batchfit's binary and the hidden subcommand whose
/// main calls [`serve`].
#[derive(Clone, Debug)]
pub struct ReaperCommand {
    pub program: PathBuf,
    pub args: Vec<OsString>,
}

static COMMAND: OnceLock<ReaperCommand> = OnceLock::new();
/// The pipe to the running reaper; `None` until the first trial, or when it
/// could not be started (the trials then have `PR_SET_PDEATHSIG` alone).
static PIPE: Mutex<Option<ChildStdin>> = Mutex::new(None);

/// Lets [`watch`] start the reaper (called once, by the handler's install).
pub(crate) fn enable(command: ReaperCommand) {
    let _ = COMMAND.set(command);
}

/// Tells the reaper that a trial runs in group `pgid` (starting the reaper
/// first if this is the first trial).
pub(crate) fn watch(pgid: i32) {
    send(&format!("+{pgid}\n"), true);
}

/// Tells the reaper that group `pgid` has ended.
pub(crate) fn forget(pgid: i32) {
    send(&format!("-{pgid}\n"), false);
}

fn send(line: &str, start: bool) {
    let Ok(mut pipe) = PIPE.lock() else { return };
    if pipe.is_none() && start {
        *pipe = spawn();
    }
    // A reaper that died (killed by hand) cannot be helped; trials still end
    // with batchfit's handler and their first process's death signal.
    if let Some(p) = pipe.as_mut()
        && p.write_all(line.as_bytes())
            .and_then(|_| p.flush())
            .is_err()
    {
        *pipe = None;
    }
}

fn spawn() -> Option<ChildStdin> {
    let command = COMMAND.get()?;
    // Rust opens the pipe with O_CLOEXEC: no trial inherits its write end,
    // so batchfit's death alone closes it.
    Command::new(&command.program)
        .args(&command.args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        // Out of batchfit's group: Ctrl-C at the terminal reaches batchfit's
        // handler, not the reaper, which must outlive it.
        .process_group(0)
        .spawn()
        .ok()
        .and_then(|mut child| child.stdin.take())
}

/// The reaper's main: reads `+PGID` / `-PGID` lines from `input` until it
/// closes, then ends the groups still listed. Ignores SIGINT and SIGHUP (a
/// closed terminal must not end it before batchfit's trials).
pub fn serve(input: impl BufRead) {
    // SAFETY: setting a signal's disposition to ignored has no preconditions.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGHUP, libc::SIG_IGN);
    }
    let groups = follow(input);
    let groups: Vec<i32> = groups.into_iter().collect();
    crate::groups::terminate_groups(&groups, crate::groups::GRACE);
}

/// The groups still listed when `input` ends.
fn follow(input: impl BufRead) -> BTreeSet<i32> {
    let mut groups = BTreeSet::new();
    for line in input.lines() {
        let Ok(line) = line else { break };
        let (sign, number) = line.split_at(line.len().min(1));
        // Never a group of 1 or below: kill(-1) would signal every process.
        match (sign, number.parse::<i32>()) {
            ("+", Ok(g)) if g > 1 => {
                groups.insert(g);
            }
            ("-", Ok(g)) => {
                groups.remove(&g);
            }
            _ => {}
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_groups_still_listed_at_the_end_are_the_ones_ended() {
        let input = "+100\n+200\n-100\n+300\nnonsense\n+1\n+-5\n+0\n";
        assert_eq!(
            follow(input.as_bytes()),
            BTreeSet::from([200, 300]),
            "group 1 or below is never taken"
        );
    }

    #[test]
    fn a_group_ends_when_the_pipe_closes() {
        // A stand-in trial in a group of its own.
        let mut trial = Command::new("sleep")
            .arg("60")
            .process_group(0)
            .spawn()
            .unwrap();
        let pgid = trial.id() as i32;
        serve(format!("+{pgid}\n").as_bytes());
        let status = trial.wait().unwrap();
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(status.signal(), Some(libc::SIGTERM));
    }
}
