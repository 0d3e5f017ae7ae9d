//! Whatever ends batchfit ends its trials. A long trial runs (the probe's
//! measuring worker, a user's command, a stand-in launcher with two ranks in
//! sessions of their own); batchfit gets SIGTERM, SIGHUP or SIGKILL; 2 s
//! after the signal no process of the trial's tree is left, and batchfit's
//! exit status is the one a shell reports for that signal.

mod common;

use common::fixture;

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::process::ExitStatusExt as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long after the signal the tree must be gone.
const GONE_WITHIN: Duration = Duration::from_secs(2);

/// A process as /proc shows it: parent, process group, state, command line.
struct Proc {
    ppid: u32,
    pgid: i32,
    zombie: bool,
    cmdline: String,
}

/// Every process on the machine, by pid.
type Processes = BTreeMap<u32, Proc>;

/// Whether the trial runs, given batchfit's descendants.
type Ready<'a> = &'a dyn Fn(&[u32], &Processes) -> bool;

fn processes() -> Processes {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // After the command's name in parentheses: state, ppid, pgrp.
        let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
        let cmdline = std::fs::read(entry.path().join("cmdline"))
            .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
            .unwrap_or_default();
        out.insert(
            pid,
            Proc {
                ppid: fields[1].parse().unwrap(),
                pgid: fields[2].parse().unwrap(),
                zombie: fields[0] == "Z",
                cmdline,
            },
        );
    }
    out
}

/// Every live process below `root`.
fn descendants(root: u32, all: &Processes) -> Vec<u32> {
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(
            all.iter()
                .filter(|(_, p)| p.ppid == parent && !p.zombie)
                .map(|(&pid, _)| pid),
        );
        i += 1;
    }
    found.remove(0);
    found
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| !s[s.rfind(')').unwrap() + 2..].starts_with('Z'))
}

/// Whether a live (not zombie) process is left in group `pgid`.
fn group_alive(pgid: i32) -> bool {
    processes().values().any(|p| p.pgid == pgid && !p.zombie)
}

fn pids_in(file: &Path) -> Vec<u32> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Starts `batchfit args` with `env`, waits until `ready` says the trial
/// runs (given batchfit's descendants), sends `signal`, and checks that 2 s
/// later nothing of what was seen below batchfit (processes and their
/// groups) is left.
fn ends_with_batchfit(signal: i32, args: &[String], env: &[(&str, String)], ready: Ready) {
    let mut child: Child = Command::new(env!("CARGO_BIN_EXE_batchfit"))
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let root = child.id();
    let mut seen: BTreeSet<u32> = BTreeSet::new();
    let mut groups: BTreeSet<i32> = BTreeSet::new();
    let note = |seen: &mut BTreeSet<u32>, groups: &mut BTreeSet<i32>| {
        let all = processes();
        let below = descendants(root, &all);
        for pid in &below {
            seen.insert(*pid);
            groups.insert(all[pid].pgid);
        }
        (below, all)
    };
    let started = Instant::now();
    loop {
        let (below, all) = note(&mut seen, &mut groups);
        if ready(&below, &all) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the trial never started: {args:?}"
        );
        assert!(child.try_wait().unwrap().is_none(), "batchfit ended early");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Long enough for batchfit's sampling (every 100 ms) to have seen a
    // launcher's ranks, which leave the trial's group.
    std::thread::sleep(Duration::from_millis(400));
    note(&mut seen, &mut groups);
    // batchfit's own group (the test's) is not the trial's.
    // SAFETY: getpgrp has no preconditions.
    groups.remove(&unsafe { libc::getpgrp() });

    // SAFETY: signals the batchfit process this test started.
    unsafe { libc::kill(root as i32, signal) };
    let signalled = Instant::now();
    let status = child.wait().unwrap();
    if signal == libc::SIGKILL {
        assert_eq!(status.signal(), Some(libc::SIGKILL));
    } else {
        assert_eq!(status.code(), Some(128 + signal), "{status:?}");
    }
    let left = || {
        let procs: Vec<u32> = seen.iter().copied().filter(|&p| alive(p)).collect();
        let groups: Vec<i32> = groups.iter().copied().filter(|&g| group_alive(g)).collect();
        (procs, groups)
    };
    while left() != (vec![], vec![]) && signalled.elapsed() < GONE_WITHIN {
        std::thread::sleep(Duration::from_millis(20));
    }
    let (procs, live_groups) = left();
    // Clean up before failing, so a failure leaves nothing running either.
    for g in &live_groups {
        // SAFETY: signals a process group this test's batchfit started.
        unsafe { libc::kill(-g, libc::SIGKILL) };
    }
    assert!(
        procs.is_empty() && live_groups.is_empty(),
        "signal {signal}: left running {:.1} s later: processes {procs:?}, groups {live_groups:?}",
        signalled.elapsed().as_secs_f64()
    );
}

const SIGNALS: [i32; 3] = [libc::SIGTERM, libc::SIGHUP, libc::SIGKILL];

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

#[test]
fn the_probes_measuring_worker_ends_with_batchfit() {
    // Question 1's network at a large batch: seconds a step on 2 cores.
    let args = strings(&[
        "probe",
        "zoo:rnn-tutorial",
        "--batches",
        "512",
        "--time-cap",
        "600",
    ]);
    for signal in SIGNALS {
        ends_with_batchfit(signal, &args, &[], &|below, all| {
            below
                .iter()
                .any(|p| all[p].cmdline.contains("__measure-worker"))
        });
    }
}

#[test]
fn a_users_command_and_its_children_end_with_batchfit() {
    for signal in SIGNALS {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("pids");
        let args = strings(&["run", "--", "sh", &fixture("fake_trainer.sh"), "{batch}"]);
        let env = [
            ("FAKE_HANG_AT", "1".to_string()),
            ("FAKE_PIDS", pid_file.display().to_string()),
        ];
        // The trainer and its child (`sleep`).
        ends_with_batchfit(signal, &args, &env, &|_, _| pids_in(&pid_file).len() >= 2);
    }
}

#[test]
fn a_launchers_ranks_in_their_own_sessions_end_with_batchfit() {
    for signal in SIGNALS {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("pids");
        let args = strings(&[
            "run",
            "--launcher",
            "torchrun",
            "--nproc-per-node",
            "2",
            "--launcher-cmd",
            &fixture("fake_launcher.sh"),
            "--",
            "sh",
            &fixture("fake_trainer.sh"),
            "{batch}",
        ]);
        let env = [
            ("FAKE_HANG_AT", "1".to_string()),
            ("FAKE_PIDS", pid_file.display().to_string()),
        ];
        // Two ranks and a child each.
        ends_with_batchfit(signal, &args, &env, &|_, _| pids_in(&pid_file).len() >= 4);
        // Under a launcher the ranks are not batchfit's descendants after the
        // launcher died; the pid file names them all.
        let left: Vec<u32> = pids_in(&pid_file)
            .into_iter()
            .filter(|&p| alive(p))
            .collect();
        assert!(left.is_empty(), "signal {signal}: ranks left: {left:?}");
    }
}
