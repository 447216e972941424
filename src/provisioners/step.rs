//! A provisioner from closures, for steps that need no struct of their own.

use std::future::Future;

use futures::future::BoxFuture;

use super::{Context, Outcome, Provisioner};

type StepFn<K> = Box<dyn Fn(Context<K>) -> BoxFuture<'static, Outcome> + Send + Sync>;

/// A provisioner made of a provision closure and an optional deprovision closure.
/// Built with [`step`].
pub struct Step<K> {
    name: String,
    provision: StepFn<K>,
    deprovision: Option<StepFn<K>>,
    rules: Vec<crate::rbac::ScopedRule>,
    /// The condition type the step owns ([`Step::attached_condition`]).
    condition: Option<std::sync::Arc<str>>,
}

fn boxed_fn<K, P, F>(f: P) -> StepFn<K>
where
    P: Fn(Context<K>) -> F + Send + Sync + 'static,
    F: Future<Output = Outcome> + Send + 'static,
{
    Box::new(move |cx| Box::pin(f(cx)))
}

/// A step from an async closure; its deprovision does nothing (returns `Done`) unless one is
/// added with [`Step::on_delete`].
///
/// ```
/// use actorcile::prelude::*;
/// # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
/// # #[kube(group = "example.com", version = "v1", kind = "App", namespaced)]
/// # struct AppSpec { replicas: i32 }
/// let s = step("hello", |cx: Context<App>| async move {
///     tracing::info!(name = ?cx.object().metadata.name, "hello");
///     Outcome::Done
/// })
/// .on_delete(|_cx: Context<App>| async { Outcome::Done });
/// # let _ = s;
/// ```
pub fn step<K, P, F>(name: impl Into<String>, provision: P) -> Step<K>
where
    K: 'static,
    P: Fn(Context<K>) -> F + Send + Sync + 'static,
    F: Future<Output = Outcome> + Send + 'static,
{
    Step {
        name: name.into(),
        provision: boxed_fn(provision),
        deprovision: None,
        rules: Vec::new(),
        condition: None,
    }
}

impl<K: 'static> Step<K> {
    /// Give the step a deprovision closure.
    pub fn on_delete<D, F>(mut self, deprovision: D) -> Self
    where
        D: Fn(Context<K>) -> F + Send + Sync + 'static,
        F: Future<Output = Outcome> + Send + 'static,
    {
        self.deprovision = Some(boxed_fn(deprovision));
        self
    }

    /// Declare a permission the step needs in the namespace of the object it runs for (see
    /// [`Provisioner::rules`]), e.g. `rbac::rule_for::<Secret>(&["get"])`. For a permission
    /// elsewhere (a cluster-scoped kind, another namespace), use [`Step::needs_in`].
    ///
    /// ```
    /// use actorcile::prelude::*;
    /// use actorcile::rbac::RuleScope;
    /// use k8s_openapi::api::core::v1::Secret;
    /// # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
    /// # #[kube(group = "example.com", version = "v1", kind = "App", namespaced)]
    /// # struct AppSpec {}
    /// let read_password = step("password", |cx: Context<App>| async move {
    ///     let _api: kube::Api<Secret> = kube::Api::namespaced(cx.client().clone(), "apps");
    ///     Outcome::Done
    /// })
    /// .needs_in(RuleScope::namespace("apps"), actorcile::rbac::rule_for::<Secret>(&["get"]));
    /// assert_eq!(read_password.rules()[0].step, "password");
    /// assert_eq!(read_password.rules()[0].scope, RuleScope::namespace("apps"));
    /// ```
    pub fn needs(self, rule: k8s_openapi::api::rbac::v1::PolicyRule) -> Self {
        self.needs_in(crate::rbac::RuleScope::Object, rule)
    }

    /// Attach condition `type_` to the step (sequencer's attached condition): its provision
    /// and deprovision write it with [`Context::update_condition`] and read it back with
    /// [`Context::attached_condition`]. The type follows the rules of
    /// [`Context::set_condition`] (checked at the first write); `Ready` is the runtime's.
    pub fn attached_condition(mut self, type_: impl Into<String>) -> Self {
        self.condition = Some(type_.into().into());
        self
    }

    /// The context the step's closures get: with its attached condition, if it has one.
    fn context(&self, cx: &Context<K>) -> Context<K> {
        match &self.condition {
            Some(c) => cx.with_attached(c.clone()),
            None => cx.clone(),
        }
    }

    /// Declare a permission the step needs in `scope` (see [`Step::needs`]).
    pub fn needs_in(
        mut self,
        scope: crate::rbac::RuleScope,
        rule: k8s_openapi::api::rbac::v1::PolicyRule,
    ) -> Self {
        self.rules.push(crate::rbac::ScopedRule::new(scope, rule));
        self
    }
}

// Written out rather than with `#[async_trait]`: the closure's future is already boxed, and the
// macro would box it again (and move it into the second box) on every reconcile.
impl<K: Send + Sync + 'static> Provisioner<K> for Step<K> {
    fn name(&self) -> &str {
        &self.name
    }
    fn rules(&self) -> Vec<crate::rbac::StepRule> {
        crate::rbac::StepRule::scoped(&self.name, self.rules.clone())
    }
    fn provision<'a, 'b, 'r>(&'a self, cx: &'b Context<K>) -> BoxFuture<'r, Outcome>
    where
        'a: 'r,
        'b: 'r,
        Self: 'r,
    {
        super::step_log::logged(cx, &self.name, (self.provision)(self.context(cx)))
    }
    fn deprovision<'a, 'b, 'r>(&'a self, cx: &'b Context<K>) -> BoxFuture<'r, Outcome>
    where
        'a: 'r,
        'b: 'r,
        Self: 'r,
    {
        match &self.deprovision {
            Some(d) => super::step_log::logged(cx, &self.name, d(self.context(cx))),
            None => Box::pin(std::future::ready(Outcome::Done)),
        }
    }
}
