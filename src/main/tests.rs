use super::*;

#[test]
fn log_levels_of_other_systems_mean_their_tracing_level() {
    assert_eq!(log_filter(""), "info");
    assert_eq!(log_filter("warning"), "warn");
    assert_eq!(log_filter("WARNING"), "warn");
    assert_eq!(
        log_filter("info,ngo_service=warning"),
        "info,ngo_service=warn"
    );
    assert_eq!(log_filter("fatal"), "error");
    assert_eq!(log_filter("debug,kube=info"), "debug,kube=info");
    // A bare `warning` read as tracing reads it names a module: nothing would be logged.
    let filter = tracing_subscriber::EnvFilter::try_new(log_filter("warning")).expect("filter");
    assert_eq!(
        filter.max_level_hint(),
        Some(tracing_subscriber::filter::LevelFilter::WARN)
    );
}

fn arch(value: &str) -> String {
    let cli = Cli::try_parse_from([
        "nodegroup-operator",
        "--insecure",
        "--scale-zero-default-arch",
        value,
    ])
    .expect("an unknown architecture does not stop the process");
    cli.run.config().unwrap().default_arch
}

#[test]
fn the_workload_read_limits_come_from_their_flags() {
    let limits = |extra: &[&str]| {
        let mut args = vec![
            "nodegroup-operator",
            "--insecure",
            "--workload-nodes=cluster-secrets",
            "--allow-unscoped-clients",
        ];
        args.extend_from_slice(extra);
        match Cli::try_parse_from(args).map(|cli| cli.run.config()) {
            Ok(Ok(config)) => match config.workload_nodes {
                WorkloadNodes::ClusterSecrets(limits) => Ok(limits),
                other => panic!("{other:?}"),
            },
            Ok(Err(error)) => Err(error.to_string()),
            Err(error) => Err(error.to_string()),
        }
    };
    assert_eq!(limits(&[]), Ok(ReadLimits::default()));
    assert_eq!(
        limits(&[
            "--workload-max-nodes=100",
            "--workload-max-list-pages=7",
            "--workload-max-node-mib=3",
            "--workload-list-deadline-secs=5",
            "--workload-max-response-mib=8",
            "--workload-max-watch-line-mib=2",
        ]),
        Ok(ReadLimits {
            response_bytes: 8 << 20,
            watch_line_bytes: 2 << 20,
            nodes: 100,
            list_pages: 7,
            node_bytes: 3 << 20,
            list_deadline: Duration::from_secs(5),
        })
    );
    for zero in [
        "--workload-max-nodes=0",
        "--workload-max-list-pages=0",
        "--workload-max-node-mib=0",
        "--workload-list-deadline-secs=0",
        "--workload-max-response-mib=0",
    ] {
        assert!(limits(&[zero]).is_err(), "{zero}");
    }
}

#[test]
fn a_management_cluster_without_client_identity_needs_an_explicit_opt_out() {
    let parse = |extra: &[&str]| {
        let mut args = vec!["nodegroup-operator", "--insecure"];
        args.extend_from_slice(extra);
        Cli::try_parse_from(args).expect("flags parse").run.config()
    };
    let Err(error) = parse(&["--workload-nodes=cluster-secrets"]) else {
        panic!("a management cluster without client identity is refused");
    };
    assert!(error.to_string().contains("--client-identity"), "{error}");
    assert!(
        parse(&[
            "--workload-nodes=cluster-secrets",
            "--allow-unscoped-clients"
        ])
        .is_ok()
    );
    assert!(parse(&["--workload-nodes=same-cluster"]).is_ok());
    assert!(
        parse(&["--workload-nodes=cluster-secrets", "--cluster=tenants/c1"]).is_ok(),
        "a sidecar scoped by --cluster serves one cluster"
    );
}

#[test]
fn the_co_located_mode_scopes_by_configuration_and_refuses_certificate_scoping() {
    let parse = |extra: &[&str]| {
        let mut args = vec!["nodegroup-operator", "--insecure"];
        args.extend_from_slice(extra);
        Cli::try_parse_from(args).expect("flags parse").run.config()
    };
    let config = parse(&[
        "--cluster=tenants/c1",
        "--grpc-unix-socket=/run/ngo/grpc.sock",
    ])
    .expect("co-located");
    assert_eq!(
        config.client_identity,
        IdentitySource::fixed("tenants/c1").expect("cluster")
    );
    assert_eq!(
        config.grpc_unix_socket.as_deref(),
        Some(std::path::Path::new("/run/ngo/grpc.sock"))
    );
    assert_eq!(
        config.grpc_address, None,
        "beside cluster-autoscaler, only the socket is served unless a TCP address is given"
    );
    let both = parse(&[
        "--cluster=tenants/c1",
        "--grpc-unix-socket=/run/ngo/grpc.sock",
        "--grpc-address=127.0.0.1:8086",
    ])
    .expect("co-located with TCP too");
    assert_eq!(both.grpc_address, Some(([127, 0, 0, 1], 8086).into()));
    assert_eq!(
        parse(&[]).expect("defaults").grpc_address,
        Some(([0, 0, 0, 0], 8086).into())
    );
    let error = parse(&["--cluster=tenants/c1", "--client-identity=uri-san"])
        .expect_err("two ways of scoping");
    assert!(error.to_string().contains("excludes"), "{error}");
    let error = parse(&["--grpc-unix-socket=/s", "--client-identity=common-name"])
        .expect_err("no certificate on a socket");
    assert!(error.to_string().contains("--cluster"), "{error}");
    let error = parse(&["--cluster=c1"]).expect_err("not namespace/name");
    assert!(error.to_string().contains("<namespace>/<name>"), "{error}");
    assert!(
        parse(&["--grpc-unix-socket=/s"]).is_ok(),
        "unscoped, one cluster"
    );
}

/// The values of `examples/<name>` (upstream cluster-autoscaler chart values) and its first
/// init container's args parsed as this binary's command line.
fn example_sidecar(name: &str) -> (serde_yaml::Value, Cli) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(name);
    let values: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(path).expect("the example")).unwrap();
    let args: Vec<String> = values["initContainers"][0]["args"]
        .as_sequence()
        .expect("the sidecar's args")
        .iter()
        .filter_map(|a| a.as_str().map(String::from))
        .collect();
    let cli = Cli::try_parse_from(std::iter::once("nodegroup-operator".to_string()).chain(args))
        .expect("flags parse");
    (values, cli)
}

/// The sidecar in `examples/cluster-autoscaler-colocated-values.yaml` runs with flags this
/// binary takes, in the co-located mode.
#[test]
fn the_co_located_example_runs_with_these_flags() {
    let (_, cli) = example_sidecar("cluster-autoscaler-colocated-values.yaml");
    let Some(Command::Run(run)) = cli.command else {
        panic!("the example runs `run`");
    };
    let config = run.config().expect("a valid configuration");
    assert!(config.grpc_unix_socket.is_some());
    assert!(matches!(config.client_identity, IdentitySource::Fixed(_)));
}

/// The sidecar in `examples/cluster-autoscaler-relay-values.yaml` runs `relay` with flags
/// this binary takes, and reads the cloud-config the example's ConfigMap holds.
#[test]
fn the_relay_example_runs_with_these_flags() {
    let (values, cli) = example_sidecar("cluster-autoscaler-relay-values.yaml");
    let Some(Command::Relay(relay)) = cli.command else {
        panic!("the example runs `relay`");
    };
    let config_text = values["extraObjects"][0]["data"]["relay-cloud-config"]
        .as_str()
        .expect("the relay's cloud-config");
    let directory = tempfile::tempdir().expect("tempdir");
    let config_path = directory.path().join("relay-cloud-config");
    std::fs::write(&config_path, config_text).expect("write");
    let relay = RelayArgs {
        operator_cloud_config: config_path,
        ..relay
    };
    let config = relay.config().expect("a valid configuration");
    assert_eq!(config.cluster.to_string(), "default/my-cluster");
    assert!(config.operator.cert.is_some(), "mTLS to the operator");
    assert_eq!(config.max_staleness, Duration::from_secs(10));
}

#[test]
fn a_relay_refuses_a_cluster_that_is_not_namespace_and_name_and_a_staleness_below_2s() {
    let relay = |extra: &[&str]| -> anyhow::Result<_> {
        let args = [
            "nodegroup-operator",
            "relay",
            "--operator-cloud-config=/none",
        ]
        .into_iter()
        .chain(extra.iter().copied());
        let Some(Command::Relay(relay)) = Cli::try_parse_from(args)?.command else {
            panic!("relay");
        };
        relay.config()
    };
    let error = relay(&["--cluster=c1"]).expect_err("not namespace/name");
    assert!(error.to_string().contains("<namespace>/<name>"), "{error}");
    let error = relay(&["--cluster=ns/c1", "--max-staleness=1s"]).expect_err("below keepalives");
    assert!(error.to_string().contains("at least 2s"), "{error}");
    let error = relay(&["--cluster=ns/c1"]).expect_err("no cloud-config");
    assert!(format!("{error:#}").contains("/none"), "{error:#}");
}

#[test]
fn an_unknown_default_architecture_falls_back_to_amd64_as_upstream() {
    assert_eq!(arch("x86_64"), "amd64");
    assert_eq!(arch("AMD64"), "amd64");
    assert_eq!(arch(""), "amd64");
    assert_eq!(arch("arm64"), "arm64");
    assert_eq!(arch("s390x"), "s390x");
}
