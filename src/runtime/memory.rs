//! Giving memory the process no longer uses back to the operating system.
//!
//! glibc's allocator keeps freed memory in its arenas for reuse and returns it only when the
//! top of the heap is free. A full index pass (start-up, a re-list) allocates the whole
//! state afresh while the previous one is still alive, and the initial list decodes every
//! object once; afterwards most of that memory is free but still resident. Trimming after
//! such a pass keeps the resident size close to what the caches and the index hold.

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
