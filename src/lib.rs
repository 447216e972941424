//! actorcile

#[cfg(feature = "envtest")]
pub mod envtest;
