//! What users install and what cluster-autoscaler compiles against: the Helm chart (rendered
//! and installed), the checked-in CRDs and examples, and the externalgrpc protocol file.

#[path = "../support/mod.rs"]
mod support;

mod changelog;
mod chart;
mod crds;
mod docs_commands;
mod helm;
mod proto;
mod rbac;
mod runnable_docs;
mod uninstall;
mod workflows;
