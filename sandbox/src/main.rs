//! `ngo-sandbox`: run the nodegroup-operator sandbox (real control plane, Cluster API, kwok,
//! the operator binary and the real cluster-autoscaler) on this machine.
//!
//! - `ngo-sandbox up` starts it and keeps it running; it prints a KUBECONFIG to try your own
//!   MachineDeployments and policies. Ctrl-C or `ngo-sandbox down` stops it.
//! - `ngo-sandbox demo` starts it, scales a MachineDeployment up and down through
//!   cluster-autoscaler while showing what happens, and stops it.
//! - `ngo-sandbox bench` measures the operator side by side with its upstream peers
//!   (`make bench`) and writes target/bench/results.json.
//! - `ngo-sandbox scale` measures the operator's memory and CPU against the number of workload
//!   clusters and relay streams it serves (`make scale`) and writes target/scale/results.json.

use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use ngo_sandbox::demo::{self, Output};
use ngo_sandbox::environment::{Sandbox, WORKER_TEMPLATE};
use ngo_sandbox::stack::AutoscaledCluster;
use ngo_testbed::cherry::{CherryEmulator, CherryOptions};
use serde::{Deserialize, Serialize};

/// The API token in examples/nodepool-cherry.yaml's Secret, which `up`'s emulator accepts.
const EXAMPLE_CHERRY_TOKEN: &str = "replace-with-your-cherry-servers-api-token";

#[derive(Parser, Debug)]
#[command(
    name = "ngo-sandbox",
    about = "Local sandbox for nodegroup-operator and cluster-autoscaler"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Start the sandbox with the operator and cluster-autoscaler and keep it running.
    Up {
        /// Namespace (and Cluster name) whose MachineDeployments are autoscaled.
        #[arg(long, default_value = "sandbox")]
        namespace: String,
    },
    /// Stop the sandbox that `up` started.
    Down,
    /// Soak the operator: many clients, mixed reads and writes, for a long time; writes
    /// target/soak/results.json and fails on any unexpected error or stranded mark.
    Soak {
        /// Minutes of load.
        #[arg(long, default_value_t = 10)]
        minutes: u64,
        /// Concurrent clients.
        #[arg(long, default_value_t = 16)]
        clients: usize,
        /// Node groups.
        #[arg(long, default_value_t = 4)]
        groups: usize,
        /// Probability of a fault on each of the operator's writes to Machines and
        /// MachineDeployments (through the fault proxy); 0 turns it off.
        #[arg(long, default_value_t = 0.0)]
        fault_rate: f64,
        /// Seed of the faults (random when unset; printed).
        #[arg(long)]
        fault_seed: Option<u64>,
    },
    /// Chaos with the real cluster-autoscaler deciding: workloads come and go while seeded
    /// outside actions happen (pauses, a stalled Cluster API, replicas raised by hand, a
    /// person's delete-machine, operator kills, CA restarts, faults on the operator's writes);
    /// every Machine deletion is judged by CA's own answers. Writes target/chaos/results.json
    /// and fails on any violation.
    Chaos {
        /// Minutes of actions.
        #[arg(long, default_value_t = 30)]
        minutes: u64,
        /// Seed of the actions and faults (random when unset; printed).
        #[arg(long)]
        seed: Option<u64>,
        /// Node groups.
        #[arg(long, default_value_t = 3)]
        groups: usize,
        /// Mean seconds between two actions.
        #[arg(long, default_value_t = 6)]
        action_interval_secs: u64,
        /// Probability of a fault on each of the operator's writes to Machines and
        /// MachineDeployments.
        #[arg(long, default_value_t = 0.02)]
        fault_rate: f64,
        /// Fail unless at least this many nodes were scaled down.
        #[arg(long, default_value_t = 0)]
        min_scale_downs: u64,
    },
    /// Benchmark the operator side by side with CA's example externalgrpc server and CA's
    /// in-tree clusterapi provider on fresh API servers; prints a table and writes the results.
    Bench {
        /// Tiny datasets and short windows: exercises every code path, measures nothing.
        #[arg(long)]
        smoke: bool,
        /// Where to write the results (default: target/bench/results.json).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Only cluster-autoscaler's loop on the main dataset at 0.25 ms each way, in the full
        /// run's rounds: its ratios, the relay's memory and what each CA patch gives, in about
        /// an hour.
        #[arg(long, conflicts_with = "smoke")]
        loop_goals: bool,
        /// Only our server, on one dataset of `<groups>x<nodes>` (e.g. 1000x10): read
        /// metrics, memory, propagation and the single-Machine change, then the same reads
        /// through a relay; no peers and no cluster-autoscaler; prints the raw figures (for
        /// work on the operator). With --smoke, the smoke run's short load.
        #[arg(long, value_name = "GROUPSxNODES")]
        ours_only: Option<String>,
    },
    /// Measure the management topology at scale: the operator's memory, CPU and Node change
    /// latency against 10, 100 and 1,000 workload clusters (stand-in API servers) and 1, 100
    /// and 1,000 relay streams; prints the tables and the goals, and writes the results.
    Scale {
        /// 10 clusters and 10 streams, short windows: exercises every code path, measures
        /// nothing.
        #[arg(long)]
        smoke: bool,
        /// Where to write the results (default: target/scale/results.json).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Workload cluster counts to run instead (e.g. `10,100`).
        #[arg(long, value_delimiter = ',')]
        clusters: Vec<usize>,
        /// Relay stream counts to step through instead (e.g. `1,100`; `0` for none).
        #[arg(long, value_delimiter = ',')]
        streams: Vec<usize>,
    },
    /// Run the demo: scale a MachineDeployment up and down through cluster-autoscaler.
    Demo {
        /// One line per change instead of a live table (the default when stdin or stdout is
        /// not a terminal).
        #[arg(long)]
        plain: bool,
        /// Scale a NodePool of servers on the Cherry Servers emulator instead of a Cluster
        /// API MachineDeployment.
        #[arg(long)]
        cherry: bool,
    },
}

/// What `up` leaves for `down` (and for users: the kubeconfig path).
#[derive(Serialize, Deserialize)]
struct UpState {
    pid: u32,
    kubeconfig: PathBuf,
    namespace: String,
}

fn state_file() -> PathBuf {
    ngo_testbed::workspace_root().join("target/sandbox/up.json")
}

fn main() -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,kube_client=off"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    // Child processes die with the thread that started them: everything is started from
    // this (main) thread, inside `block_on`, while the runtime's workers run the tasks.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let started = Instant::now();
    // The control plane is started outside the runtime (it drives its own probes).
    let start_sandbox = || {
        say(
            started,
            "starting etcd, kube-apiserver, controllers, the Cluster API manager and kwok ...",
        );
        let sandbox = Sandbox::start()?;
        say(
            started,
            &format!("sandbox up; logs in {}", sandbox.log_dir().display()),
        );
        anyhow::Ok(sandbox)
    };
    match cli.command {
        Command::Up { namespace } => {
            let sandbox = start_sandbox()?;
            runtime.block_on(up(sandbox, &namespace, started))
        }
        Command::Down => down(),
        Command::Soak {
            minutes,
            clients,
            groups,
            fault_rate,
            fault_seed,
        } => {
            let sandbox = start_sandbox()?;
            let options = ngo_sandbox::soak::SoakOptions {
                duration: Duration::from_secs(minutes * 60),
                clients,
                groups,
                faults: (fault_rate > 0.0)
                    .then(|| (fault_seed.unwrap_or_else(rand::random), fault_rate)),
            };
            runtime.block_on(soak(sandbox, &options))
        }
        Command::Chaos {
            minutes,
            seed,
            groups,
            action_interval_secs,
            fault_rate,
            min_scale_downs,
        } => {
            let sandbox = start_sandbox()?;
            let options = ngo_sandbox::chaos::ChaosOptions {
                duration: Duration::from_secs(minutes * 60),
                seed: seed.unwrap_or_else(rand::random),
                groups,
                action_interval: Duration::from_secs(action_interval_secs),
                fault_rate,
            };
            runtime.block_on(chaos(sandbox, &options, min_scale_downs))
        }
        Command::Bench {
            smoke,
            out,
            ours_only: Some(shape),
            ..
        } => {
            let out = out.unwrap_or_else(|| {
                ngo_testbed::workspace_root().join("target/bench/ours-only.json")
            });
            let options = if smoke {
                ngo_sandbox::bench::BenchOptions::smoke()
            } else {
                ngo_sandbox::bench::BenchOptions::full()
            };
            bench_ours(&runtime, &shape, &options, &out, started)
        }
        Command::Bench {
            smoke,
            out,
            loop_goals,
            ours_only: None,
        } => {
            let out = out
                .unwrap_or_else(|| ngo_testbed::workspace_root().join("target/bench/results.json"));
            let options = if smoke {
                ngo_sandbox::bench::BenchOptions::smoke()
            } else if loop_goals {
                ngo_sandbox::bench::BenchOptions::loop_goals()
            } else {
                ngo_sandbox::bench::BenchOptions::full()
            };
            bench(&runtime, options, &out, started)
        }
        Command::Scale {
            smoke,
            out,
            clusters,
            streams,
        } => {
            let out = out
                .unwrap_or_else(|| ngo_testbed::workspace_root().join("target/scale/results.json"));
            let mut options = if smoke {
                ngo_sandbox::scale::ScaleOptions::smoke()
            } else {
                ngo_sandbox::scale::ScaleOptions::full()
            };
            if !clusters.is_empty() {
                options.clusters = clusters;
            }
            if !streams.is_empty() {
                options.streams = streams.into_iter().filter(|&s| s > 0).collect();
            }
            scale(&runtime, &options, &out, started)
        }
        Command::Demo { plain, cherry } => {
            let interactive = std::io::stdin().is_terminal() && std::io::stdout().is_terminal();
            let output = if plain || !interactive {
                Output::Plain
            } else {
                Output::Live
            };
            let sandbox = start_sandbox()?;
            let kind = if cherry {
                demo::DemoGroup::CherryNodePool
            } else {
                demo::DemoGroup::MachineDeployment
            };
            runtime.block_on(run_demo(sandbox, output, started, kind))
        }
    }
}

/// Prints a progress line; a closed stdout (a reader that went away) must not stop the
/// teardown that usually follows.
fn say(started: Instant, line: &str) {
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stdout(),
        "[{:>6.1}s] {line}",
        started.elapsed().as_secs_f64()
    );
}

async fn up(sandbox: Sandbox, namespace: &str, started: Instant) -> anyhow::Result<()> {
    let say = |line: &str| say(started, line);
    let mut cluster =
        AutoscaledCluster::create(&sandbox.info(), namespace, namespace, serde_json::json!({}))
            .await?;
    let operator = cluster.operator_options();
    cluster.start_operator(&operator)?;
    let autoscaler = cluster.externalgrpc_autoscaler()?;
    cluster.start_autoscaler(&autoscaler)?;
    // Stands in for the Cherry Servers API: it accepts the token of
    // examples/nodepool-cherry.yaml, so that example applies with only its endpoint changed.
    let cherry = CherryEmulator::start(CherryOptions {
        cluster: Some(cluster.client().await?),
        token: EXAMPLE_CHERRY_TOKEN.into(),
        ..Default::default()
    })
    .await?;
    let state = UpState {
        pid: std::process::id(),
        kubeconfig: sandbox.kubeconfig().to_path_buf(),
        namespace: namespace.into(),
    };
    let path = state_file();
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(&path, serde_json::to_vec_pretty(&state)?)
        .with_context(|| format!("writing {}", path.display()))?;
    let kubectl = ngo_testbed::upstream_bin("kubectl");
    say("sandbox up: nodegroup-operator and cluster-autoscaler (externalgrpc, mTLS) are running");
    let examples = ngo_testbed::workspace_root().join("examples");
    println!(
        "\n  export KUBECONFIG={kubeconfig}\n  alias kubectl={kubectl}\n\n\
         Cluster {namespace}/{namespace} is ready for MachineDeployments that use the \
         TestMachineTemplate '{WORKER_TEMPLATE}' (4 CPU, 16Gi kwok nodes). Autoscale one: a \
         group of 1 to 5 nodes, then pods that need 4:\n\n  \
         kubectl apply -f {md}\n  \
         kubectl apply -f {pods}\n  \
         kubectl -n {namespace} get cluster,machinedeployments,machines,ngp\n  \
         kubectl get nodes\n\n\
         A NodePool of Cherry Servers (an emulator at {cherry} stands in for the API):\n\n  \
         kubectl apply -f {nodepool}\n  \
         kubectl -n {namespace} patch nodepools.autoscaling.nodegroup.dev cherry-workers --type merge -p '{{\"spec\":{{\"cherryServers\":{{\"endpoint\":\"{cherry}\"}}}}}}'\n  \
         kubectl -n {namespace} get nodepools.autoscaling.nodegroup.dev -o wide\n\n\
         Logs: {logs}\nStop with Ctrl-C or `ngo-sandbox down`.",
        kubeconfig = state.kubeconfig.display(),
        kubectl = kubectl.display(),
        md = examples.join("machinedeployment.yaml").display(),
        pods = examples.join("pending-pods.yaml").display(),
        nodepool = examples.join("nodepool-cherry.yaml").display(),
        cherry = cherry.url(),
        logs = sandbox.log_dir().display(),
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut watch = tokio::time::interval(Duration::from_secs(2));
    let outcome = loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break Ok(()),
            _ = term.recv() => break Ok(()),
            _ = watch.tick() => {
                if let Err(error) = cluster.check_alive() {
                    break Err(anyhow::Error::new(error).context("a sandbox process exited"));
                }
            }
        }
    };
    say("stopping the sandbox ...");
    drop(cherry);
    drop(cluster);
    drop(sandbox);
    let _ = std::fs::remove_file(&path);
    say("stopped");
    outcome
}

fn down() -> anyhow::Result<()> {
    let path = state_file();
    let text = match std::fs::read(&path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            println!("no sandbox is running (no {})", path.display());
            return Ok(());
        }
        Err(error) => return Err(error).with_context(|| format!("reading {}", path.display())),
    };
    let state: UpState =
        serde_json::from_slice(&text).with_context(|| format!("parsing {}", path.display()))?;
    let pid = state.pid as libc::pid_t;
    // SAFETY: kill(2) with a pid read from our own state file.
    if unsafe { libc::kill(pid, libc::SIGTERM) } != 0 {
        println!("sandbox process {pid} is not running any more");
        let _ = std::fs::remove_file(&path);
        return Ok(());
    }
    let start = Instant::now();
    // `up` removes its state file once everything is stopped (a process that has exited
    // but was not yet reaped by its parent still answers signal 0).
    // SAFETY: signal 0 only checks that the process exists.
    while path.exists() && unsafe { libc::kill(pid, 0) } == 0 {
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(60),
            "sandbox process {pid} did not stop within 60s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    println!("sandbox stopped");
    Ok(())
}

async fn chaos(
    sandbox: Sandbox,
    options: &ngo_sandbox::chaos::ChaosOptions,
    min_scale_downs: u64,
) -> anyhow::Result<()> {
    let binary = ngo_sandbox::operator::operator_binary();
    let results = ngo_sandbox::chaos::run(&sandbox.info(), &binary, options).await?;
    let path = ngo_sandbox::chaos::write_results(&results)?;
    println!(
        "chaos: seed {}, {:.0}s, {} scale-downs ({} DeleteNodes OK, {} errors), {} removals (Machines, NodePool Nodes), \
         actions {:?}, faults {:?}, {} violations, {} residue, {} by a person, {} by a rollout; \
         results in {}",
        results.seed,
        results.duration_s,
        results.scale_downs,
        results.delete_nodes_ok,
        results.delete_nodes_errors,
        results.removals,
        results.actions,
        results.faults_injected,
        results.violations.len(),
        results.residue.len(),
        results.by_person.len(),
        results.by_rollout.len(),
        path.display()
    );
    for line in results.violations.iter().chain(&results.residue) {
        println!("  {line}");
    }
    anyhow::ensure!(
        results.violations.is_empty(),
        "{} U1 violation(s)",
        results.violations.len()
    );
    anyhow::ensure!(
        results.scale_downs >= min_scale_downs,
        "only {} scale-downs (at least {min_scale_downs} wanted)",
        results.scale_downs
    );
    Ok(())
}

async fn soak(sandbox: Sandbox, options: &ngo_sandbox::soak::SoakOptions) -> anyhow::Result<()> {
    let results = ngo_sandbox::soak::run(&sandbox.info(), options).await?;
    let path = ngo_testbed::workspace_root().join("target/soak/results.json");
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(&path, serde_json::to_vec_pretty(&results)?)
        .with_context(|| format!("writing {}", path.display()))?;
    println!("soak: {}; results in {}", results.summary(), path.display());
    let failures = results.failures();
    anyhow::ensure!(
        failures.is_empty(),
        "the soak failed (fault seed {:?}): {failures:#?}",
        results.fault_seed
    );
    Ok(())
}

fn bench(
    runtime: &tokio::runtime::Runtime,
    options: ngo_sandbox::bench::BenchOptions,
    out: &std::path::Path,
    started: Instant,
) -> anyhow::Result<()> {
    use ngo_sandbox::bench::{self, report::MachineInfo, summary};
    let machine = MachineInfo::read();
    say(started, &format!("benchmark on {}", machine.line()));
    let runs = bench::run(runtime, &options, &|line| say(started, line))?;
    let results = summary::summarise(runs, options, machine, started.elapsed().as_secs_f64());
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(out, serde_json::to_vec_pretty(&results)?)
        .with_context(|| format!("writing {}", out.display()))?;
    println!("\n{}", summary::render(&results));
    let shown = std::fs::canonicalize(out).unwrap_or_else(|_| out.to_path_buf());
    println!("results: {}", shown.display());
    Ok(())
}

fn bench_ours(
    runtime: &tokio::runtime::Runtime,
    shape: &str,
    options: &ngo_sandbox::bench::BenchOptions,
    out: &std::path::Path,
    started: Instant,
) -> anyhow::Result<()> {
    use ngo_sandbox::bench::{self, dataset::DatasetSpec, report::MachineInfo};
    let (groups, nodes) = shape
        .split_once('x')
        .and_then(|(g, n)| Some((g.parse().ok()?, n.parse().ok()?)))
        .with_context(|| {
            format!("--ours-only wants <groups>x<nodes>, e.g. 1000x10, not {shape:?}")
        })?;
    let machine = MachineInfo::read();
    say(
        started,
        &format!("benchmark (ours only) on {}", machine.line()),
    );
    let run = bench::run_ours(
        runtime,
        DatasetSpec::single(groups, nodes),
        options,
        &|line| say(started, line),
    )?;
    let figures = serde_json::to_string_pretty(&run)?;
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(out, &figures).with_context(|| format!("writing {}", out.display()))?;
    println!("{figures}");
    Ok(())
}

fn scale(
    runtime: &tokio::runtime::Runtime,
    options: &ngo_sandbox::scale::ScaleOptions,
    out: &std::path::Path,
    started: Instant,
) -> anyhow::Result<()> {
    use ngo_sandbox::scale::{self, procfs, report};
    raise_open_files_limit();
    say(
        started,
        &format!("scale measurement on {}", procfs::Machine::read().line()),
    );
    let results = scale::run(runtime, options, &|line| say(started, line))?;
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(out, serde_json::to_vec_pretty(&results)?)
        .with_context(|| format!("writing {}", out.display()))?;
    println!("\n{}", report::render(&results));
    let shown = std::fs::canonicalize(out).unwrap_or_else(|_| out.to_path_buf());
    println!("results: {}", shown.display());
    Ok(())
}

/// Raises this process's limit of open files to its hard limit, for it and the operator it
/// starts: 1,000 workload clusters take about 3,000 sockets on each side (a listener per
/// stand-in, the operator's watch and probe connections, the relay streams).
fn raise_open_files_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write the struct passed, nothing else.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                tracing::warn!("could not raise the open files limit");
            }
        }
    }
}

async fn run_demo(
    sandbox: Sandbox,
    output: Output,
    started: Instant,
    kind: demo::DemoGroup,
) -> anyhow::Result<()> {
    let mut cluster = demo::start(&sandbox, started).await?;
    let outcome = tokio::select! {
        result = demo::run(&mut cluster, output, started, kind) => Some(result),
        _ = tokio::signal::ctrl_c() => None,
    };
    let logs = sandbox.log_dir().to_path_buf();
    let result = match outcome {
        None => {
            println!("\ninterrupted; stopping the sandbox");
            Ok(())
        }
        Some(Ok(report)) => {
            println!(
                "\ndemo finished in {:.0}s: scale-up decided in {:.1}s (pods running after {:.1}s), \
                 scale-down decided in {:.1}s (nodes gone after {:.1}s)",
                started.elapsed().as_secs_f64(),
                report.scale_up_decision.as_secs_f64(),
                report.scale_up_done.as_secs_f64(),
                report.scale_down_decision.as_secs_f64(),
                report.scale_down_done.as_secs_f64()
            );
            Ok(())
        }
        Some(Err(error)) => {
            // Keep the logs: the sandbox directory goes away with the sandbox.
            let kept = std::env::temp_dir().join(format!("ngo-demo-logs-{}", std::process::id()));
            let copied = copy_dir(&logs, &kept).is_ok();
            if copied {
                eprintln!("demo failed; process logs copied to {}", kept.display());
            }
            Err(error)
        }
    };
    drop(cluster);
    drop(sandbox);
    result
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        std::fs::copy(entry.path(), to.join(entry.file_name()))?;
    }
    Ok(())
}
