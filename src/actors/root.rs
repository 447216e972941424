//! The root actor: the parent of every kind's manager.

use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio::sync::watch;

use crate::policy::restarts::Escalation;

/// Why a manager stopped the runtime.
#[derive(Clone, Debug)]
pub(crate) enum ManagerFailure {
    Escalated(Escalation),
    Other(Arc<dyn std::error::Error + Send + Sync>),
}

/// The root actor: parent of every manager; past-intensity escalations end up here.
pub(crate) struct Root;

impl Actor for Root {
    type Msg = ();
    type State = watch::Sender<Option<ManagerFailure>>;
    type Arguments = watch::Sender<Option<ManagerFailure>>;

    async fn pre_start(
        &self,
        _myself: ActorRef<()>,
        tx: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(tx)
    }

    async fn handle_supervisor_evt(
        &self,
        _myself: ActorRef<()>,
        event: SupervisionEvent,
        tx: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if let SupervisionEvent::ActorFailed(_, err) = event {
            tracing::error!(error = %err, "a manager escalated; the runtime stops");
            let failure = match err.downcast::<Escalation>() {
                Ok(escalation) => ManagerFailure::Escalated(*escalation),
                Err(other) => ManagerFailure::Other(Arc::from(other)),
            };
            let _ = tx.send(Some(failure));
        }
        Ok(())
    }
}
