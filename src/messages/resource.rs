//! Messages a resource actor receives.

use std::sync::Arc;

use crate::actors::RunSlot;

/// What a resource actor handles, one at a time, so one object never has two runs at once.
#[derive(Debug)]
pub enum ResourceMsg<K> {
    /// The watch feeder observed a new version of the object.
    Observed(Arc<K>),
    /// The object is gone from the API: stop and be forgotten.
    Gone,
    /// Self-message: run a pass now if one is due (coalesces any number of triggers).
    Run,
    /// The pending timer with this token fired (stale tokens are ignored), with the run slot the
    /// timer task acquired for the pass.
    Wake(u64, Option<RunSlot>),
    /// The run slot a pass that found none free asked the timer task for.
    Slot(Option<RunSlot>),
    /// A dependency became Ready, or a referrer released this object: run now.
    Notify,
    /// Self-message, sent once the actor has removed its route (so nothing new is routed here):
    /// stop now, leaving a [`PassiveState`](super::PassiveState) in the final state the manager
    /// receives. Everything routed here before it is handled first.
    Passivate,
}
