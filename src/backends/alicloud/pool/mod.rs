//! A NodePool's instances in an Alibaba Cloud Auto Scaling (ESS) scaling group.
//!
//! ESS launches instances itself, so a creation is not one call per server: the pool asks
//! for several at once (`ScaleWithAdjustment` by a quantity) and recognises them afterwards.
//! Every scale-out carries
//! - `ClientToken` = a digest of its creation requests: ESS answers a repeated call with the
//!   first call's activity, so a retry after a lost answer never scales twice; and as the
//!   other parameters follow from the requests, a token is never reused with different
//!   ones (which Alibaba's idempotence rules refuse, `IdempotentParameterMismatch`; the ESS
//!   reference does not say how long it keeps a token);
//! - `ActivityMetadata` = `{"nodegroup.dev/requests": "<r1>,<r2>,..."}`: the activity keeps
//!   the requests it serves, and each instance names its activity (`ScalingActivityId`), so
//!   a listed instance is traced to its request. An activity's instances are given to its
//!   requests in the order ESS reports them (`CreatedInstances`, else creation time).
//!
//! Before scaling, the recent activities are read: a request one of them already serves is
//! not sent again. A request whose activity ended without an instance for it (out of stock,
//! clamped by MaxSize) is a failed creation ([`AliCloudPool::creation_failures`]). A
//! scale-out that would change nothing is recorded by ESS as a `Rejected` activity
//! (`StatusCode`, DescribeScalingActivities reference): its creations fail at once with the
//! activity's `StatusMessage`. While another activity runs ESS refuses to scale: nothing is
//! sent and the creations are [`Created::Deferred`].
//!
//! A group with expected capacity keeps the desired capacity a scale-out raised even when
//! the launch falls short (out of stock), and keeps launching toward it: instances would
//! appear later with no request behind them, after cluster-autoscaler was told the
//! creations failed. So when the newest of this operator's scale-outs ended short and no
//! activity runs, [`AliCloudPool::members`] sets the desired capacity back to the
//! instances the group holds (`ModifyScalingGroup`). cluster-autoscaler's in-tree provider
//! reads that desired capacity as the group's size (`alicloud_manager.go` `GetAsgSize`) and
//! lowers it through `DecreaseTargetSize` once its node-provisioning timeout passes; the
//! pool does the same as soon as the launch has ended.
//!
//! Removal is `RemoveInstances` of exactly the given instances, at most 20 per call,
//! lowering the desired capacity by as many (`DecreaseDesiredCapacity=true`) and releasing
//! them (`RemovePolicy=release`). An instance a user put in `Protected` (scale-in
//! protection) or `Standby` is never removed: ESS would release a protected instance named
//! in `RemoveInstances`, so the pool refuses its removal itself, as cluster-autoscaler's
//! providers leave protected nodes alone.
//!
//! Instances created by others (ESS health replacements, cluster-autoscaler's in-tree
//! provider) are members too, without a request: the reconciler adopts them.
//!
//! The files: the pool on its group (`group.rs`, the
//! [`PoolBackend`](crate::nodepool::backend::PoolBackend)), how the pool connects
//! (`connector.rs`), what activities and instances mean for the requests (`activities.rs`),
//! and ESS's errors as the reconciler's (`errors.rs`).

mod activities;
mod connector;
mod errors;
mod group;

pub use activities::REQUESTS_KEY;
pub use connector::{AliCloudConnector, client_options};
pub use group::{AliCloudPool, BACKEND_NAME, GPU_LABEL, GroupBounds};
