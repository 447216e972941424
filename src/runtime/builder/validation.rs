//! [`RuntimeBuilder::validate`]: the settings checked before anything starts, each error naming its field.

use super::*;
use crate::runtime::{ControllerPart, Setting};

impl RuntimeBuilder {
    /// Check everything given to the builder, without starting anything: the policies, that
    /// there is a controller and no kind has two, that each `[kinds.<Kind>]` section of the
    /// policy names a controller's kind that sets no policy in code, the operator's names,
    /// the finalizer and the former ones, the field manager, and each controller's config. The first problem is an [`Error::Invalid`] naming its field
    /// (or an [`Error::Policy`] naming the policy's).
    pub fn validate(&self) -> Result<(), Error> {
        self.policy.validate()?;
        if self.controllers.is_empty() {
            return Err(Error::Invalid {
                field: Setting::Controllers,
                problem: "no controller is registered (add one with RuntimeBuilder::controller)"
                    .into(),
            });
        }
        if let Err(e) = self.names.validate() {
            return Err(Error::Invalid {
                field: Setting::OperatorNames,
                problem: e.to_string(),
            });
        }
        if !crate::names::is_prefixed_qualified_name(&self.finalizer) {
            return Err(Error::Invalid {
                field: Setting::Finalizer,
                problem: format!(
                    "{:?} is not a qualified name with a prefix, like example.com/finalizer",
                    self.finalizer
                ),
            });
        }
        for former in &self.former_finalizers {
            let problem = if !crate::names::is_prefixed_qualified_name(former) {
                format!(
                    "{former:?} is not a qualified name with a prefix, like example.com/finalizer"
                )
            } else if *former == self.finalizer {
                format!("{former:?} is the current finalizer; migrate from another name")
            } else {
                continue;
            };
            return Err(Error::Invalid {
                field: Setting::FormerFinalizer,
                problem,
            });
        }
        if self.field_manager.is_empty() || self.field_manager.len() > 128 {
            return Err(Error::Invalid {
                field: Setting::FieldManager,
                problem: "must be 1 to 128 characters".into(),
            });
        }
        let mut kinds = std::collections::HashSet::new();
        for c in &self.controllers {
            let (api_version, kind) = c.kind();
            if !kinds.insert((api_version.clone(), kind.clone())) {
                return Err(Error::Invalid {
                    field: Setting::Controller {
                        kind: kind.clone(),
                        part: ControllerPart::Whole,
                    },
                    problem: format!(
                        "{api_version} {kind} is registered twice; one controller per kind"
                    ),
                });
            }
            if c.has_own_policy() && self.policy.kinds.contains_key(&kind) {
                return Err(Error::Invalid {
                    field: Setting::Controller {
                        kind: kind.clone(),
                        part: ControllerPart::Policy,
                    },
                    problem: format!(
                        "set both in code (Controller::policy) and by the policy's [kinds.{kind}] section; keep one"
                    ),
                });
            }
            c.validate()?;
        }
        if let Some(kind) = self
            .policy
            .kinds
            .keys()
            .find(|k| !kinds.iter().any(|(_, kind)| kind == *k))
        {
            return Err(Error::Invalid {
                field: Setting::PolicySection { kind: kind.clone() },
                problem: format!("no controller of kind {kind} is registered"),
            });
        }
        if let Some(sharding) = &self.sharding {
            sharding.validate(&self.policy)?;
            if sharding.watch == crate::sharding::ShardWatch::ServerSide
                && let Some(c) = self.controllers.iter().find(|c| c.has_shard_key())
            {
                return Err(Error::Invalid {
                    field: Setting::Controller {
                        kind: c.kind().1,
                        part: ControllerPart::ShardKey,
                    },
                    problem: "ShardWatch::ServerSide places objects by their uid (the API server's selection); a shard key cannot be used with it".into(),
                });
            }
            if self.leader.is_some() {
                return Err(Error::Invalid {
                    field: Setting::Sharding { option: "" },
                    problem: "sharding and leader election exclude each other (one shard is the same as leading)".into(),
                });
            }
        }
        Ok(())
    }
}
