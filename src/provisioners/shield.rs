//! Work a reconcile must not be cut in: [`Context::shielded`]. The runtime cancels a provision
//! reconcile whose object moved on ([`crate::scheduling`]'s `moved_on.rs`) only while no shielded
//! future of it runs.

use std::sync::atomic::{AtomicU32, Ordering};

use super::Context;

/// Lowers a context's shield when dropped: at the shielded future's end, or when the whole
/// reconcile is dropped (its timeout, a lost shard).
struct ShieldUp<'a>(&'a AtomicU32);

impl Drop for ShieldUp<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl<K> Context<K> {
    /// Run `work` to its end even if the object moves on meanwhile.
    ///
    /// The runtime cancels a provision reconcile at its next await point when a new generation
    /// or a deletion of its object arrives ([`Controller::cancel_on_change`]), so that the
    /// newest intent runs at once instead of after a slow call made for an old one. Code that
    /// must not be cut between a side effect and its record runs shielded: the reconcile is
    /// cut at the first await point after every shielded future of it has ended.
    /// [`Context::guard`] runs its lock, task and record shielded.
    ///
    /// The policy's `reconcile_timeout` and a lost shard still stop a shielded future.
    ///
    /// [`Controller::cancel_on_change`]: crate::runtime::Controller::cancel_on_change
    ///
    /// ```
    /// use actorcile::prelude::*;
    /// # async fn charge_card(order: &str) -> Result<String, std::io::Error> { Ok(order.into()) }
    /// # async fn f<K: ManagedResource>(cx: &Context<K>) -> Outcome {
    /// // The charge and the writing of its receipt happen together or not at all.
    /// let receipt = cx.shielded(async { charge_card("order-7").await }).await;
    /// # let _ = receipt;
    /// # Outcome::Done
    /// # }
    /// ```
    pub async fn shielded<F: std::future::Future>(&self, work: F) -> F::Output {
        self.shield().fetch_add(1, Ordering::Relaxed);
        let _up = ShieldUp(self.shield());
        work.await
    }

    /// Whether a [`Context::shielded`] future of this reconcile is running.
    pub(crate) fn is_shielded(&self) -> bool {
        self.shield().load(Ordering::Relaxed) > 0
    }
}
