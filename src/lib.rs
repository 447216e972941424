//! actorcile

pub mod cluster;
#[cfg(feature = "envtest")]
pub mod envtest;
