//! A local sandbox of upstream processes on loopback (etcd, kube-apiserver, ...), for tests,
//! `make demo` and benchmarks. Binaries come from `tests/upstream/build.sh`
//! (`target/upstream/bin`). Every process runs in a temp dir, on free loopback ports, and dies
//! with its parent.

pub mod capi;
pub mod controlplane;
pub mod infra_provider;
pub mod kwok;
pub mod pki;
pub mod process;

use std::path::PathBuf;

pub use controlplane::{ControlPlane, ControlPlaneOptions};
pub use pki::{CertificateAuthority, IssuedCert};
pub use process::{ManagedProcess, free_port};

/// Where the upstream binaries are: `$NGO_UPSTREAM_DIR/bin`, else `target/upstream/bin` of
/// this checkout.
pub fn upstream_dir() -> PathBuf {
    std::env::var_os("NGO_UPSTREAM_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/upstream"))
}

/// Path of an upstream binary.
pub fn upstream_bin(name: &str) -> PathBuf {
    upstream_dir().join("bin").join(name)
}
