//! Memory (and GPU use) of a running process tree, sampled while it runs.
//!
//! The tree is the trial's process group: the command and everything it
//! starts (data-loader workers, a shell's children) unless they leave the
//! group on purpose. Host memory is the sum of the members' resident set
//! sizes, read from Linux's /proc (by hand: one `stat` line per process is
//! all we need, where a system-information crate would refresh the whole
//! machine per sample). GPU memory and utilisation come from NVML when an
//! NVIDIA driver is present.

use nvml_wrapper::Nvml;
use nvml_wrapper::enums::device::UsedGpuMemory;
use std::sync::OnceLock;

/// One process as /proc shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcInfo {
    /// Its process id.
    pub pid: u32,
    /// Its parent's process id.
    pub ppid: u32,
    /// Its process group.
    pub pgid: i32,
    /// Its resident memory.
    pub rss_bytes: u64,
}

/// Every process of the machine (Linux; empty elsewhere).
fn all_processes() -> Vec<ProcInfo> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let page = page_size();
    let mut out = Vec::new();
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue; // ended between listing and reading
        };
        if let Some((ppid, pgid, rss_pages)) = parse_stat(&stat) {
            out.push(ProcInfo {
                pid,
                ppid,
                pgid,
                rss_bytes: rss_pages * page,
            });
        }
    }
    out
}

/// Members of process group `pgid` with their resident bytes (Linux; empty elsewhere).
pub fn group_members(pgid: i32) -> Vec<(u32, u64)> {
    all_processes()
        .into_iter()
        .filter(|p| p.pgid == pgid)
        .map(|p| (p.pid, p.rss_bytes))
        .collect()
}

/// Those of `groups` that still hold a process among `seen`: a group whose
/// every process has ended may have its number reused by an unrelated one,
/// which must not be signalled.
pub fn groups_still_ours(groups: &[i32], seen: &std::collections::HashSet<u32>) -> Vec<i32> {
    let all = all_processes();
    groups
        .iter()
        .copied()
        .filter(|&g| all.iter().any(|p| p.pgid == g && seen.contains(&p.pid)))
        .collect()
}

/// The process tree of `root` (a trial's first process, leader of its own
/// group): every member of its group or of `groups`, and every descendant by
/// parent pid. The descendants matter because launchers leave the group:
/// torchrun starts each worker in a session of its own.
pub fn process_tree(root: i32, groups: &[i32]) -> Vec<ProcInfo> {
    tree_of(all_processes(), root, groups)
}

/// [`process_tree`] over a given process list.
fn tree_of(all: Vec<ProcInfo>, root: i32, groups: &[i32]) -> Vec<ProcInfo> {
    let mut inside: std::collections::HashSet<u32> = all
        .iter()
        .filter(|p| p.pgid == root || groups.contains(&p.pgid) || p.pid as i32 == root)
        .map(|p| p.pid)
        .collect();
    // Descendants: repeat until no process's parent is newly inside (trees are shallow).
    loop {
        let before = inside.len();
        for p in &all {
            if inside.contains(&p.ppid) {
                inside.insert(p.pid);
            }
        }
        if inside.len() == before {
            break;
        }
    }
    all.into_iter()
        .filter(|p| inside.contains(&p.pid))
        .collect()
}

/// The rank a launcher gave process `pid`: `RANK` (else `LOCAL_RANK`) in
/// the environment it was started with; `None` when it has neither or its
/// environment cannot be read.
pub fn env_rank(pid: u32) -> Option<u32> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    rank_from_environ(&env)
}

/// `RANK` (else `LOCAL_RANK`) from a NUL-separated environment block.
fn rank_from_environ(env: &[u8]) -> Option<u32> {
    let var = |name: &str| {
        env.split(|&b| b == 0).find_map(|kv| {
            let kv = std::str::from_utf8(kv).ok()?;
            kv.strip_prefix(name)?
                .strip_prefix('=')?
                .trim()
                .parse()
                .ok()
        })
    };
    var("RANK").or_else(|| var("LOCAL_RANK"))
}

/// (parent pid, process group, resident pages) from a /proc/PID/stat line.
/// The command name sits in parentheses and may itself contain spaces and
/// parentheses, so fields are counted from the last `)`.
fn parse_stat(stat: &str) -> Option<(u32, i32, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(3) ppid(4) pgrp(5) ... rss(24), 1-based per proc(5).
    let ppid = fields.get(1)?.parse().ok()?;
    let pgrp = fields.get(2)?.parse().ok()?;
    let rss = fields.get(21)?.parse().ok()?;
    Some((ppid, pgrp, rss))
}

/// The peak virtual size (`VmPeak` of /proc/PID/status) of process `pid`:
/// what `RLIMIT_AS` holds each process to. `None` once it has ended.
pub fn vm_peak(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_vm_peak(&status)
}

fn parse_vm_peak(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmPeak:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 { p as u64 } else { 4096 }
}

/// NVML, loaded once; `None` without an NVIDIA driver (not an error).
fn nvml() -> Option<&'static Nvml> {
    static NVML: OnceLock<Option<Nvml>> = OnceLock::new();
    NVML.get_or_init(|| Nvml::init().ok()).as_ref()
}

/// Total memory of GPU `device` (NVML); `None` without NVML.
pub fn gpu_total_bytes(device: u32) -> Option<u64> {
    let dev = nvml()?.device_by_index(device).ok()?;
    dev.memory_info().ok().map(|m| m.total)
}

/// What the GPUs say about `pids` right now.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GpuSample {
    /// GPU memory used by these processes, summed over devices.
    pub bytes: u64,
    /// Utilisation (% of time a kernel ran) of the busiest device they use.
    pub util_pct: u32,
    /// Index of the device holding most of their memory.
    pub device: u32,
}

/// One NVML reading of every compute process on every device, so that one
/// reading serves the whole tree and each rank of it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuReading {
    /// (pid, device, bytes) of each process holding GPU memory.
    pub processes: Vec<(u32, u32, u64)>,
    /// (device, utilisation %) of each device.
    pub util: Vec<(u32, u32)>,
}

/// Reads every device; `None` without NVML.
pub fn gpu_reading() -> Option<GpuReading> {
    let nvml = nvml()?;
    let mut r = GpuReading::default();
    for i in 0..nvml.device_count().ok()? {
        let Ok(dev) = nvml.device_by_index(i) else {
            continue;
        };
        for p in dev.running_compute_processes().unwrap_or_default() {
            if let UsedGpuMemory::Used(b) = p.used_gpu_memory {
                r.processes.push((p.pid, i, b));
            }
        }
        r.util
            .push((i, dev.utilization_rates().map_or(0, |u| u.gpu)));
    }
    Some(r)
}

impl GpuReading {
    /// What this reading says about `pids`; `None` when none of them holds GPU memory.
    pub fn sample(&self, pids: &[u32]) -> Option<GpuSample> {
        let mut per_device: Vec<(u32, u64)> = Vec::new();
        for &(pid, dev, bytes) in &self.processes {
            if bytes == 0 || !pids.contains(&pid) {
                continue;
            }
            match per_device.iter_mut().find(|d| d.0 == dev) {
                Some(d) => d.1 += bytes,
                None => per_device.push((dev, bytes)),
            }
        }
        let most = per_device.iter().max_by_key(|d| d.1)?;
        let util = |dev: u32| self.util.iter().find(|u| u.0 == dev).map_or(0, |u| u.1);
        Some(GpuSample {
            bytes: per_device.iter().map(|d| d.1).sum(),
            util_pct: per_device.iter().map(|d| util(d.0)).max().unwrap_or(0),
            device: most.0,
        })
    }
}

/// One NVML reading for the processes `pids`; `None` without NVML or when
/// none of them holds GPU memory. NVML reports host PIDs: inside a container
/// with its own PID namespace the processes are not recognised.
pub fn gpu_sample(pids: &[u32]) -> Option<GpuSample> {
    gpu_reading()?.sample(pids)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_lines_with_awkward_names() {
        let line = "4242 (python3 (worker) x) S 4200 4242 4242 0 -1 4194560 5 0 0 0 1 2 0 0 20 0 3 0 100 123456789 2500 18446744073709551615 0";
        assert_eq!(parse_stat(line), Some((4200, 4242, 2500)));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn reads_vm_peak() {
        let status = "Name:\tpython3\nVmPeak:\t 2048 kB\nVmSize:\t 1024 kB\n";
        assert_eq!(parse_vm_peak(status), Some(2048 * 1024));
        assert_eq!(parse_vm_peak("Name: x"), None);
        assert!(vm_peak(std::process::id()).is_some_and(|b| b > 0));
    }

    #[test]
    fn sees_its_own_process_group() {
        // SAFETY: getpgrp has no preconditions.
        let me = unsafe { libc::getpgrp() };
        let members = group_members(me);
        if std::path::Path::new("/proc/self/stat").exists() {
            let pid = std::process::id();
            let (_, rss) = members.iter().find(|m| m.0 == pid).expect("this process");
            assert!(*rss > 0);
        }
    }

    fn p(pid: u32, ppid: u32, pgid: i32) -> ProcInfo {
        ProcInfo {
            pid,
            ppid,
            pgid,
            rss_bytes: 1,
        }
    }

    #[test]
    fn the_tree_follows_workers_into_their_own_sessions() {
        let all = vec![
            p(1, 0, 1),
            p(100, 1, 100),   // the launcher, leader of the trial's group
            p(101, 100, 100), // a helper in the group
            p(110, 100, 110), // rank 0 in a session of its own
            p(111, 110, 110), // its data-loader worker
            p(120, 100, 120), // rank 1
            p(130, 1, 130),   // orphaned into a remembered group
            p(131, 1, 131),   // unrelated
            p(200, 1, 200),   // unrelated
        ];
        let mut pids: Vec<u32> = tree_of(all, 100, &[130]).iter().map(|p| p.pid).collect();
        pids.sort();
        assert_eq!(pids, [100, 101, 110, 111, 120, 130]);
    }

    #[test]
    fn reads_the_rank_from_an_environment_block() {
        assert_eq!(
            rank_from_environ(b"PATH=/bin\0RANK=3\0LOCAL_RANK=1\0"),
            Some(3)
        );
        assert_eq!(rank_from_environ(b"LOCAL_RANK=1\0WORLD_SIZE=2"), Some(1));
        assert_eq!(rank_from_environ(b"GROUP_RANK=1\0MY_RANK=5\0"), None);
        assert_eq!(rank_from_environ(b""), None);
    }

    #[test]
    fn one_gpu_reading_serves_each_rank() {
        let r = GpuReading {
            processes: vec![(10, 0, 100), (11, 1, 300), (12, 1, 50)],
            util: vec![(0, 40), (1, 90)],
        };
        let s = r.sample(&[10, 11]).unwrap();
        assert_eq!((s.bytes, s.util_pct, s.device), (400, 90, 1));
        assert_eq!(r.sample(&[10]).unwrap().device, 0);
        assert!(r.sample(&[99]).is_none());
    }
}
