//! What the kernel says of a process (resident memory, CPU time) and of the machine, read from
//! `/proc`.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::Serialize;

/// Resident memory of process `pid` (`VmRSS` of /proc/<pid>/status), KiB.
pub fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    status_kib(pid, "VmRSS:")
}

/// The most resident memory process `pid` ever had (`VmHWM`), KiB.
pub fn peak_rss_kib(pid: u32) -> anyhow::Result<u64> {
    status_kib(pid, "VmHWM:")
}

fn status_kib(pid: u32, field: &str) -> anyhow::Result<u64> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("no {field} in {path}"))
}

/// The median of `samples` reads of [`rss_kib`], `every` apart: one read can catch the
/// allocator between a free and the return of the memory.
pub async fn settled_rss_kib(pid: u32, samples: usize, every: Duration) -> anyhow::Result<u64> {
    let mut reads = Vec::with_capacity(samples);
    for i in 0..samples.max(1) {
        if i > 0 {
            tokio::time::sleep(every).await;
        }
        reads.push(rss_kib(pid)?);
    }
    reads.sort_unstable();
    Ok(reads[reads.len() / 2])
}

/// CPU time process `pid` has used (user + system, /proc/<pid>/stat), seconds.
pub fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    // The command name may hold spaces and parentheses: the fields start after the last ')'.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    // After the name: state is field 3 of stat(5), utime 14 and stime 15.
    let ticks = |i: usize| -> anyhow::Result<f64> {
        fields
            .get(i - 3)
            .and_then(|v| v.parse::<f64>().ok())
            .with_context(|| format!("field {i} of {path}"))
    };
    // SAFETY: sysconf only reads a configuration value.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    anyhow::ensure!(per_second > 0, "sysconf(_SC_CLK_TCK) failed");
    Ok((ticks(14)? + ticks(15)?) / per_second as f64)
}

/// CPU process `pid` used over `window`, in cores (1.0: one core busy all along).
pub async fn cpu_cores_over(pid: u32, window: Duration) -> anyhow::Result<f64> {
    let (before, started) = (cpu_seconds(pid)?, Instant::now());
    tokio::time::sleep(window).await;
    let used = cpu_seconds(pid)? - before;
    Ok(used / started.elapsed().as_secs_f64())
}

/// The machine a measurement ran on.
#[derive(Clone, Debug, Serialize)]
pub struct Machine {
    /// CPUs this process may run on.
    pub cpus: usize,
    /// CPU model.
    pub cpu_model: String,
    /// Memory, GiB.
    pub memory_gib: f64,
    /// The 1-minute load average when the measurement began (other work on the machine).
    pub load_average: f64,
    /// When the measurement began (UTC).
    pub date: String,
}

impl Machine {
    /// Reads it now.
    pub fn read() -> Self {
        let cpus = std::thread::available_parallelism().map_or(1, usize::from);
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, m)| m.trim().to_string())
            .unwrap_or_else(|| "unknown".into());
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let memory_kib: f64 = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        let load_average = std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|l| l.split_whitespace().next()?.parse().ok())
            .unwrap_or(0.0);
        let date = jiff::Timestamp::from_second(jiff::Timestamp::now().as_second())
            .map(|t| t.to_string())
            .unwrap_or_default();
        Self {
            cpus,
            cpu_model,
            memory_gib: memory_kib / (1024.0 * 1024.0),
            load_average,
            date,
        }
    }

    /// One line: `2 CPUs (model), 23.4 GiB, load 7.3, 2026-11-28T14:00:00Z`.
    pub fn line(&self) -> String {
        format!(
            "{} CPUs ({}), {:.1} GiB, load average {:.1} at the start, {}",
            self.cpus, self.cpu_model, self.memory_gib, self.load_average, self.date
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_memory_and_cpu_time() {
        let pid = std::process::id();
        let rss = rss_kib(pid).expect("VmRSS");
        assert!(rss > 0);
        assert!(peak_rss_kib(pid).expect("VmHWM") >= rss);
        assert!(cpu_seconds(pid).expect("CPU time") >= 0.0);
        assert!(Machine::read().cpus >= 1);
    }
}
