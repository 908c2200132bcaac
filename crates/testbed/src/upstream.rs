//! Where the workspace and the upstream binaries it builds are.

use std::path::PathBuf;

/// The root of the nodegroup-operator workspace this crate was built from.
pub fn workspace_root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// Where the upstream binaries are: `$NGO_UPSTREAM_DIR`, else `target/upstream` of the
/// workspace.
pub fn upstream_dir() -> PathBuf {
    std::env::var_os("NGO_UPSTREAM_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target/upstream"))
}

/// Path of an upstream binary.
pub fn upstream_bin(name: &str) -> PathBuf {
    upstream_dir().join("bin").join(name)
}

/// Path of the upstream check program `name` (a Go program driving an emulator with a cloud's
/// official client), or the build to run when `tests/upstream/build.sh <component>` has not
/// built it.
pub fn upstream_check(name: &str, component: &str) -> Result<PathBuf, String> {
    let bin = upstream_bin(name);
    if bin.exists() {
        Ok(bin)
    } else {
        Err(format!(
            "{} is missing: run tests/upstream/build.sh {component}",
            bin.display()
        ))
    }
}
