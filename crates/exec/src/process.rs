//! The one child-process runner: every trial batchfit starts (the user's
//! training command in `run`, the measuring worker in `probe`) goes through
//! [`run_process`], so both get the same process group, time-out, peak-memory
//! reading, ending with batchfit however it ends, and the same reading of how
//! it ended ([`Outcome`]).

use crate::monitor::{ProcInfo, groups_still_ours, process_tree};
use crate::oom::looks_like_oom;
use crate::{groups, interrupt};
use batchfit_tune::trial::Outcome;
use std::collections::HashSet;
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

/// Lines of each stream kept for error messages.
const TAIL_LINES: usize = 30;
/// The longest piece of one output line handled at a time, in bytes: a
/// BATCHFIT line is well under 1 KiB.
const MAX_LINE: u64 = 64 * 1024;
/// Lines of output a crash report shows.
const CRASH_LINES: usize = 8;

/// Called with every output line of the child: `(is_stderr, line)`.
pub type LineHandler = Arc<dyn Fn(bool, &str) + Send + Sync>;

/// Called with the child's process tree while it runs.
pub type SampleHandler<'a> = &'a mut dyn FnMut(&[ProcInfo]);

/// How to run one child.
pub struct ProcessOptions<'a> {
    /// Past this the child's process group gets SIGTERM, then SIGKILL.
    pub timeout: Duration,
    /// Sees every line of output as it arrives (on reader threads).
    pub on_line: Option<LineHandler>,
    /// Called about every `sample_every` while the child runs, with its
    /// process tree (to read the tree's memory, GPU use, progress). Sampling
    /// is also how processes that left the child's group are found (a
    /// launcher's workers, each in a session of its own), so that they are
    /// ended with it.
    pub on_sample: Option<SampleHandler<'a>>,
    pub sample_every: Duration,
    /// Set (by a line handler) when the child has done what was asked of it:
    /// its tree is then ended, and it counts as having run (`Finished::stopped`).
    pub stop: Option<Arc<AtomicBool>>,
}

impl Default for ProcessOptions<'_> {
    fn default() -> Self {
        ProcessOptions {
            timeout: Duration::from_secs(600),
            on_line: None,
            on_sample: None,
            sample_every: Duration::from_millis(100),
            stop: None,
        }
    }
}

/// How the child ended, from wait4.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExitInfo {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    /// The child's own peak resident memory (ru_maxrss), in bytes.
    pub max_rss_bytes: u64,
}

impl std::fmt::Display for ExitInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.code, self.signal) {
            (Some(c), _) => write!(f, "exit status {c}"),
            (_, Some(s)) => write!(f, "signal {s}"),
            _ => write!(f, "unknown status"),
        }
    }
}

/// A child that ran (to its end or to the time-out).
#[derive(Clone, Debug)]
pub struct Finished {
    pub exit: ExitInfo,
    /// It was still running at the time-out and was ended by us.
    pub timed_out: bool,
    /// It was ended by us because it had done what was asked (`ProcessOptions::stop`).
    pub stopped: bool,
    /// From start to exit, process start-up included.
    pub wall_s: f64,
    /// The last lines of each stream.
    pub stdout_tail: String,
    pub stderr_tail: String,
    /// How the first output line that reports out-of-memory did so, wherever
    /// it was: a launcher prints its own summary after the failing worker's
    /// traceback, which can push the worker's message out of the tails.
    pub oom_seen: Option<String>,
    /// Whether the kernel's OOM killer killed a process while it ran
    /// ([`crate::oom::oom_kills`] before and after); `None`: unknown.
    pub oom_killed: Option<bool>,
}

impl Finished {
    /// How it ended: ran, out of memory (by its text or the OOM killer), timed
    /// out, or crashed with the tail of its output. A crash is never called
    /// out of memory unless the output or the kernel's count of OOM kills says so.
    pub fn outcome(&self) -> Outcome {
        if self.stopped {
            return Outcome::Ran;
        }
        if self.timed_out {
            return Outcome::TimedOut;
        }
        if self.exit.code == Some(0) {
            return Outcome::Ran;
        }
        let text = format!("{}\n{}", self.stderr_tail, self.stdout_tail);
        if let Some(why) = looks_like_oom(&text, self.exit.signal, self.exit.code, self.oom_killed)
            .or_else(|| self.oom_seen.clone())
        {
            return Outcome::OutOfMemory(why);
        }
        let shown = if self.stderr_tail.trim().is_empty() {
            &self.stdout_tail
        } else {
            &self.stderr_tail
        };
        let last: Vec<&str> = shown.lines().collect();
        Outcome::Crashed(format!(
            "{}; last lines of its output:\n{}",
            self.exit,
            last[last.len().saturating_sub(CRASH_LINES)..].join("\n")
        ))
    }
}

/// Reaps `pid` if it has ended (never blocks).
fn try_reap(pid: i32) -> Option<ExitInfo> {
    let mut status = 0;
    // SAFETY: plain out-parameters; pid is our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
    if r != pid {
        return None;
    }
    Some(ExitInfo {
        code: libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)),
        signal: libc::WIFSIGNALED(status).then(|| libc::WTERMSIG(status)),
        // ru_maxrss is in KiB on Linux.
        max_rss_bytes: usage.ru_maxrss.max(0) as u64 * 1024,
    })
}

/// Reads `stream` line by line into a tail, handing each line to `on_line`
/// and noting the first that reports out-of-memory in `oom`.
fn spawn_reader(
    stream: impl Read + Send + 'static,
    is_stderr: bool,
    on_line: Option<LineHandler>,
    tail: Arc<Mutex<VecDeque<String>>>,
    oom: Arc<Mutex<Option<String>>>,
    done: mpsc::Sender<()>,
) {
    std::thread::spawn(move || {
        let mut r = BufReader::new(stream);
        let mut buf = Vec::new();
        // A "line" of progress bars redrawn with carriage returns never ends:
        // read at most MAX_LINE bytes of one at a time, each piece a line.
        while (&mut r)
            .take(MAX_LINE)
            .read_until(b'\n', &mut buf)
            .is_ok_and(|n| n > 0)
        {
            let line = String::from_utf8_lossy(&buf).trim_end().to_string();
            buf.clear();
            if let Some(f) = &on_line {
                f(is_stderr, &line);
            }
            if let Ok(mut o) = oom.lock()
                && o.is_none()
            {
                *o = looks_like_oom(&line, None, None, None);
            }
            let Ok(mut t) = tail.lock() else { break };
            if t.len() == TAIL_LINES {
                t.pop_front();
            }
            t.push_back(line);
        }
        let _ = done.send(());
    });
}

/// Runs `command` in a fresh process group (stdin closed, output read line by
/// line) until it exits or `opts.timeout` passes, then ends whatever of its
/// tree is left. `Err` only when it could not be started at all.
pub fn run_process(
    command: &mut Command,
    opts: ProcessOptions<'_>,
) -> Result<Finished, std::io::Error> {
    let started = Instant::now();
    let kills_before = crate::oom::oom_kills();
    die_with_parent(command);
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group: the whole tree can be measured and ended.
        .process_group(0)
        .spawn()?;
    let pid = child.id() as i32;
    interrupt::register_group(pid);

    let out_tail = Arc::new(Mutex::new(VecDeque::new()));
    let err_tail = Arc::new(Mutex::new(VecDeque::new()));
    let oom_seen = Arc::new(Mutex::new(None));
    let (done_tx, done_rx) = mpsc::channel();
    let out = child.stdout.take().expect("piped");
    let err = child.stderr.take().expect("piped");
    spawn_reader(
        out,
        false,
        opts.on_line.clone(),
        out_tail.clone(),
        oom_seen.clone(),
        done_tx.clone(),
    );
    spawn_reader(
        err,
        true,
        opts.on_line,
        err_tail.clone(),
        oom_seen.clone(),
        done_tx,
    );

    let mut on_sample = opts.on_sample;
    let stop = opts.stop;
    let mut next_sample = Instant::now();
    let mut timed_out = false;
    let mut stopped = false;
    // Process groups of the tree other than the child's own: ended with it.
    let mut groups: Vec<i32> = Vec::new();
    // Every process seen in the tree, to tell our groups from reused numbers.
    let mut seen: HashSet<u32> = HashSet::new();
    let exit = loop {
        if let Some(exit) = try_reap(pid) {
            break exit;
        }
        if started.elapsed() > opts.timeout {
            timed_out = true;
            break end_tree(pid, &groups_still_ours(&groups, &seen));
        }
        if stop.as_ref().is_some_and(|s| s.load(Ordering::Relaxed)) {
            stopped = true;
            break end_tree(pid, &groups_still_ours(&groups, &seen));
        }
        if let Some(f) = on_sample.as_mut()
            && Instant::now() >= next_sample
        {
            next_sample += opts.sample_every;
            let tree = process_tree(pid, &groups);
            for p in &tree {
                seen.insert(p.pid);
                if p.pgid != pid && p.pgid > 1 && p.pgid != own_group() && !groups.contains(&p.pgid)
                {
                    groups.push(p.pgid);
                    interrupt::register_group(p.pgid);
                }
            }
            f(&tree);
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    interrupt::hold_if_interrupted();
    let wall_s = started.elapsed().as_secs_f64();
    // Workers the command left behind must not hold memory into the next trial.
    let ours = groups_still_ours(&groups, &seen);
    for &g in ours.iter().chain([&pid]) {
        groups::kill_group(g);
    }
    // SIGKILL lands asynchronously: wait (briefly) until nothing is left.
    for &g in ours.iter().chain([&pid]) {
        groups::wait_group_gone(g, Duration::from_secs(2));
    }
    for &g in groups.iter().chain([&pid]) {
        interrupt::unregister_group(g);
    }
    // The readers end when every writer of the pipes has; a process that left
    // the group may hold them open, so do not wait for it forever.
    for _ in 0..2 {
        let _ = done_rx.recv_timeout(Duration::from_secs(2));
    }
    let tail = |t: &Mutex<VecDeque<String>>| {
        t.lock()
            .map(|t| t.iter().cloned().collect::<Vec<_>>().join("\n"))
            .unwrap_or_default()
    };
    Ok(Finished {
        exit,
        timed_out,
        stopped,
        wall_s,
        stdout_tail: tail(&out_tail),
        stderr_tail: tail(&err_tail),
        oom_seen: oom_seen.lock().ok().and_then(|o| o.clone()),
        oom_killed: kills_before
            .zip(crate::oom::oom_kills())
            .map(|(before, after)| after > before),
    })
}

/// Asks the kernel to SIGKILL the child when batchfit dies, however it dies
/// (see [`crate::interrupt`]). The death signal is tied to the thread that
/// starts the child, which here waits for it to the end. A parent that died
/// between fork and the request is checked for right after it.
#[cfg(target_os = "linux")]
fn die_with_parent(command: &mut Command) {
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    // SAFETY: the closure runs between fork and exec and calls only prctl,
    // getppid and _exit, which are async-signal-safe.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                libc::_exit(128 + libc::SIGKILL);
            }
            Ok(())
        })
    };
}

/// Elsewhere the reaper and the signal handler alone end the trial.
#[cfg(not(target_os = "linux"))]
fn die_with_parent(_command: &mut Command) {}

/// batchfit's own process group, never signalled.
fn own_group() -> i32 {
    // SAFETY: getpgrp has no preconditions.
    unsafe { libc::getpgrp() }
}

/// Ends a child that ran past its time-out: SIGTERM to its group and to the
/// other `groups` of its tree (a launcher's workers), SIGKILL after a grace
/// period, and reaps it.
fn end_tree(pid: i32, groups: &[i32]) -> ExitInfo {
    for &g in groups.iter().chain([&pid]) {
        // SAFETY: signals process groups of our child's tree.
        unsafe { libc::kill(-g, libc::SIGTERM) };
    }
    let grace = Instant::now();
    while grace.elapsed() < Duration::from_secs(2) {
        if let Some(exit) = try_reap(pid) {
            groups.iter().for_each(|&g| groups::kill_group(g));
            groups::kill_group(pid);
            return exit;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    groups.iter().for_each(|&g| groups::kill_group(g));
    groups::kill_group(pid);
    loop {
        if let Some(exit) = try_reap(pid) {
            return exit;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str, timeout: Duration) -> Finished {
        run_process(
            Command::new("sh").arg("-c").arg(script),
            ProcessOptions {
                timeout,
                ..ProcessOptions::default()
            },
        )
        .expect("sh starts")
    }

    /// Output redrawn with carriage returns and no newline (a progress bar)
    /// is read in pieces: no piece is held longer than MAX_LINE, and the
    /// line after it arrives whole.
    #[test]
    fn an_endless_line_is_read_in_pieces() {
        let f = sh(
            "i=0; while [ $i -lt 20000 ]; do printf '\\r 42%%|#####     | 420/1000'; i=$((i+1)); done; echo; echo done",
            Duration::from_secs(30),
        );
        assert_eq!(f.outcome(), Outcome::Ran);
        let lines: Vec<&str> = f.stdout_tail.lines().collect();
        assert!(lines.len() > 2, "{} lines", lines.len());
        assert!(lines.iter().all(|l| l.len() as u64 <= MAX_LINE));
        assert_eq!(lines.last(), Some(&"done"));
    }

    #[test]
    fn a_clean_exit_ran() {
        let f = sh("echo hello", Duration::from_secs(10));
        assert_eq!(f.outcome(), Outcome::Ran);
        assert_eq!(f.stdout_tail, "hello");
    }

    #[test]
    fn a_crash_is_a_crash_with_its_output() {
        let f = sh(
            "echo 'Segmentation fault in kernel' >&2; exit 3",
            Duration::from_secs(10),
        );
        match f.outcome() {
            Outcome::Crashed(why) => {
                assert!(why.contains("exit status 3"), "{why}");
                assert!(why.contains("Segmentation fault"), "{why}");
            }
            other => panic!("expected a crash, got {other:?}"),
        }
    }

    #[test]
    fn out_of_memory_is_recognised_by_its_text() {
        let f = sh(
            "echo 'torch.OutOfMemoryError: CUDA out of memory' >&2; exit 1",
            Duration::from_secs(10),
        );
        assert!(matches!(f.outcome(), Outcome::OutOfMemory(_)));
    }

    #[test]
    fn a_hang_is_ended_at_the_time_out() {
        let f = sh("sleep 30", Duration::from_millis(200));
        assert_eq!(f.outcome(), Outcome::TimedOut);
        assert!(f.wall_s < 10.0);
    }

    #[test]
    fn lines_reach_the_handler_as_they_come() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        let handler: LineHandler = Arc::new(move |err, line| {
            s.lock().unwrap().push((err, line.to_string()));
        });
        run_process(
            Command::new("sh").arg("-c").arg("echo a; echo b >&2"),
            ProcessOptions {
                timeout: Duration::from_secs(10),
                on_line: Some(handler),
                ..ProcessOptions::default()
            },
        )
        .unwrap();
        let mut seen = seen.lock().unwrap().clone();
        seen.sort();
        assert_eq!(seen, vec![(false, "a".into()), (true, "b".into())]);
    }

    #[test]
    fn out_of_memory_is_recognised_above_a_long_summary() {
        // A launcher's summary after the worker's message: more lines than the tail keeps.
        let f = sh(
            "echo 'torch.OutOfMemoryError: CUDA out of memory' >&2; \
             i=0; while [ $i -lt 60 ]; do echo \"summary line $i\" >&2; i=$((i+1)); done; exit 1",
            Duration::from_secs(10),
        );
        assert!(
            !f.stderr_tail.contains("OutOfMemoryError"),
            "{}",
            f.stderr_tail
        );
        assert!(matches!(f.outcome(), Outcome::OutOfMemory(_)));
    }

    #[test]
    fn workers_in_their_own_sessions_are_ended_with_the_trial() {
        if !std::path::Path::new("/proc/self/stat").exists()
            || Command::new("setsid").arg("true").status().is_err()
        {
            return; // needs Linux's /proc and util-linux's setsid
        }
        let dir = std::env::temp_dir().join(format!("batchfit-exec-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pid_file = dir.join("pid");
        let script = format!(
            "setsid sh -c 'echo $$ > {}; exec sleep 60' & wait",
            pid_file.display()
        );
        let mut seen = 0;
        let mut sample = |tree: &[ProcInfo]| seen = seen.max(tree.len());
        let f = run_process(
            Command::new("sh").arg("-c").arg(&script),
            ProcessOptions {
                timeout: Duration::from_millis(600),
                on_sample: Some(&mut sample),
                ..ProcessOptions::default()
            },
        )
        .unwrap();
        assert_eq!(f.outcome(), Outcome::TimedOut);
        assert!(seen >= 2, "the worker was not seen in the tree");
        let worker: u32 = std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let gone = Instant::now();
        let alive = || {
            std::fs::read_to_string(format!("/proc/{worker}/stat"))
                .is_ok_and(|s| !s[s.rfind(')').unwrap() + 2..].starts_with('Z'))
        };
        while alive() && gone.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!alive(), "worker {worker} outlived the trial");
    }

    #[test]
    fn a_missing_program_is_not_started() {
        let e = run_process(
            &mut Command::new("/nonexistent/batchfit-test-program"),
            ProcessOptions::default(),
        );
        assert!(e.is_err());
    }
}
