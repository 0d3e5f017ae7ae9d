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

/// Members of process group `pgid` with their resident bytes (Linux; empty elsewhere).
pub fn group_members(pgid: i32) -> Vec<(u32, u64)> {
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
        if let Some((group, rss_pages)) = parse_stat(&stat)
            && group == pgid
        {
            out.push((pid, rss_pages * page));
        }
    }
    out
}

/// (process group, resident pages) from a /proc/PID/stat line. The command
/// name sits in parentheses and may itself contain spaces and parentheses,
/// so fields are counted from the last `)`.
fn parse_stat(stat: &str) -> Option<(i32, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(3) ppid(4) pgrp(5) ... rss(24), 1-based per proc(5).
    let pgrp = fields.get(2)?.parse().ok()?;
    let rss = fields.get(21)?.parse().ok()?;
    Some((pgrp, rss))
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

/// One NVML reading for the processes `pids`; `None` without NVML or when
/// none of them holds GPU memory. NVML reports host PIDs: inside a container
/// with its own PID namespace the processes are not recognised.
pub fn gpu_sample(pids: &[u32]) -> Option<GpuSample> {
    let nvml = nvml()?;
    let mut sample: Option<GpuSample> = None;
    let mut most = 0;
    for i in 0..nvml.device_count().ok()? {
        let Ok(dev) = nvml.device_by_index(i) else {
            continue;
        };
        let used: u64 = dev
            .running_compute_processes()
            .unwrap_or_default()
            .iter()
            .filter(|p| pids.contains(&p.pid))
            .map(|p| match p.used_gpu_memory {
                UsedGpuMemory::Used(b) => b,
                UsedGpuMemory::Unavailable => 0,
            })
            .sum();
        if used == 0 {
            continue;
        }
        let util = dev.utilization_rates().map_or(0, |u| u.gpu);
        let s = sample.get_or_insert_with(GpuSample::default);
        s.bytes += used;
        s.util_pct = s.util_pct.max(util);
        if used > most {
            most = used;
            s.device = i;
        }
    }
    sample
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_lines_with_awkward_names() {
        let line = "4242 (python3 (worker) x) S 4200 4242 4242 0 -1 4194560 5 0 0 0 1 2 0 0 20 0 3 0 100 123456789 2500 18446744073709551615 0";
        assert_eq!(parse_stat(line), Some((4242, 2500)));
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
}
