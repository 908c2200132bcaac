//! mTLS on the gRPC endpoint: client certificates are required, must chain to the configured
//! CA and be within their validity; rotated files take effect without a restart.

mod support;

use std::time::Duration;

use ngo_sandbox::pki::{CertificateAuthority, IssuedCert};
use nodegroup_operator::proto::{self, cloud_provider_client::CloudProviderClient};
use nodegroup_operator::server::tls::TlsFiles;
use support::*;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

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

#[tokio::test]
async fn client_certificates_are_required_and_rotation_needs_no_restart() {
    let ns = TestNs::new("mtls").await;
    ns.machine_deployment("md", 1, bounds(0, 3)).await;
    let dir = tempfile::tempdir().unwrap();
    let ca = CertificateAuthority::new("ngo-test-ca").unwrap();
    let server = ca
        .issue("nodegroup-operator", &["127.0.0.1", "localhost"], None)
        .unwrap();
    let client = ca.issue("cluster-autoscaler", &[], None).unwrap();
    let files = write_set(dir.path(), &server, &ca);
    let (operator, _) = ns
        .operator_with(shared().operator_kubeconfig.clone(), Some(files))
        .await;
    let address = operator.grpc_address;

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

    // Rotate everything: new server certificate and a new client CA.
    let new_ca = CertificateAuthority::new("ngo-test-ca-2").unwrap();
    let new_server = new_ca
        .issue("nodegroup-operator", &["127.0.0.1", "localhost"], None)
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
    let address = operator.grpc_address;
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
