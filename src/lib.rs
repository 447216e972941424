//! actorcile

pub mod cluster;
