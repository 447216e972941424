//! Every message the actors exchange, one file per receiver. Messages are plain data: this
//! module imports nothing of the actors.
//!
//! - [`manager`]: [`ManagerMsg`], what a manager supervisor handles (through its mailbox), and
//!   [`MailWaiting`], the one ractor message that says its mailbox has mail.
//! - [`resource_actor`]: [`ResourceMsg`], what a resource actor handles, and [`Activation`].
//! - [`timer`]: [`TimerMsg`], what the timer task delivers, with its [`ReconcileSlot`].
//! - [`trigger`]: [`Trigger`] and [`Cause`], why a reconcile runs (carried by the messages that
//!   make one due).

mod manager;
mod resource_actor;
mod timer;
mod trigger;

pub(crate) use manager::{MailWaiting, ManagerMsg, PassiveState};
pub(crate) use resource_actor::{Activation, ResourceMsg};
pub(crate) use timer::{ReconcilePermit, ReconcileSlot, TimerMsg};
pub use trigger::{Cause, Trigger};
