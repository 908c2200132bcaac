//! Giving memory the process no longer uses back to the operating system.
//!
//! glibc's allocator keeps freed memory in its arenas for reuse and returns it only when the
//! top of the heap is free. A full index pass (start-up, a re-list) allocates the whole
//! state afresh while the previous one is still alive, and the initial list decodes every
//! object once; afterwards most of that memory is free but still resident. Trimming after
//! such a pass keeps the resident size close to what the caches and the index hold.
//!
//! glibc also gives threads their own arenas (up to eight per core), each keeping its own
//! free memory; the operator's threads are a few runtime workers and short-lived blocking
//! threads, which two arenas serve without contention.

/// Arenas the allocator may create.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const ARENAS: i32 = 2;

/// Caps the allocator's arenas at [`ARENAS`] unless `MALLOC_ARENA_MAX` says otherwise. Call
/// before any thread starts.
pub fn limit_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: `mallopt` only changes glibc's allocator settings; called before other
        // threads exist, nothing allocates concurrently.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, ARENAS);
        }
    }
}

/// Returns free memory of every allocator arena to the operating system. A few milliseconds
/// for a heap of a few hundred MiB; call it from a blocking thread.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only walks glibc's own free lists and has no preconditions; it is
    // safe to call from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}
