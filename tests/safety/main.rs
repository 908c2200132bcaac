//! Scaling safety under faults, load and concurrency (built with the `fault-injection`
//! feature, as `make test` does): crashes at every step of DeleteNodes, cluster-autoscaler's
//! own client timing out against a slow API server, Cluster API rollouts during scale-down,
//! replicas racing each other or lowered by someone else mid-request, a request released
//! while it still runs, the API server going away, and a short soak of mixed load with faulted
//! writes. After each: no stranded deletion mark,
//! exactly the chosen machines gone, replicas exact.

#[path = "../support/mod.rs"]
mod support;

mod apiserver;
mod concurrency;
mod crash;
mod faults;
mod forged;
mod outside_decrement;
mod rollout;
mod shutdown;
mod slow_api;
mod soak;
mod takeover;
