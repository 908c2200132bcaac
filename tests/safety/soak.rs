//! A short seeded round of `make soak`: many clients mixing reads and writes against the
//! operator binary, its writes faulted by the fault proxy, every DeleteNodes made as
//! cluster-autoscaler makes it and judged by the deletion auditor.

use std::time::Duration;

use ngo_sandbox::soak::{SoakOptions, run};

use crate::crash::sandbox;

/// Seconds of load (`NGO_SOAK_SECS`; `make soak` runs minutes).
fn seconds() -> u64 {
    std::env::var("NGO_SOAK_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(45)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_soak_with_faulted_writes_breaks_no_contract_and_deletes_only_what_ca_was_told() {
    let options = SoakOptions {
        duration: Duration::from_secs(seconds()),
        clients: 8,
        groups: 3,
        faults: Some((20261128, 0.05)),
    };
    let results = run(sandbox(), &options).await.expect("the soak ran");
    eprintln!("soak: {}", results.summary());
    for line in &results.u1_residue {
        eprintln!("soak: U1 residue: {line}");
    }
    let failures = results.failures();
    assert!(failures.is_empty(), "{failures:#?}");
    assert!(
        results.deleted > 0,
        "the soak deleted nothing, so it judged nothing: {}",
        results.summary()
    );
    assert!(
        !results.faults_injected.is_empty(),
        "no fault was injected: {}",
        results.summary()
    );
}
