//! The process's exposition.

use super::*;

#[test]
fn the_build_info_names_the_version() {
    let text = OperatorMetrics::new().exposition.encode();
    let line = format!(
        "nodegroup_build_info{{version=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION")
    );
    assert!(text.lines().any(|l| l == line), "{text}");
}

#[test]
fn every_layers_families_are_served_once() {
    let metrics = OperatorMetrics::new();
    metrics.pools.set_backend_available("ns/pool", true);
    metrics.runtime.set_leader(true);
    metrics
        .service
        .observe_rpc("NodeGroups", tonic::Code::Ok, Duration::ZERO);
    let text = metrics.exposition.encode();
    for line in [
        "nodegroup_nodepool_backend_available{node_pool=\"ns/pool\"} 1",
        "nodegroup_leader 1",
        "nodegroup_relay_streams 0",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
    }
    assert_eq!(
        text.matches("# TYPE nodegroup_grpc_request_duration_seconds ")
            .count(),
        1,
        "{text}"
    );
}

#[test]
fn proc_files_parse_as_the_kernel_writes_them() {
    // The command may hold spaces and parentheses; fields count from the last `)`.
    let stat = "4242 (tokio (rt) 1) S 1 4242 4242 0 -1 4194560 2797 0 0 0 250 130 0 0 20 0 \
                9 0 123456 912345088 5120 18446744073709551615 1 1 0 0 0 0 0 4096 1260 0 0 0 \
                17 3 0 0 0 0 0";
    assert_eq!(
        process::parse_stat(stat).expect("parses"),
        process::Stat {
            utime: 250,
            stime: 130,
            starttime: 123456,
            vsize: 912345088,
            rss: 5120,
        }
    );
    let short = process::parse_stat("1 (init) S 1 2").expect_err("too short");
    assert!(
        format!("{short:#}").contains("field 14 is missing"),
        "{short:#}"
    );
    assert!(process::parse_stat("no command field").is_err());

    let proc_stat = "cpu  1 2 3 4\nintr 5\nctxt 6\nbtime 1700000000\nprocesses 7\n";
    assert_eq!(
        process::parse_boot_time(proc_stat).expect("btime"),
        1_700_000_000
    );
    assert!(process::parse_boot_time("cpu 1\n").is_err());

    let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                  Max cpu time              unlimited            unlimited            seconds   \n\
                  Max open files            1024                 524288               files     \n";
    assert_eq!(
        process::parse_max_open_files(limits).expect("limit"),
        Some(1024)
    );
    let unlimited = "Max open files            unlimited            unlimited            files\n";
    assert_eq!(
        process::parse_max_open_files(unlimited).expect("limit"),
        None
    );
    assert!(process::parse_max_open_files("Max processes 1 1 processes\n").is_err());
}

#[cfg(target_os = "linux")]
#[test]
fn process_metrics_are_exported() {
    // Use some CPU first: the kernel counts it in clock ticks (10 ms).
    let busy = std::time::Instant::now();
    let mut spin = 0u64;
    while busy.elapsed() < std::time::Duration::from_millis(50) {
        spin = std::hint::black_box(spin.wrapping_add(1));
    }
    let text = OperatorMetrics::new().exposition.encode();
    let value = |family: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(family)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("{family} in\n{text}"))
    };
    let now = jiff::Timestamp::now().as_second() as f64;
    assert!(value("process_cpu_seconds_total") > 0.0);
    assert!(value("process_resident_memory_bytes") > 1_000_000.0);
    assert!(value("process_virtual_memory_bytes") >= value("process_resident_memory_bytes"));
    let started = value("process_start_time_seconds");
    assert!(
        started <= now + 1.0 && started > now - 7.0 * 86_400.0,
        "started at {started}, now {now}"
    );
    let open = value("process_open_fds");
    assert!(open >= 3.0, "stdin, stdout, stderr at least: {open}");
    assert!(value("process_max_fds") >= open);
    assert!(
        text.contains("# TYPE process_cpu_seconds counter"),
        "{text}"
    );
    assert!(
        text.contains("# UNIT process_resident_memory_bytes bytes"),
        "{text}"
    );
}
