//! Every message the actors exchange, one file per receiving actor. Messages are plain data.

mod manager;
mod resource;

pub use manager::{ManagerMsg, PassiveState};
pub use resource::{Activation, ResourceMsg};
