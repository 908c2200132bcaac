//! The workload clusters' reads run on a thread of their own. Their API servers are the
//! tenants': decoding a tenant's 64 MiB answer, or scanning a 16 MiB watch line, holds the
//! thread it runs on for tens of milliseconds. On the runtime that serves cluster-autoscaler,
//! that would stall every other tenant's RPCs queued behind it on the same worker; on a thread
//! of its own, at a lower priority ([`NICENESS`]), the operating system runs the RPC workers
//! first when both want the CPU.

use std::future::Future;

/// How much lower the workload thread's priority is than the RPC workers' (a nice value).
pub const NICENESS: i32 = 10;

/// Lowers the calling thread's priority by [`NICENESS`]; on Linux `setpriority` with a thread
/// id sets that thread's nice value alone. Elsewhere, and where it fails, nothing changes.
fn lower_this_threads_priority() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: `gettid` has no preconditions; `setpriority` only changes the scheduling
        // priority of the thread it names (this one) and reports failure through its result.
        let done = unsafe {
            let tid = libc::gettid();
            libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, NICENESS)
        };
        if done != 0 {
            tracing::debug!(error = %std::io::Error::last_os_error(), "could not lower the workload thread's priority");
        }
    }
}

/// Runs `work` on a single-threaded runtime in a thread named `name`, until it ends; resolves
/// to its result. The runtime (and every task `work` spawned on it) ends with it.
pub async fn on_own_thread<F>(name: &str, work: F) -> anyhow::Result<()>
where
    F: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let (done, result) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            lower_this_threads_priority();
            let outcome = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime.block_on(work),
                Err(error) => {
                    Err(anyhow::Error::new(error).context("starting the workload runtime"))
                }
            };
            let _ = done.send(outcome);
        })
        .map_err(|error| anyhow::Error::new(error).context("starting the workload thread"))?;
    result
        .await
        .map_err(|_| anyhow::anyhow!("the workload thread ended without a result"))?
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    /// Work that holds its thread for a while (as decoding a huge answer does) delays no task
    /// of the caller's runtime, which has one worker here.
    #[tokio::test(flavor = "current_thread")]
    async fn work_that_holds_its_thread_does_not_stall_the_callers_runtime() {
        let busy = tokio::spawn(on_own_thread("busy", async {
            let until = Instant::now() + Duration::from_millis(500);
            while Instant::now() < until {
                std::hint::spin_loop();
            }
            Ok(())
        }));
        let started = Instant::now();
        let mut late = Duration::ZERO;
        for _ in 0..20 {
            let asked = Instant::now();
            tokio::time::sleep(Duration::from_millis(10)).await;
            late = late.max(asked.elapsed().saturating_sub(Duration::from_millis(10)));
        }
        busy.await.expect("joined").expect("the work's result");
        #[cfg(target_os = "linux")]
        {
            let nice = on_own_thread("nice", async {
                // SAFETY: as above; reads this thread's nice value.
                let nice =
                    unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) };
                anyhow::ensure!(nice >= NICENESS, "nice {nice}");
                Ok(())
            });
            nice.await
                .expect("the workload thread runs at a lower priority");
        }
        assert!(
            late < Duration::from_millis(100),
            "a 10 ms sleep came {late:?} late while the work ran ({:?} in all)",
            started.elapsed()
        );
    }
}
