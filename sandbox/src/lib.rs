//! `ngo-sandbox`: nodegroup-operator in the testbed (`ngo-testbed`): a sandbox with the
//! operator's CRDs installed ([`environment`]), the operator binary as a process
//! ([`operator`]), autoscaled clusters with the real cluster-autoscaler ([`stack`]), the
//! end-to-end tests' worlds ([`world`]), and the commands `make demo`, `make soak`,
//! `make chaos`, `make bench` and `make scale` run. It is a developer tool: nothing here ships
//! in the operator image.

pub mod bench;
pub mod chaos;
pub mod demo;
pub mod environment;
pub mod operator;
pub mod scale;
pub mod soak;
pub mod stack;
pub mod tap;
pub mod world;
