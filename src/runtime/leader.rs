//! Lease-based leader election (coordination.k8s.io/v1). Every replica serves gRPC; only the
//! leader writes status, reports configuration problems, sweeps scale-down records and
//! reconciles NodePools: each of those runs through [`while_leading`], one term at a time.

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Where the Lease lives and who we are.
#[derive(Clone, Debug)]
pub struct LeaderConfig {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
    /// Our identity (pod name).
    pub identity: String,
    /// How long a lease stays valid without renewal.
    pub lease_duration: Duration,
    /// How often to renew or retry.
    pub retry_period: Duration,
}

/// Runs the election until `shutdown`, publishing leadership on `leading`. On shutdown a
/// leader keeps renewing its lease until `work_ended` (the passes it leads have finished), then
/// releases it: another replica takes over only once this one can start nothing more.
pub async fn run(
    client: Client,
    config: LeaderConfig,
    leading: watch::Sender<bool>,
    shutdown: CancellationToken,
    work_ended: CancellationToken,
) -> anyhow::Result<()> {
    let api: Api<Lease> = Api::namespaced(client, &config.namespace);
    loop {
        let now_leading = match try_acquire_or_renew(&api, &config).await {
            Ok(l) => l,
            Err(error) => {
                tracing::warn!(%error, lease = %config.name, "leader election: lease update failed");
                false
            }
        };
        if leading.send_replace(now_leading) != now_leading {
            tracing::info!(identity = %config.identity, leading = now_leading, "leadership changed");
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(config.retry_period) => {}
        }
    }
    if *leading.borrow() && !work_ended.is_cancelled() {
        tracing::info!(lease = %config.name, "shutting down: keeping the lease until the running NodePool passes end");
    }
    while *leading.borrow() && !work_ended.is_cancelled() {
        tokio::select! {
            _ = work_ended.cancelled() => break,
            _ = tokio::time::sleep(config.retry_period) => {}
        }
        match try_acquire_or_renew(&api, &config).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(lease = %config.name, "lost the lease while finishing work at shutdown");
                leading.send_replace(false);
            }
            Err(error) => {
                tracing::warn!(%error, lease = %config.name, "leader election: lease update failed at shutdown");
            }
        }
    }
    if *leading.borrow() {
        release(&api, &config).await;
        leading.send_replace(false);
    }
    Ok(())
}

/// Runs `term` for every term this replica leads, until `shutdown`. `term` gets a token that is
/// cancelled when leadership is lost or at shutdown; it should stop starting work then, finish
/// or give up what it started, and return. The next term starts with a fresh call once this
/// replica leads again. Returns when `shutdown` is cancelled (after the running term returned),
/// when the leadership channel closes, or with the error a term returned. A term that returns
/// on its own while still leading ends the task: there is nothing left for it to do.
pub async fn while_leading<F, Fut>(
    task: &'static str,
    mut leading: watch::Receiver<bool>,
    shutdown: CancellationToken,
    mut term: F,
) -> anyhow::Result<()>
where
    F: FnMut(CancellationToken) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    loop {
        while !*leading.borrow_and_update() {
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                changed = leading.changed() => if changed.is_err() { return Ok(()) },
            }
        }
        tracing::debug!(task, "leading: term starts");
        let ends = shutdown.child_token();
        let run = term(ends.clone());
        tokio::pin!(run);
        let lost = async {
            loop {
                if leading.changed().await.is_err() || !*leading.borrow() {
                    return;
                }
            }
        };
        tokio::select! {
            result = &mut run => {
                tracing::debug!(task, "term ended on its own");
                return result;
            }
            () = lost => {}
            () = shutdown.cancelled() => {}
        }
        ends.cancel();
        run.await?;
        tracing::debug!(task, "leadership lost or shutting down: term ended");
        if shutdown.is_cancelled() {
            return Ok(());
        }
    }
}

async fn try_acquire_or_renew(
    api: &Api<Lease>,
    config: &LeaderConfig,
) -> Result<bool, kube::Error> {
    let now = jiff::Timestamp::now();
    let duration_secs = config.lease_duration.as_secs() as i32;
    let Some(mut lease) = api.get_opt(&config.name).await? else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(config.name.clone()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(config.identity.clone()),
                lease_duration_seconds: Some(duration_secs),
                acquire_time: Some(MicroTime(now)),
                renew_time: Some(MicroTime(now)),
                lease_transitions: Some(0),
                ..Default::default()
            }),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        };
    };
    let spec = lease.spec.get_or_insert_default();
    let holder = spec.holder_identity.clone().unwrap_or_default();
    let held_by_us = holder == config.identity;
    let expired = match (&spec.renew_time, spec.lease_duration_seconds) {
        (Some(renewed), Some(secs)) => renewed
            .0
            .checked_add(jiff::SignedDuration::from_secs(i64::from(secs)))
            .is_ok_and(|end| end < now),
        _ => true,
    };
    if !held_by_us && !holder.is_empty() && !expired {
        return Ok(false);
    }
    if !held_by_us {
        spec.acquire_time = Some(MicroTime(now));
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        spec.holder_identity = Some(config.identity.clone());
    }
    spec.renew_time = Some(MicroTime(now));
    spec.lease_duration_seconds = Some(duration_secs);
    // resourceVersion from the read makes this a compare-and-swap.
    match api
        .replace(&config.name, &PostParams::default(), &lease)
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

async fn release(api: &Api<Lease>, config: &LeaderConfig) {
    if let Ok(Some(mut lease)) = api.get_opt(&config.name).await {
        let spec = lease.spec.get_or_insert_default();
        if spec.holder_identity.as_deref() == Some(config.identity.as_str()) {
            spec.holder_identity = None;
            spec.renew_time = None;
            if let Err(error) = api
                .replace(&config.name, &PostParams::default(), &lease)
                .await
            {
                tracing::warn!(%error, "could not release the leader lease");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Terms start only while leading, each ends when leadership is lost, a new one starts
    /// when it comes back, and shutdown ends the running one before returning.
    #[tokio::test]
    async fn a_term_runs_per_leadership_and_ends_with_it() {
        let (leading, receiver) = watch::channel(false);
        let shutdown = CancellationToken::new();
        let started = Arc::new(AtomicUsize::new(0));
        let ended = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn(while_leading("test", receiver, shutdown.clone(), {
            let (started, ended) = (started.clone(), ended.clone());
            move |term: CancellationToken| {
                let (started, ended) = (started.clone(), ended.clone());
                async move {
                    started.fetch_add(1, Ordering::SeqCst);
                    term.cancelled().await;
                    ended.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                }
            }
        }));
        let settle = || tokio::time::sleep(Duration::from_millis(50));
        settle().await;
        assert_eq!(started.load(Ordering::SeqCst), 0, "not leading: no term");
        leading.send_replace(true);
        settle().await;
        assert_eq!(
            (started.load(Ordering::SeqCst), ended.load(Ordering::SeqCst)),
            (1, 0)
        );
        leading.send_replace(false);
        settle().await;
        assert_eq!(
            ended.load(Ordering::SeqCst),
            1,
            "leadership lost: term ended"
        );
        leading.send_replace(true);
        settle().await;
        assert_eq!(
            started.load(Ordering::SeqCst),
            2,
            "leading again: a new term"
        );
        shutdown.cancel();
        task.await.expect("joined").expect("no error");
        assert_eq!(ended.load(Ordering::SeqCst), 2, "shutdown ended the term");
    }

    /// A term's error ends the task with it.
    #[tokio::test]
    async fn a_failing_term_ends_the_task_with_its_error() {
        let (_leading, receiver) = watch::channel(true);
        let result = while_leading("test", receiver, CancellationToken::new(), |_| async {
            anyhow::bail!("broken")
        })
        .await;
        assert_eq!(result.expect_err("the term's error").to_string(), "broken");
    }
}
