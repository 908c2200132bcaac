//! The standard `process_*` metrics (those of the Prometheus client libraries' process
//! collectors; `prometheus-client` has none), read from `/proc` on each scrape. Linux only:
//! elsewhere the collector writes nothing.

// The parsers are Linux's formats; elsewhere only their tests use them.
#![cfg_attr(not(target_os = "linux"), allow(dead_code))]

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Unit;

/// Writes the `process_*` families of the running process.
#[derive(Debug)]
pub(super) struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let stats = ProcessStats::read();
        if let Some(cpu) = stats.cpu_seconds {
            let metric = ConstCounter::new(cpu);
            let family = encoder.encode_descriptor(
                "process_cpu",
                "Total user and system CPU time spent in seconds.",
                Some(&Unit::Seconds),
                metric.metric_type(),
            )?;
            metric.encode(family)?;
        }
        let gauges = [
            (
                "process_resident_memory",
                "Resident memory size in bytes.",
                Some(Unit::Bytes),
                stats.resident_bytes.map(|b| b as f64),
            ),
            (
                "process_virtual_memory",
                "Virtual memory size in bytes.",
                Some(Unit::Bytes),
                stats.virtual_bytes.map(|b| b as f64),
            ),
            (
                "process_start_time",
                "Start time of the process since unix epoch in seconds.",
                Some(Unit::Seconds),
                stats.start_time_seconds,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors.",
                None,
                stats.open_fds.map(|n| n as f64),
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors.",
                None,
                stats.max_fds.map(|n| n as f64),
            ),
        ];
        for (name, help, unit, value) in &gauges {
            let Some(value) = value else {
                continue;
            };
            let metric = ConstGauge::new(*value);
            let family =
                encoder.encode_descriptor(name, help, unit.as_ref(), metric.metric_type())?;
            metric.encode(family)?;
        }
        Ok(())
    }
}

/// What `/proc` says about this process; a value that could not be read is `None` (and
/// its family left out of the scrape).
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct ProcessStats {
    pub(super) cpu_seconds: Option<f64>,
    pub(super) resident_bytes: Option<u64>,
    pub(super) virtual_bytes: Option<u64>,
    pub(super) start_time_seconds: Option<f64>,
    pub(super) open_fds: Option<u64>,
    pub(super) max_fds: Option<u64>,
}

/// The fields of `/proc/<pid>/stat` the metrics use, in their own units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Stat {
    /// User-mode CPU time, in clock ticks (field 14).
    pub(super) utime: u64,
    /// Kernel-mode CPU time, in clock ticks (field 15).
    pub(super) stime: u64,
    /// Start time after boot, in clock ticks (field 22).
    pub(super) starttime: u64,
    /// Virtual memory size, in bytes (field 23).
    pub(super) vsize: u64,
    /// Resident set size, in pages (field 24).
    pub(super) rss: u64,
}

/// Parses `/proc/<pid>/stat`. The second field (the command, in parentheses) may itself
/// hold spaces and parentheses: fields are counted from the last `)`.
pub(super) fn parse_stat(text: &str) -> anyhow::Result<Stat> {
    use anyhow::Context as _;
    let (_, rest) = text
        .rsplit_once(')')
        .context("no `)` closing the command field")?;
    // `rest` starts at field 3 (state).
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| -> anyhow::Result<u64> {
        let text = fields
            .get(n - 3)
            .with_context(|| format!("field {n} is missing ({} fields)", fields.len() + 2))?;
        text.parse()
            .with_context(|| format!("field {n} ({text:?}) is not a number"))
    };
    Ok(Stat {
        utime: field(14)?,
        stime: field(15)?,
        starttime: field(22)?,
        vsize: field(23)?,
        rss: field(24)?,
    })
}

/// The boot time (`btime`, unix seconds) from `/proc/stat`.
pub(super) fn parse_boot_time(text: &str) -> anyhow::Result<u64> {
    use anyhow::Context as _;
    let value = text
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .context("no btime line")?;
    value
        .trim()
        .parse()
        .with_context(|| format!("btime {value:?} is not a number"))
}

/// The soft limit of open files from `/proc/<pid>/limits`; `None` when unlimited.
pub(super) fn parse_max_open_files(text: &str) -> anyhow::Result<Option<u64>> {
    use anyhow::Context as _;
    let line = text
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .context("no `Max open files` line")?;
    let soft = line
        .trim_start_matches("Max open files")
        .split_whitespace()
        .next()
        .context("`Max open files` has no soft limit")?;
    if soft == "unlimited" {
        return Ok(None);
    }
    soft.parse()
        .map(Some)
        .with_context(|| format!("soft limit {soft:?} is not a number"))
}

impl ProcessStats {
    /// Reads the running process's statistics.
    #[cfg(target_os = "linux")]
    pub(super) fn read() -> Self {
        use anyhow::Context as _;
        fn logged<T>(what: &str, result: anyhow::Result<T>) -> Option<T> {
            result
                .inspect_err(|error| tracing::debug!(what, error = %format!("{error:#}"), "process metric not read"))
                .ok()
        }
        let read =
            |path: &str| std::fs::read_to_string(path).with_context(|| format!("reading {path}"));
        // SAFETY: `sysconf` only reads configuration values; it has no preconditions.
        let (ticks, page) = unsafe {
            (
                libc::sysconf(libc::_SC_CLK_TCK),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        let stat = logged("stat", read("/proc/self/stat").and_then(|t| parse_stat(&t)));
        let boot = logged(
            "boot time",
            read("/proc/stat").and_then(|t| parse_boot_time(&t)),
        );
        let ticks = (ticks > 0).then_some(ticks as f64);
        let page = u64::try_from(page).ok().filter(|p| *p > 0);
        Self {
            cpu_seconds: stat.zip(ticks).map(|(s, t)| (s.utime + s.stime) as f64 / t),
            resident_bytes: stat.zip(page).map(|(s, p)| s.rss.saturating_mul(p)),
            virtual_bytes: stat.map(|s| s.vsize),
            start_time_seconds: stat
                .zip(ticks)
                .zip(boot)
                .map(|((s, t), b)| b as f64 + s.starttime as f64 / t),
            open_fds: logged(
                "open fds",
                std::fs::read_dir("/proc/self/fd")
                    .context("listing /proc/self/fd")
                    .map(|entries| entries.count() as u64),
            ),
            max_fds: logged(
                "max fds",
                read("/proc/self/limits").and_then(|t| parse_max_open_files(&t)),
            )
            .flatten(),
        }
    }

    /// Nothing to read outside Linux.
    #[cfg(not(target_os = "linux"))]
    pub(super) fn read() -> Self {
        Self::default()
    }
}
