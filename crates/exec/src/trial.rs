//! One trial: the user's command at one batch size, through the one runner.

use crate::monitor::{gpu_sample, group_members, vm_peak};
use crate::process::{LineHandler, ProcessOptions, run_process};
use crate::protocol::{StepReader, StepReport, step_stats};
use crate::result::TrialResult;
use crate::template::{BATCH_ENV, CommandTemplate};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How to run trials.
#[derive(Clone, Debug)]
pub struct TrialOptions {
    pub timeout: Duration,
    pub reader: StepReader,
    /// Reported steps left out of the statistics.
    pub warmup_steps: usize,
    /// Copy the command's output to our stderr, prefixed with the batch.
    pub echo: bool,
    /// Each process of the trial may map at most this many bytes (RLIMIT_AS,
    /// as `ulimit -v` sets it): an allocation past it fails, and the command
    /// reports out of memory as it would on a full device.
    pub memory_limit: Option<u64>,
}

/// What the output readers collect.
#[derive(Default)]
struct Collected {
    steps: Vec<StepReport>,
    bad_lines: usize,
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
    let collected = Arc::new(Mutex::new(Collected::default()));
    let on_line: LineHandler = {
        let (collected, reader, echo) = (collected.clone(), opts.reader.clone(), opts.echo);
        Arc::new(move |_, line| {
            if echo {
                eprintln!("[batch {batch}] {line}");
            }
            if let Ok(mut c) = collected.lock() {
                match reader.read(line, batch) {
                    Some(Ok(step)) => c.steps.push(step),
                    Some(Err(_)) => c.bad_lines += 1,
                    None => {}
                }
            }
        })
    };

    let mut peak_host = 0u64;
    let mut peak_vm = 0u64;
    let mut peak_gpu: Option<u64> = None;
    let mut gpu_utils: Vec<u32> = Vec::new();
    let mut gpu_device = None;
    let mut sample = |pid: i32| {
        let members = group_members(pid);
        peak_host = peak_host.max(members.iter().map(|m| m.1).sum());
        if opts.memory_limit.is_some() {
            // The limit holds each process, so the largest one is what nears it.
            let vm = members.iter().filter_map(|m| vm_peak(m.0)).max();
            peak_vm = peak_vm.max(vm.unwrap_or(0));
        }
        let pids: Vec<u32> = members.iter().map(|m| m.0).collect();
        if let Some(g) = gpu_sample(&pids) {
            peak_gpu = Some(peak_gpu.unwrap_or(0).max(g.bytes));
            gpu_utils.push(g.util_pct);
            gpu_device = Some(g.device);
        }
        progress(collected.lock().map_or(0, |c| c.steps.len()));
    };
    let mut command = Command::new(&argv[0]);
    command.args(&argv[1..]).env(BATCH_ENV, batch.to_string());
    if let Some(limit) = opts.memory_limit {
        limit_address_space(&mut command, limit);
    }
    let finished = run_process(
        &mut command,
        ProcessOptions {
            timeout: opts.timeout,
            on_line: Some(on_line),
            on_sample: Some(&mut sample),
            ..ProcessOptions::default()
        },
    );
    let finished = match finished {
        Ok(f) => f,
        Err(e) => {
            return TrialResult::not_started(batch, format!("cannot start `{}`: {e}", argv[0]));
        }
    };
    let c = collected
        .lock()
        .map(|mut c| std::mem::take(&mut *c))
        .unwrap_or_default();
    TrialResult {
        batch,
        outcome: finished.outcome(),
        wall_s: finished.wall_s,
        steps: step_stats(&c.steps, batch, opts.warmup_steps),
        reports: c.steps,
        bad_step_lines: c.bad_lines,
        peak_host_bytes: Some(peak_host.max(finished.exit.max_rss_bytes)).filter(|&b| b > 0),
        peak_vm_bytes: (peak_vm > 0).then_some(peak_vm),
        peak_gpu_bytes: peak_gpu,
        gpu_util_mean_pct: (!gpu_utils.is_empty())
            .then(|| gpu_utils.iter().map(|&u| u as f64).sum::<f64>() / gpu_utils.len() as f64),
        gpu_util_max_pct: gpu_utils.iter().copied().max(),
        gpu_device,
    }
}

/// Sets RLIMIT_AS in the child before it execs: every process of the trial
/// inherits it, as under `ulimit -v`.
fn limit_address_space(command: &mut Command, bytes: u64) {
    use std::os::unix::process::CommandExt;
    let limit = libc::rlimit {
        rlim_cur: bytes as libc::rlim_t,
        rlim_max: bytes as libc::rlim_t,
    };
    // SAFETY: setrlimit is async-signal-safe and touches only the child.
    unsafe {
        command.pre_exec(move || {
            if libc::setrlimit(libc::RLIMIT_AS, &limit) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
}
