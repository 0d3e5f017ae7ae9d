//! One trial: the command at one batch size, in a fresh process group.

use crate::interrupt;
use crate::monitor::{gpu_sample, group_members};
use crate::oom::looks_like_oom;
use crate::protocol::{StepReader, StepReport, step_stats};
use crate::result::{Outcome, TrialResult};
use crate::template::{BATCH_ENV, CommandTemplate};
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

/// Lines of each stream kept for error messages.
const TAIL_LINES: usize = 30;
/// How often the process tree's memory is read: often enough to see a
/// training step's peak, rarely enough not to slow the trial down.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// How to run trials.
#[derive(Clone, Debug)]
pub struct TrialOptions {
    pub timeout: Duration,
    pub reader: StepReader,
    /// Reported steps left out of the statistics.
    pub warmup_steps: usize,
    /// Copy the command's output to our stderr, prefixed with the batch.
    pub echo: bool,
}

/// What the output readers collect.
#[derive(Default)]
struct Collected {
    steps: Vec<StepReport>,
    bad_lines: usize,
    stderr_tail: VecDeque<String>,
    stdout_tail: VecDeque<String>,
}

/// How the process ended, from wait4.
struct Exit {
    code: Option<i32>,
    signal: Option<i32>,
    max_rss_bytes: u64,
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.code, self.signal) {
            (Some(c), _) => write!(f, "exit status {c}"),
            (_, Some(s)) => write!(f, "signal {s}"),
            _ => write!(f, "unknown status"),
        }
    }
}

/// Reaps `pid` if it has ended (never blocks).
fn try_reap(pid: i32) -> Option<Exit> {
    let mut status = 0;
    // SAFETY: plain out-parameters; pid is our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
    if r != pid {
        return None;
    }
    Some(Exit {
        code: libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)),
        signal: libc::WIFSIGNALED(status).then(|| libc::WTERMSIG(status)),
        // ru_maxrss is in KiB on Linux.
        max_rss_bytes: usage.ru_maxrss.max(0) as u64 * 1024,
    })
}

fn spawn_reader(
    stream: impl Read + Send + 'static,
    is_stderr: bool,
    batch: u64,
    opts: &TrialOptions,
    into: Arc<Mutex<Collected>>,
    done: mpsc::Sender<()>,
) {
    let reader = opts.reader.clone();
    let echo = opts.echo;
    std::thread::spawn(move || {
        let mut r = BufReader::new(stream);
        let mut buf = Vec::new();
        while r.read_until(b'\n', &mut buf).is_ok_and(|n| n > 0) {
            let line = String::from_utf8_lossy(&buf).trim_end().to_string();
            buf.clear();
            if echo {
                eprintln!("[batch {batch}] {line}");
            }
            let Ok(mut c) = into.lock() else { break };
            match reader.read(&line, batch) {
                Some(Ok(step)) => c.steps.push(step),
                Some(Err(_)) => c.bad_lines += 1,
                None => {}
            }
            let tail = if is_stderr {
                &mut c.stderr_tail
            } else {
                &mut c.stdout_tail
            };
            if tail.len() == TAIL_LINES {
                tail.pop_front();
            }
            tail.push_back(line);
        }
        let _ = done.send(());
    });
}

/// Runs `template` at `batch` and measures it. `progress` is called while it
/// runs with the number of steps reported so far.
pub fn run_trial(
    template: &CommandTemplate,
    batch: u64,
    opts: &TrialOptions,
    progress: &mut dyn FnMut(usize),
) -> TrialResult {
    let argv = template.render(batch);
    let started = Instant::now();
    let child = Command::new(&argv[0])
        .args(&argv[1..])
        .env(BATCH_ENV, batch.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group: the whole tree can be measured and ended.
        .process_group(0)
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            return TrialResult::not_started(batch, format!("cannot start `{}`: {e}", argv[0]));
        }
    };
    let pid = child.id() as i32;
    interrupt::register_group(pid);

    let collected = Arc::new(Mutex::new(Collected::default()));
    let (done_tx, done_rx) = mpsc::channel();
    let out = child.stdout.take().expect("piped");
    let err = child.stderr.take().expect("piped");
    spawn_reader(out, false, batch, opts, collected.clone(), done_tx.clone());
    spawn_reader(err, true, batch, opts, collected.clone(), done_tx);

    let mut peak_host = 0u64;
    let mut peak_gpu: Option<u64> = None;
    let mut gpu_utils: Vec<u32> = Vec::new();
    let mut gpu_device = None;
    let mut next_sample = Instant::now();
    let mut timed_out = false;
    let exit = loop {
        if let Some(exit) = try_reap(pid) {
            break exit;
        }
        if started.elapsed() > opts.timeout {
            timed_out = true;
            break end_tree(pid);
        }
        if Instant::now() >= next_sample {
            next_sample += SAMPLE_EVERY;
            let members = group_members(pid);
            peak_host = peak_host.max(members.iter().map(|m| m.1).sum());
            let pids: Vec<u32> = members.iter().map(|m| m.0).collect();
            if let Some(g) = gpu_sample(&pids) {
                peak_gpu = Some(peak_gpu.unwrap_or(0).max(g.bytes));
                gpu_utils.push(g.util_pct);
                gpu_device = Some(g.device);
            }
            progress(collected.lock().map_or(0, |c| c.steps.len()));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    interrupt::hold_if_interrupted();
    let wall_s = started.elapsed().as_secs_f64();
    // Workers the command left behind must not hold memory into the next trial.
    interrupt::kill_group(pid);
    interrupt::unregister_group(pid);
    // The readers end when every writer of the pipes has; a process that left
    // the group may hold them open, so do not wait for it forever.
    for _ in 0..2 {
        let _ = done_rx.recv_timeout(Duration::from_secs(2));
    }

    let c = collected
        .lock()
        .map(|mut c| std::mem::take(&mut *c))
        .unwrap_or_default();
    let tail = |lines: &VecDeque<String>| lines.iter().cloned().collect::<Vec<_>>().join("\n");
    let (stderr, stdout) = (tail(&c.stderr_tail), tail(&c.stdout_tail));
    let outcome = if timed_out {
        Outcome::TimedOut
    } else if exit.code == Some(0) {
        Outcome::Ran
    } else if let Some(why) = looks_like_oom(&format!("{stderr}\n{stdout}"), exit.signal, exit.code)
    {
        Outcome::OutOfMemory(why)
    } else {
        let shown = if stderr.trim().is_empty() {
            &stdout
        } else {
            &stderr
        };
        let last: Vec<&str> = shown.lines().collect();
        Outcome::Crashed(format!(
            "{exit}; last lines of its output:\n{}",
            last[last.len().saturating_sub(8)..].join("\n")
        ))
    };
    TrialResult {
        batch,
        outcome,
        wall_s,
        steps: step_stats(&c.steps, batch, opts.warmup_steps),
        bad_step_lines: c.bad_lines,
        peak_host_bytes: Some(peak_host.max(exit.max_rss_bytes)).filter(|&b| b > 0),
        peak_gpu_bytes: peak_gpu,
        gpu_util_mean_pct: (!gpu_utils.is_empty())
            .then(|| gpu_utils.iter().map(|&u| u as f64).sum::<f64>() / gpu_utils.len() as f64),
        gpu_util_max_pct: gpu_utils.iter().copied().max(),
        gpu_device,
    }
}

/// Ends a trial that ran past its time-out: SIGTERM to its group, SIGKILL
/// after a grace period, and reaps the command.
fn end_tree(pid: i32) -> Exit {
    // SAFETY: signals our child's own process group.
    unsafe { libc::kill(-pid, libc::SIGTERM) };
    let grace = Instant::now();
    while grace.elapsed() < Duration::from_secs(2) {
        if let Some(exit) = try_reap(pid) {
            interrupt::kill_group(pid);
            return exit;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    interrupt::kill_group(pid);
    loop {
        if let Some(exit) = try_reap(pid) {
            return exit;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
