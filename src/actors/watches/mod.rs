//! The watches behind a controller's triggers (see [`crate::triggers`]): its provider config,
//! whose change re-runs every object; the Secrets its objects reference, whose change re-runs
//! the objects that reference them; and the children it owns and the objects it relates to
//! ([`Controller::owns`], [`Controller::watches`]), whose change re-runs the objects they map
//! to.
//!
//! [`Controller::owns`]: crate::runtime::Controller::owns
//! [`Controller::watches`]: crate::runtime::Controller::watches
//!
//! | file | what it holds |
//! |---|---|
//! | `config.rs` | the provider config's watch, and the config as the reconciles read it |
//! | `secrets.rs` | the watch of the Secrets objects reference (metadata only), and which objects reference which |
//! | `related.rs` | the watches of owned children and related objects, and whom their changes run |

use std::any::Any;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher::{self, Event};
use kube::{Client, Resource};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::mailbox::Mailbox;
use super::{FastMap, ManagedResource, Shared};
use crate::lenient::Lenient;
use crate::messages::{Cause, ManagerMsg, ResourceMsg, Trigger};
use crate::triggers::{ConfigRef, PollFrom, SecretIndex, SecretsBy};

mod config;
mod related;
mod secrets;

pub(crate) use config::{ConfigView, StartConfigWatch};
#[cfg(test)]
pub(crate) use related::{TestInput, drive_related, owners_of};
pub(crate) use secrets::{SecretTrigger, watch_secrets};

/// Re-run `key`, for `cause`: at its live actor, or through the manager.
pub(crate) fn notify<K: ManagedResource>(
    shared: &Shared<K>,
    manager: &Mailbox<ManagerMsg<K>>,
    key: ObjectRef<K>,
    cause: Cause,
) {
    if let Some(a) = shared.routes.get(&key)
        && a.cast(ResourceMsg::Notify(cause.clone())).is_ok()
    {
        return;
    }
    manager.send(ManagerMsg::Notify(key, cause));
}
