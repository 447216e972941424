//! actorcile
