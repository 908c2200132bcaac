//! The id that ties one RPC's log lines together (its `rpc` span; at info for mutations,
//! debug for reads): the client's
//! `x-request-id` when it sends a usable one, otherwise one made here, unique within the
//! process and, with its random per-process prefix, across replicas.

use std::hash::{BuildHasher, Hasher};
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};

use tonic::Request;

/// The metadata key a client may set to choose the id.
pub const HEADER: &str = "x-request-id";
/// The longest client id used as it is.
const MAX_LEN: usize = 64;

static PREFIX: LazyLock<u32> = LazyLock::new(|| {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher.finish() as u32
});
static NEXT: AtomicU64 = AtomicU64::new(1);

/// The `x-request-id` of `request`, if it is 1 to 64 visible ASCII characters.
pub fn from_client<T>(request: &Request<T>) -> Option<String> {
    request
        .metadata()
        .get(HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|id| usable(id))
        .map(str::to_string)
}

/// The id to log a request under: the client's ([`from_client`]), otherwise
/// `<8 hex digits of this process>-<counter>`.
pub fn of(client: Option<&str>) -> String {
    client.map_or_else(made_here, str::to_string)
}

fn usable(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_LEN && id.bytes().all(|b| b.is_ascii_graphic())
}

fn made_here() -> String {
    format!("{:08x}-{}", *PREFIX, NEXT.fetch_add(1, Ordering::Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_header(value: &str) -> Request<()> {
        let mut request = Request::new(());
        request
            .metadata_mut()
            .insert(HEADER, value.parse().expect("ascii"));
        request
    }

    #[test]
    fn a_usable_client_id_is_kept_and_others_are_replaced_by_unique_ones() {
        let id = |request: &Request<()>| of(from_client(request).as_deref());
        assert_eq!(id(&with_header("ca-loop-7/abc")), "ca-loop-7/abc");
        let made: Vec<String> = [
            Request::new(()),
            with_header(""),
            with_header("has space"),
            with_header(&"x".repeat(65)),
        ]
        .iter()
        .map(id)
        .collect();
        let (prefix, _) = made[0].split_once('-').expect("<prefix>-<n>");
        assert_eq!(prefix.len(), 8);
        for id in &made {
            assert!(id.starts_with(&format!("{prefix}-")), "{id}");
        }
        let mut unique = made.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), made.len(), "{made:?}");
    }
}
