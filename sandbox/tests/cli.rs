//! The `ngo-sandbox` commands as users run them: `demo` unattended (no terminal), and `up`
//! then `down`. Each starts a whole sandbox, so they run one at a time.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

static ONE_SANDBOX_AT_A_TIME: Mutex<()> = Mutex::new(());

fn ngo_sandbox() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ngo-sandbox"));
    command.stdin(Stdio::null());
    command
}

#[test]
fn demo_runs_unattended_scales_up_and_down_and_leaves_nothing_behind() {
    let _one = ONE_SANDBOX_AT_A_TIME
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let started = Instant::now();
    let out = ngo_sandbox()
        .arg("demo")
        .output()
        .expect("ngo-sandbox demo runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}");
    assert!(out.status.success(), "demo failed: {stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(300),
        "the demo takes under 5 minutes once built: {:?}",
        started.elapsed()
    );
    // Plain lines, no terminal control sequences, when stdin is not a terminal.
    assert!(!stdout.contains('\x1b'), "plain output without a terminal");
    for expected in [
        "cluster-autoscaler 1.36.1 running with --cloud-provider=externalgrpc",
        "cluster-autoscaler: ScaledUpGroup",
        "setting group MachineDeployment/demo/workers size to 4 instead of 1 (max: 5)",
        "cluster-autoscaler: ScaleDown",
        "scale-up: target raised after",
        "scale-down: target back to 1 after",
        "demo finished in",
    ] {
        assert!(stdout.contains(expected), "demo output lacks {expected:?}");
    }
    let dir = stdout
        .lines()
        .find_map(|l| {
            l.split_once("logs in ")
                .map(|(_, d)| d.trim_end_matches("/logs"))
        })
        .expect("the demo names its sandbox directory");
    assert!(!std::path::Path::new(dir).exists(), "{dir} is removed");
    let leftover = Command::new("pgrep")
        .args(["-f", dir])
        .output()
        .expect("pgrep");
    assert!(
        leftover.stdout.is_empty(),
        "processes left behind: {}",
        String::from_utf8_lossy(&leftover.stdout)
    );
}

#[test]
fn the_cherry_demo_scales_a_node_pool_of_emulated_servers() {
    let _one = ONE_SANDBOX_AT_A_TIME
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let out = ngo_sandbox()
        .args(["demo", "--cherry"])
        .output()
        .expect("ngo-sandbox demo --cherry runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    assert!(
        out.status.success(),
        "demo failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for expected in [
        "Cherry Servers emulator at http://127.0.0.1:",
        "setting group NodePool/demo/workers size to 4 instead of 1 (max: 5)",
        "cluster-autoscaler: ScaleDown",
        "scale-down: target back to 1 after",
        "demo finished in",
    ] {
        assert!(stdout.contains(expected), "demo output lacks {expected:?}");
    }
}

/// The lines printed so far (waits briefly for the rest of a burst).
fn printed_so_far(lines: &std::sync::mpsc::Receiver<String>) -> Vec<String> {
    let mut out = Vec::new();
    while let Ok(line) = lines.recv_timeout(Duration::from_millis(500)) {
        out.push(line);
    }
    out
}

#[test]
fn up_serves_a_kubeconfig_until_down_stops_it() {
    let _one = ONE_SANDBOX_AT_A_TIME
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let mut up = ngo_sandbox()
        .arg("up")
        .stdout(Stdio::piped())
        .spawn()
        .expect("ngo-sandbox up starts");
    let stdout = up.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    let (line_tx, rx_lines) = std::sync::mpsc::channel();
    // Keep reading to the end: `up` prints while it stops, too.
    let reader = std::thread::spawn(move || {
        let mut all = Vec::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            eprintln!("{line}");
            if let Some(path) = line.trim().strip_prefix("export KUBECONFIG=") {
                let _ = tx.send(PathBuf::from(path));
            }
            let _ = line_tx.send(line.clone());
            all.push(line);
        }
        all
    });
    let kubeconfig = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("up prints a KUBECONFIG");
    let kubectl = |args: &[&str]| {
        let out = Command::new(ngo_testbed::upstream_bin("kubectl"))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args(args)
            .output()
            .expect("kubectl runs");
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let clusters = kubectl(&[
        "-n",
        "sandbox",
        "get",
        "clusters.cluster.x-k8s.io",
        "-o",
        "name",
    ]);
    assert_eq!(clusters.trim(), "cluster.cluster.x-k8s.io/sandbox");
    let crds = kubectl(&["get", "crd", "-o", "name"]);
    assert!(
        crds.contains("nodegrouppolicies.autoscaling.nodegroup.dev"),
        "{crds}"
    );
    assert!(
        crds.contains("machinedeployments.cluster.x-k8s.io"),
        "{crds}"
    );

    // The examples `up` names apply as printed, and cluster-autoscaler scales the group.
    let printed = printed_so_far(&rx_lines);
    let applies: Vec<String> = printed
        .iter()
        .filter_map(|l| l.trim().strip_prefix("kubectl apply -f ").map(String::from))
        .collect();
    assert_eq!(
        applies.len(),
        3,
        "up prints three examples to apply: {applies:?}"
    );
    let (node_pool, machine_deployment): (Vec<&String>, Vec<&String>) = applies
        .iter()
        .partition(|f| f.ends_with("nodepool-cherry.yaml"));
    for file in machine_deployment {
        kubectl(&["apply", "-f", file]);
    }
    let started = std::time::Instant::now();
    loop {
        let replicas = kubectl(&[
            "-n",
            "sandbox",
            "get",
            "machinedeployments.cluster.x-k8s.io",
            "workers",
            "-o",
            "jsonpath={.spec.replicas}",
        ]);
        if replicas.trim().parse::<i32>().is_ok_and(|r| r > 1) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "cluster-autoscaler scaled the example MachineDeployment up (replicas {replicas:?})"
        );
        std::thread::sleep(Duration::from_secs(2));
    }

    // The NodePool example, then the patch that points it at the emulator, as printed: the
    // pool reads its plan from the emulator.
    kubectl(&["apply", "-f", node_pool[0]]);
    let patch = printed
        .iter()
        .find_map(|l| {
            l.trim()
                .strip_prefix("kubectl ")
                .filter(|c| c.contains(" patch "))
        })
        .expect("up prints the patch of the NodePool's endpoint");
    let args: Vec<String> = patch
        .split_whitespace()
        .map(|a| a.trim_matches('\'').to_string())
        .collect();
    kubectl(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let started = std::time::Instant::now();
    loop {
        let cpu = kubectl(&[
            "-n",
            "sandbox",
            "get",
            "nodepools.autoscaling.nodegroup.dev",
            "cherry-workers",
            "-o",
            "jsonpath={.status.machineType.capacity.cpu}",
        ]);
        if cpu.trim() == "4" {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "the example NodePool read its plan from the emulator (cpu {cpu:?})"
        );
        std::thread::sleep(Duration::from_secs(2));
    }

    let down = ngo_sandbox()
        .arg("down")
        .output()
        .expect("ngo-sandbox down runs");
    assert!(
        down.status.success(),
        "down: {}",
        String::from_utf8_lossy(&down.stderr)
    );
    let status = up.wait().expect("up exits");
    assert!(status.success(), "up exits cleanly after down: {status}");
    let printed = reader.join().expect("reader");
    assert!(
        printed.iter().any(|l| l.contains("stopped")),
        "up says it stopped: {printed:?}"
    );
    assert!(!kubeconfig.exists(), "the sandbox directory is removed");
}
