//! mTLS on the gRPC endpoint: client certificates are required, must chain to the configured
//! CA and be within their validity; rotated files take effect without a restart.

use std::time::Duration;

use crate::support::*;
use ngo_service::proto::{self, cloud_provider_client::CloudProviderClient};
use ngo_service::server::tls::{HandshakeLimits, Listener, ReloadingTls, TlsFiles, incoming_with};
use ngo_testbed::pki::{CertificateAuthority, IssuedCert};
use nodegroup_operator::runtime::Running;
use rustls::pki_types::pem::PemObject as _;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
use x509_parser::prelude::{FromDer as _, X509Certificate};

async fn call(
    address: std::net::SocketAddr,
    server_ca: &str,
    identity: Option<&IssuedCert>,
) -> Result<usize, String> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(server_ca))
        .domain_name("localhost");
    if let Some(id) = identity {
        tls = tls.identity(Identity::from_pem(&id.cert_pem, &id.key_pem));
    }
    let channel = Channel::from_shared(format!("https://{address}"))
        .unwrap()
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(3))
        .connect()
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    let mut client = CloudProviderClient::new(channel);
    let groups = client
        .node_groups(proto::NodeGroupsRequest {})
        .await
        .map_err(|e| format!("rpc: {e}"))?;
    Ok(groups.into_inner().node_groups.len())
}

fn write_set(
    dir: &std::path::Path,
    server: &IssuedCert,
    client_ca: &CertificateAuthority,
) -> TlsFiles {
    let (cert, key) = server.write(dir, "server").unwrap();
    let client_ca_path = dir.join("client-ca.crt");
    client_ca.write_cert(&client_ca_path).unwrap();
    TlsFiles {
        cert,
        key,
        client_ca: client_ca_path,
    }
}

/// Unix seconds at the start of a UTC day.
fn day(year: i16, month: i8, day: i8) -> i64 {
    jiff::civil::date(year, month, day)
        .to_zoned(jiff::tz::TimeZone::UTC)
        .expect("a day")
        .timestamp()
        .as_second()
}

/// The expiry gauges expected with a serving certificate valid until `serving` and a client
/// CA of rcgen's default validity (until 4096-01-01).
fn expiries(serving: i64) -> Vec<(String, i64)> {
    vec![
        ("client-ca".to_string(), day(4096, 1, 1)),
        ("serving".to_string(), serving),
    ]
}

/// `(certificate, expiry)` of the operator's certificate expiry gauges, sorted.
async fn certificate_expiries(operator: &Running) -> Vec<(String, i64)> {
    let (_, text) = http_get(operator.admin_address, "/metrics").await;
    let mut found: Vec<(String, i64)> = text
        .lines()
        .filter_map(|l| {
            l.strip_prefix("nodegroup_tls_certificate_expiry_timestamp_seconds{certificate=\"")
        })
        .filter_map(|l| {
            let (certificate, value) = l.split_once("\"} ")?;
            Some((certificate.to_string(), value.trim().parse().ok()?))
        })
        .collect();
    found.sort();
    found
}

#[tokio::test]
async fn client_certificates_are_required_and_rotation_needs_no_restart() {
    let ns = TestNs::new("mtls").await;
    ns.machine_deployment("md", 1, bounds(0, 3)).await;
    let dir = tempfile::tempdir().unwrap();
    let ca = CertificateAuthority::new("ngo-test-ca").unwrap();
    let server = ca
        .issue_until(
            "nodegroup-operator",
            &["127.0.0.1", "localhost"],
            (2031, 6, 1),
        )
        .unwrap();
    let client = ca.issue("cluster-autoscaler", &[], None).unwrap();
    let files = write_set(dir.path(), &server, &ca);
    let (operator, _) = ns
        .operator_with(shared().operator_kubeconfig.clone(), Some(files))
        .await;
    let address = operator.grpc_address.expect("a TCP listener");

    let served = eventually("mTLS call succeeds", Duration::from_secs(20), || {
        let (ca, client) = (ca.cert_pem.clone(), client.clone());
        async move {
            call(address, &ca, Some(&client))
                .await
                .ok()
                .filter(|n| *n == 1)
        }
    })
    .await;
    assert_eq!(served, 1);
    // When the certificates in use expire: the serving one's notAfter, and the client CA's
    // (rcgen's default, 4096-01-01).
    assert_eq!(
        certificate_expiries(&operator).await,
        expiries(day(2031, 6, 1))
    );
    let anonymous = call(address, &ca.cert_pem, None).await;
    assert!(
        anonymous.is_err(),
        "a client without certificate must be refused: {anonymous:?}"
    );
    let rogue_ca = CertificateAuthority::new("rogue").unwrap();
    let rogue = rogue_ca.issue("cluster-autoscaler", &[], None).unwrap();
    let refused = call(address, &ca.cert_pem, Some(&rogue)).await;
    assert!(
        refused.is_err(),
        "a certificate from another CA must be refused: {refused:?}"
    );

    // The CA renewed over its own key, as the chart's CA is (rotationPolicy Never): the client
    // certificate cluster-autoscaler already holds still chains to it, so no restart is needed.
    let renewed = ca.renewed((2036, 1, 1)).unwrap();
    write_set(dir.path(), &server, &renewed);
    eventually(
        "the renewed CA is in use",
        Duration::from_secs(10),
        || async {
            Some(certificate_expiries(&operator).await).filter(|found| {
                *found
                    == [
                        ("client-ca".to_string(), day(2036, 1, 1)),
                        ("serving".to_string(), day(2031, 6, 1)),
                    ]
            })
        },
    )
    .await;
    assert_eq!(
        call(address, &renewed.cert_pem, Some(&client)).await,
        Ok(1),
        "a client certificate of the CA before its renewal is accepted"
    );

    // Rotate everything: new server certificate and a new client CA.
    let new_ca = CertificateAuthority::new("ngo-test-ca-2").unwrap();
    let new_server = new_ca
        .issue_until(
            "nodegroup-operator",
            &["127.0.0.1", "localhost"],
            (2032, 6, 1),
        )
        .unwrap();
    let new_client = new_ca.issue("cluster-autoscaler", &[], None).unwrap();
    write_set(dir.path(), &new_server, &new_ca);
    eventually(
        "the rotated certificates are served",
        Duration::from_secs(10),
        || {
            let (ca, client) = (new_ca.cert_pem.clone(), new_client.clone());
            async move { call(address, &ca, Some(&client)).await.ok() }
        },
    )
    .await;
    let old = call(address, &ca.cert_pem, Some(&client)).await;
    assert!(
        old.is_err(),
        "the old client CA is no longer trusted: {old:?}"
    );
    eventually(
        "the expiry follows the rotated files",
        Duration::from_secs(5),
        || async {
            Some(certificate_expiries(&operator).await)
                .filter(|found| *found == expiries(day(2032, 6, 1)))
        },
    )
    .await;

    // A broken file set is refused and the current certificates stay.
    std::fs::write(dir.path().join("server.crt"), "not a certificate").unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        call(address, &new_ca.cert_pem, Some(&new_client)).await,
        Ok(1)
    );
    operator.shutdown().await.unwrap();
}

#[tokio::test]
async fn expired_and_foreign_client_certificates_are_refused() {
    let ns = TestNs::new("mtls-expired").await;
    ns.machine_deployment("md", 1, bounds(0, 3)).await;
    let dir = tempfile::tempdir().unwrap();
    let ca = CertificateAuthority::new("ngo-test-ca").unwrap();
    let server = ca
        .issue("nodegroup-operator", &["127.0.0.1", "localhost"], None)
        .unwrap();
    let files = write_set(dir.path(), &server, &ca);
    let (operator, _) = ns
        .operator_with(shared().operator_kubeconfig.clone(), Some(files))
        .await;
    let address = operator.grpc_address.expect("a TCP listener");
    let valid = ca.issue("cluster-autoscaler", &[], None).unwrap();
    eventually("mTLS call succeeds", Duration::from_secs(20), || {
        let (ca, valid) = (ca.cert_pem.clone(), valid.clone());
        async move { call(address, &ca, Some(&valid)).await.ok() }
    })
    .await;

    let expired = ca.issue_expired("cluster-autoscaler", &[], None).unwrap();
    let refused = call(address, &ca.cert_pem, Some(&expired)).await;
    assert!(
        refused.is_err(),
        "an expired client certificate must be refused: {refused:?}"
    );
    let foreign = CertificateAuthority::new("rogue")
        .unwrap()
        .issue("cluster-autoscaler", &[], None)
        .unwrap();
    let refused = call(address, &ca.cert_pem, Some(&foreign)).await;
    assert!(
        refused.is_err(),
        "a certificate signed by another CA must be refused: {refused:?}"
    );
    // Refusals do not disturb the listener.
    assert_eq!(call(address, &ca.cert_pem, Some(&valid)).await, Ok(1));
    // They are counted, and the accepted client's certificate expiry is exported: CA reads
    // its certificate once, so that is where its expiry shows.
    let (_, metrics) = http_get(operator.admin_address, "/metrics").await;
    let rejected = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix("nodegroup_grpc_tls_handshake_failures_total{reason=\"rejected\"} ")
        })
        .and_then(|v| v.trim().parse::<u64>().ok());
    assert!(
        rejected.is_some_and(|n| n >= 2),
        "two refused handshakes counted: {rejected:?}"
    );
    let valid_until = X509Certificate::from_der(
        &rustls::pki_types::CertificateDer::pem_slice_iter(valid.cert_pem.as_bytes())
            .next()
            .unwrap()
            .unwrap(),
    )
    .unwrap()
    .1
    .validity()
    .not_after
    .timestamp();
    assert!(
        metrics.contains(&format!(
            "nodegroup_grpc_client_certificate_expiry_timestamp_seconds{{client=\"cluster-autoscaler\"}} {valid_until}"
        )),
        "the client's certificate expiry: {}",
        metrics
            .lines()
            .filter(|l| l.contains("client_certificate"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    operator.shutdown().await.unwrap();
}

#[tokio::test]
async fn unusable_tls_files_stop_start_up_with_a_clear_error() {
    let ns = TestNs::new("mtls-bad").await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("missing.crt");
    let files = TlsFiles {
        cert: path.clone(),
        key: path.clone(),
        client_ca: path,
    };
    let config = operator_config(&ns.name, Some(files));
    let error = match nodegroup_operator::runtime::start(config).await {
        Ok(_) => panic!("start must fail"),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        error.contains("server certificate") && error.contains("missing.crt"),
        "{error}"
    );
}

/// A TLS endpoint on the accept loop alone (no operator): its address, the stream of
/// established connections, and what a client needs.
struct Endpoint {
    address: std::net::SocketAddr,
    established: tokio_stream::wrappers::ReceiverStream<
        Result<tokio_rustls::server::TlsStream<tokio::net::TcpStream>, std::io::Error>,
    >,
    ca: CertificateAuthority,
    client: IssuedCert,
    dir: tempfile::TempDir,
    shutdown: tokio_util::sync::CancellationToken,
}

async fn endpoint(limits: HandshakeLimits) -> Endpoint {
    let dir = tempfile::tempdir().unwrap();
    let ca = CertificateAuthority::new("ngo-accept-ca").unwrap();
    let server = ca
        .issue("nodegroup-operator", &["127.0.0.1", "localhost"], None)
        .unwrap();
    let client = ca.issue("cluster-autoscaler", &[], None).unwrap();
    let tls = ReloadingTls::load(write_set(dir.path(), &server, &ca)).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let established = incoming_with(listener, tls, limits, shutdown.clone());
    Endpoint {
        address,
        established,
        ca,
        client,
        dir,
        shutdown,
    }
}

/// Completes a TLS handshake with a client certificate.
async fn handshake(e: &Endpoint) -> std::io::Result<()> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(e.ca.cert_pem.as_bytes()).unwrap())
        .unwrap();
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_client_auth_cert(
        vec![CertificateDer::from_pem_slice(e.client.cert_pem.as_bytes()).unwrap()],
        PrivateKeyDer::from_pem_slice(e.client.key_pem.as_bytes()).unwrap(),
    )
    .unwrap();
    let stream = tokio::net::TcpStream::connect(e.address).await?;
    let mut tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), stream)
        .await?;
    // TLS 1.3 verifies the client certificate after the client's handshake ends: read the
    // server's reply (none comes; a refusal shows as an error or EOF before the timeout).
    let mut buf = [0u8; 1];
    match tokio::time::timeout(
        Duration::from_millis(300),
        tokio::io::AsyncReadExt::read(&mut tls, &mut buf),
    )
    .await
    {
        Err(_) => Ok(()),
        Ok(Ok(0)) => Err(std::io::Error::other("closed by the server")),
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e),
    }
}

#[tokio::test]
async fn idle_connections_that_never_send_a_client_hello_do_not_keep_a_real_client_out() {
    use futures::StreamExt;
    use tokio::io::AsyncReadExt;
    let mut e = endpoint(HandshakeLimits {
        max_pending: 8,
        timeout: Duration::from_secs(60),
    })
    .await;
    let mut idle = Vec::new();
    for _ in 0..40 {
        idle.push(tokio::net::TcpStream::connect(e.address).await.unwrap());
    }
    // A real client gets through at once although the bound is full of idle connections.
    let start = std::time::Instant::now();
    handshake(&e).await.expect("real client handshake");
    let stream = tokio::time::timeout(Duration::from_secs(5), e.established.next())
        .await
        .expect("the real client's connection is established")
        .expect("stream open");
    assert!(stream.is_ok());
    assert!(start.elapsed() < Duration::from_secs(5));
    // The bound holds: all but the newest 8 handshakes were abandoned long before the
    // 60-second timeout, so their connections are closed.
    let mut closed = 0;
    for conn in &mut idle {
        let mut buf = [0u8; 1];
        if let Ok(Ok(0) | Err(_)) =
            tokio::time::timeout(Duration::from_millis(200), conn.read(&mut buf)).await
        {
            closed += 1;
        }
    }
    assert!(
        closed >= 40 - 8,
        "only {closed} of 40 idle connections closed"
    );
    e.shutdown.cancel();
}

/// A listener whose `accept()` always fails as it does when the process is out of file
/// descriptors, counting the attempts.
struct Exhausted(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl Listener for Exhausted {
    type Io = tokio::net::TcpStream;

    async fn accept(&mut self) -> std::io::Result<(tokio::net::TcpStream, std::net::SocketAddr)> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Err(std::io::Error::from_raw_os_error(libc::EMFILE))
    }
}

#[tokio::test]
async fn failing_accepts_back_off_instead_of_spinning() {
    let e = endpoint(HandshakeLimits::default()).await;
    let attempts = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let tls = ReloadingTls::load(write_set(
        e.dir.path(),
        &e.ca
            .issue("nodegroup-operator", &["localhost"], None)
            .unwrap(),
        &e.ca,
    ))
    .unwrap();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let _stream = incoming_with(
        Exhausted(attempts.clone()),
        tls,
        HandshakeLimits::default(),
        shutdown.clone(),
    );
    tokio::time::sleep(Duration::from_millis(700)).await;
    let n = attempts.load(std::sync::atomic::Ordering::Relaxed);
    // 5 + 10 + 20 + ... ms: about 8 attempts in 700 ms; a loop without a pause makes millions.
    assert!((2..=15).contains(&n), "{n} accept attempts in 700 ms");
    shutdown.cancel();
    e.shutdown.cancel();
}

/// `nodegroup-operator probe` (the chart's `helm test`): its answer and exit code. Async: the
/// operator under test runs on this test's runtime.
async fn probe(args: &[&str]) -> (bool, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_nodegroup-operator"))
        .arg("probe")
        .args(args)
        .output()
        .await
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[tokio::test]
async fn the_probe_lists_groups_as_cluster_autoscaler_would_and_says_why_it_cannot() {
    let ns = TestNs::new("probe").await;
    ns.machine_deployment("md", 1, bounds(0, 3)).await;
    let dir = tempfile::tempdir().unwrap();
    let ca = CertificateAuthority::new("ngo-test-ca").unwrap();
    let server = ca
        .issue("nodegroup-operator", &["127.0.0.1", "localhost"], None)
        .unwrap();
    let files = write_set(dir.path(), &server, &ca);
    let (operator, _) = ns
        .operator_with(shared().operator_kubeconfig.clone(), Some(files))
        .await;
    let port = operator.grpc_address.expect("a TCP listener").port();
    let (cert, key) = ca
        .issue_client("cluster-autoscaler", &[])
        .unwrap()
        .write(dir.path(), "client")
        .unwrap();
    let cacert = dir.path().join("ca.crt");
    ca.write_cert(&cacert).unwrap();
    let cloud_config = dir.path().join("cloud-config");
    std::fs::write(
        &cloud_config,
        format!(
            "address: localhost:{port}\ncert: {}\nkey: {}\ncacert: {}\ngrpc_timeout: 5s\n",
            cert.display(),
            key.display(),
            cacert.display()
        ),
    )
    .unwrap();
    let cloud_config = cloud_config.to_str().unwrap();
    let id = format!("MachineDeployment/{}/md", ns.name);
    let listed = eventually("the probe lists the group", Duration::from_secs(20), || {
        let id = id.clone();
        async move {
            let (ok, out) = probe(&["--cloud-config", cloud_config]).await;
            (ok && out.contains(&id)).then_some(out)
        }
    })
    .await;
    assert_eq!(
        listed,
        format!(
            "NodeGroups on localhost:{port} (mTLS): 1 node group(s)\n  MachineDeployment/{}/md min=0 max=3\n",
            ns.name
        )
    );

    // A CA that did not sign the serving certificate: the handshake fails, named as such.
    let foreign = CertificateAuthority::new("foreign").unwrap();
    let foreign_ca = dir.path().join("foreign.crt");
    foreign.write_cert(&foreign_ca).unwrap();
    let (ok, out) = probe(&[
        "--address",
        &format!("localhost:{port}"),
        "--cert",
        cert.to_str().unwrap(),
        "--key",
        key.to_str().unwrap(),
        "--cacert",
        foreign_ca.to_str().unwrap(),
    ])
    .await;
    assert!(!ok);
    assert!(
        out.contains(&format!("connecting to localhost:{port}")),
        "{out}"
    );
    // Without `cert` the probe speaks plaintext, as cluster-autoscaler does; the mTLS port
    // refuses it.
    let (ok, out) = probe(&[
        "--address",
        &format!("localhost:{port}"),
        "--grpc-timeout",
        "2s",
    ])
    .await;
    assert!(!ok, "{out}");
    assert!(out.contains(&format!("localhost:{port}")), "{out}");
    let (ok, out) = probe(&["--cloud-config", "/nonexistent/cloud-config"]).await;
    assert!(!ok);
    assert!(out.contains("reading /nonexistent/cloud-config"), "{out}");
    operator.shutdown().await.unwrap();
}
