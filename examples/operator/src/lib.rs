//! The example operator's parts, as a library: its kinds and trees (`operator`), its manifests, its
//! webhooks, and the demo and reconcile recording its binary runs. Its tests build the
//! same runtime the binary runs from here (the roles it needs, for one).

pub mod dashboard;
pub mod demo;
pub mod manifests;
pub mod operator;
pub mod record;
pub mod webhooks;
