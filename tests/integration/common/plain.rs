//! A kind with a plain status of its own (no runtime status), for the cases that test the API
//! servers themselves: the conformance suite and the in-process server's own cases.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The kind's API group.
pub const GROUP: &str = "conformance.actorcile.dev";

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, JsonSchema, PartialEq)]
#[kube(
    group = "conformance.actorcile.dev",
    version = "v1",
    kind = "Widget",
    namespaced,
    status = "WidgetStatus"
)]
pub struct WidgetSpec {
    pub size: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, JsonSchema, PartialEq)]
pub struct WidgetStatus {
    pub ready: bool,
}

/// A widget named `name` of `size`.
pub fn widget(name: &str, size: i32) -> Widget {
    Widget::new(name, WidgetSpec { size, note: None })
}
