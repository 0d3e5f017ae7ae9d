//! One trial: the user's command at one batch size, through the one runner;
//! under a launcher, every rank of it measured.

use crate::launcher::{Launcher, RANK_VARS};
use crate::monitor::{ProcInfo, env_rank, gpu_reading, vm_peak};
use crate::process::{LineHandler, ProcessOptions, run_process};
use crate::protocol::{StepReader, StepReport, combine_ranks, step_stats};
use crate::template::{BATCH_ENV, CommandTemplate, LR_ENV, NOISE_EVERY_ENV, SEED_ENV};
use batchfit_tune::lr::LrScaling;
use batchfit_tune::run::LossTarget;
use batchfit_tune::trial::{RankResult, TrialResult};
use std::collections::{BTreeMap, HashMap};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// Run the command through this data-parallel launcher, `{batch}` per device.
    pub launcher: Option<Launcher>,
    /// Each trial's learning rate, from its batch: put where the command has
    /// `{lr}` and exported as `BATCHFIT_LR`.
    pub lr: Option<LrScaling>,
    /// The trial's seed: put where the command has `{seed}` and exported as
    /// `BATCHFIT_SEED` (`run --verify` trains each batch under several).
    pub seed: Option<u64>,
    /// End the trial once its reported losses reach this target.
    pub stop_at: Option<LossTarget>,
    /// Ask the helper to measure gradient noise every this many steps
    /// (`BATCHFIT_NOISE_EVERY`); `None`: its own schedule.
    pub noise_every: Option<u32>,
}

/// What the output readers collect.
#[derive(Default)]
struct Collected {
    steps: Vec<StepReport>,
    bad_lines: usize,
}

/// Peaks of one rank's processes.
#[derive(Default)]
struct RankPeaks {
    host: u64,
    gpu: Option<u64>,
}

/// Which rank each process of `tree` works for: its own rank (`own`, read
/// from its environment), else its nearest ancestor's in the tree (a data
/// loader started with a fresh environment); processes of no rank (the
/// launcher itself) are left out.
fn assign_ranks(tree: &[ProcInfo], own: &mut dyn FnMut(u32) -> Option<u32>) -> HashMap<u32, u32> {
    let parent: HashMap<u32, u32> = tree.iter().map(|p| (p.pid, p.ppid)).collect();
    let mut out = HashMap::new();
    for p in tree {
        let mut pid = p.pid;
        // Bounded: a tree has no cycles, but /proc is read while it changes.
        for _ in 0..64 {
            if let Some(r) = own(pid) {
                out.insert(p.pid, r);
                break;
            }
            match parent.get(&pid) {
                Some(&pp) => pid = pp,
                None => break,
            }
        }
    }
    out
}

/// Runs `template` at `batch` and measures it. `progress` is called while it
/// runs with the number of steps reported so far (by the rank furthest on).
pub fn run_trial(
    template: &CommandTemplate,
    batch: u64,
    opts: &TrialOptions,
    progress: &mut dyn FnMut(usize),
) -> TrialResult {
    let lr = opts.lr.map(|s| s.at(batch));
    let mut argv = template.render(batch, lr, opts.seed);
    let stop = Arc::new(AtomicBool::new(false));
    if let Some(l) = &opts.launcher {
        argv = l.wrap(&argv);
    }
    let collected = Arc::new(Mutex::new(Collected::default()));
    let on_line: LineHandler = {
        let (collected, reader, echo) = (collected.clone(), opts.reader.clone(), opts.echo);
        let (stop, stop_at) = (stop.clone(), opts.stop_at);
        Arc::new(move |_, line| {
            if echo {
                eprintln!("[batch {batch}] {line}");
            }
            if let Ok(mut c) = collected.lock() {
                for step in reader.read_line(line, batch) {
                    match step {
                        Ok(step) => c.steps.push(step),
                        Err(_) => c.bad_lines += 1,
                    }
                }
                if stop_at.is_some_and(|t| t.reached_by(&c.steps)) {
                    stop.store(true, Ordering::Relaxed);
                }
            }
        })
    };

    let launched = opts.launcher.is_some();
    let mut peak_host = 0u64;
    let mut peak_vm = 0u64;
    let mut peak_gpu: Option<u64> = None;
    let mut gpu_utils: Vec<u32> = Vec::new();
    let mut gpu_device = None;
    let mut rank_peaks: BTreeMap<u32, RankPeaks> = BTreeMap::new();
    // A process's environment does not change: read it once per pid.
    let mut env_ranks: HashMap<u32, Option<u32>> = HashMap::new();
    let mut sample = |tree: &[ProcInfo]| {
        peak_host = peak_host.max(tree.iter().map(|p| p.rss_bytes).sum());
        let pids: Vec<u32> = tree.iter().map(|p| p.pid).collect();
        if opts.memory_limit.is_some() {
            // The limit holds each process, so the largest one is what nears it.
            let vm = pids.iter().filter_map(|&p| vm_peak(p)).max();
            peak_vm = peak_vm.max(vm.unwrap_or(0));
        }
        let gpu = gpu_reading();
        if let Some(g) = gpu.as_ref().and_then(|r| r.sample(&pids)) {
            peak_gpu = Some(peak_gpu.unwrap_or(0).max(g.bytes));
            gpu_utils.push(g.util_pct);
            gpu_device = Some(g.device);
        }
        // Without a launcher the whole tree is rank 0.
        let ranks: HashMap<u32, u32> = if launched {
            assign_ranks(tree, &mut |pid| {
                *env_ranks.entry(pid).or_insert_with(|| env_rank(pid))
            })
        } else {
            pids.iter().map(|&p| (p, 0)).collect()
        };
        let mut by_rank: BTreeMap<u32, Vec<&ProcInfo>> = BTreeMap::new();
        for p in tree {
            if let Some(&r) = ranks.get(&p.pid) {
                by_rank.entry(r).or_default().push(p);
            }
        }
        for (r, procs) in by_rank {
            let peaks = rank_peaks.entry(r).or_default();
            peaks.host = peaks.host.max(procs.iter().map(|p| p.rss_bytes).sum());
            let pids: Vec<u32> = procs.iter().map(|p| p.pid).collect();
            if let Some(g) = gpu.as_ref().and_then(|g| g.sample(&pids)) {
                peaks.gpu = Some(peaks.gpu.unwrap_or(0).max(g.bytes));
            }
        }
        progress(collected.lock().map_or(0, |c| {
            let mut per_rank: HashMap<u32, usize> = HashMap::new();
            for s in &c.steps {
                *per_rank.entry(s.rank.unwrap_or(0)).or_default() += 1;
            }
            per_rank.into_values().max().unwrap_or(0)
        }));
    };
    let mut command = Command::new(&argv[0]);
    command.args(&argv[1..]).env(BATCH_ENV, batch.to_string());
    if let Some(lr) = lr {
        command.env(LR_ENV, lr.to_string());
    }
    if let Some(seed) = opts.seed {
        command.env(SEED_ENV, seed.to_string());
    }
    match opts.noise_every {
        Some(every) => command.env(NOISE_EVERY_ENV, every.to_string()),
        // Not inherited from batchfit's own environment: a trial's step times
        // must not carry measurements it did not ask for.
        None => command.env_remove(NOISE_EVERY_ENV),
    };
    if let Some(limit) = opts.memory_limit {
        limit_address_space(&mut command, limit);
    }
    if launched {
        for v in RANK_VARS {
            command.env_remove(v);
        }
    }
    let finished = run_process(
        &mut command,
        ProcessOptions {
            timeout: opts.timeout,
            on_line: Some(on_line),
            on_sample: Some(&mut sample),
            stop: opts.stop_at.is_some().then_some(stop),
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

    // Steps per rank; a line without a rank is rank 0's.
    let mut steps_by_rank: BTreeMap<u32, Vec<StepReport>> = BTreeMap::new();
    for s in c.steps {
        steps_by_rank
            .entry(s.rank.unwrap_or(0))
            .or_default()
            .push(s);
    }
    let per_rank: Vec<(u32, crate::StepStats)> = steps_by_rank
        .iter()
        .filter_map(|(&r, s)| step_stats(s, batch, opts.warmup_steps).map(|st| (r, st)))
        .collect();
    let world_size = opts.launcher.as_ref().map_or(1, Launcher::world_size);
    let mut rank_ids: Vec<u32> = steps_by_rank
        .keys()
        .chain(rank_peaks.keys())
        .copied()
        .collect();
    if !launched {
        // The command itself is rank 0 even when it reported nothing.
        rank_ids.push(0);
    }
    rank_ids.sort_unstable();
    rank_ids.dedup();
    let ranks = rank_ids
        .into_iter()
        .map(|r| {
            let peaks = rank_peaks.get(&r);
            RankResult {
                rank: r,
                steps: steps_by_rank.get(&r).map_or(0, Vec::len),
                median_step_s: per_rank
                    .iter()
                    .find(|p| p.0 == r)
                    .map(|p| p.1.step_time.median),
                peak_host_bytes: match (peaks, launched) {
                    // The kernel's peak of the command counts when it is the only rank.
                    (p, false) => Some(p.map_or(0, |p| p.host).max(finished.exit.max_rss_bytes)),
                    (p, true) => p.map(|p| p.host),
                }
                .filter(|&b| b > 0),
                peak_gpu_bytes: peaks.and_then(|p| p.gpu),
            }
        })
        .collect();

    TrialResult {
        batch,
        learning_rate: lr,
        outcome: finished.outcome(),
        wall_s: finished.wall_s,
        steps: combine_ranks(&per_rank, world_size),
        // Losses and noise measurements: the lowest rank's (each rank measures
        // its own micro-batches; one rank's view is the training's).
        reports: steps_by_rank.into_values().next().unwrap_or_default(),
        bad_step_lines: c.bad_lines,
        peak_host_bytes: Some(peak_host.max(finished.exit.max_rss_bytes)).filter(|&b| b > 0),
        peak_vm_bytes: (peak_vm > 0).then_some(peak_vm),
        peak_gpu_bytes: peak_gpu,
        gpu_util_mean_pct: (!gpu_utils.is_empty())
            .then(|| gpu_utils.iter().map(|&u| u as f64).sum::<f64>() / gpu_utils.len() as f64),
        gpu_util_max_pct: gpu_utils.iter().copied().max(),
        gpu_device,
        ranks,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launcher::LauncherKind;
    use batchfit_tune::trial::Outcome;
    use std::path::PathBuf;

    fn fixture(name: &str) -> String {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../cli/tests/fixtures")
            .join(name)
            .display()
            .to_string()
    }

    fn p(pid: u32, ppid: u32) -> ProcInfo {
        ProcInfo {
            pid,
            ppid,
            pgid: 1,
            rss_bytes: 1,
        }
    }

    #[test]
    fn children_inherit_their_ranks_and_the_launcher_has_none() {
        let tree = [p(10, 1), p(11, 10), p(12, 10), p(13, 11), p(14, 12)];
        let own = |pid| match pid {
            11 => Some(0),
            12 => Some(1),
            _ => None,
        };
        let r = assign_ranks(&tree, &mut { own });
        assert_eq!(r.get(&10), None);
        assert_eq!((r[&11], r[&13]), (0, 0));
        assert_eq!((r[&12], r[&14]), (1, 1));
    }

    /// The stand-in trainer through the stand-in launcher, `n` ranks, with
    /// `env` set for the trainer (through `env`, as the environment of this
    /// test process is shared by its threads).
    fn launched(n: u32, batch: u64, env: &[&str]) -> TrialResult {
        let mut argv: Vec<String> = vec!["env".into()];
        argv.extend(env.iter().map(|s| s.to_string()));
        argv.extend(["sh".into(), fixture("fake_trainer.sh"), "{batch}".into()]);
        let launcher = Launcher {
            program: fixture("fake_launcher.sh"),
            ..Launcher::new(LauncherKind::Torchrun, n)
        };
        run_trial(
            &CommandTemplate::new(argv).unwrap(),
            batch,
            &TrialOptions {
                timeout: Duration::from_secs(60),
                reader: StepReader::Protocol,
                warmup_steps: 2,
                echo: false,
                memory_limit: None,
                launcher: Some(launcher),
                lr: None,
                seed: None,
                stop_at: None,
                noise_every: None,
            },
            &mut |_| {},
        )
    }

    #[test]
    fn every_rank_is_measured_and_the_slowest_sets_the_step() {
        let r = launched(
            3,
            16,
            &["FAKE_SLOW_RANK=1", "FAKE_STEPS=30", "FAKE_SLEEP=0.5"],
        );
        assert_eq!(r.outcome, Outcome::Ran, "{r:?}");
        let ranks: Vec<u32> = r.ranks.iter().map(|x| x.rank).collect();
        assert_eq!(ranks, [0, 1, 2]);
        for x in &r.ranks {
            assert_eq!(x.steps, 30, "{x:?}");
            assert!(x.peak_host_bytes.is_some_and(|b| b > 0), "{x:?}");
        }
        let fast = 2000.0e-6 + 10.0e-6 * 16.0;
        let steps = r.steps.unwrap();
        // Rank 1 is 3x slower; 3 ranks of 16 samples per step.
        assert!(
            (steps.step_time.median - 3.0 * fast).abs() < 1e-12,
            "{steps:?}"
        );
        assert!((steps.samples_per_s - 48.0 / (3.0 * fast)).abs() < 1e-6);
        assert!((r.ranks[0].median_step_s.unwrap() - fast).abs() < 1e-12);
    }

    #[test]
    fn out_of_memory_on_one_rank_is_the_trials_and_a_crash_stays_a_crash() {
        let r = launched(2, 64, &["FAKE_OOM_RANK=1", "FAKE_OOM_ABOVE=32"]);
        assert!(
            matches!(r.outcome, Outcome::OutOfMemory(_)),
            "{:?}",
            r.outcome
        );
        let r = launched(2, 16, &["FAKE_OOM_RANK=1", "FAKE_OOM_ABOVE=32"]);
        assert_eq!(r.outcome, Outcome::Ran);
        let r = launched(2, 8, &["FAKE_CRASH_RANK=1", "FAKE_CRASH_AT=8"]);
        match &r.outcome {
            Outcome::Crashed(why) => assert!(why.contains("exit status 1"), "{why}"),
            other => panic!("expected a crash, got {other:?}"),
        }
    }
}
