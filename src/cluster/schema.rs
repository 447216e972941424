//! Pruning by structural schema: the fields of a custom resource that its version's `openAPIV3Schema`
//! does not declare are dropped on every write, as the real server does. Values are not validated
//! against the schema and no defaults are applied.

use serde_json::Value;

/// Drops the fields a structural schema does not declare, as the real server prunes custom resources:
/// `properties` are recursed into, `additionalProperties` schemas apply to every value,
/// `x-kubernetes-preserve-unknown-fields: true` keeps undeclared fields, `items` applies to list
/// elements. At the root, `apiVersion`, `kind` and `metadata` are kept.
pub(super) fn prune(v: &mut Value, schema: &Value, root: bool) {
    match v {
        Value::Object(map) => {
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties");
            let preserve = schema.get("x-kubernetes-preserve-unknown-fields")
                == Some(&Value::Bool(true))
                || additional == Some(&Value::Bool(true));
            let keys: Vec<String> = map.keys().cloned().collect();
            for k in keys {
                if root && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                    continue;
                }
                let sub = props
                    .and_then(|p| p.get(&k))
                    .or(additional.filter(|a| a.is_object()));
                match (sub, map.get_mut(&k)) {
                    (Some(sub), Some(child)) => prune(child, sub, false),
                    _ if preserve => {}
                    _ => {
                        map.remove(&k);
                    }
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for it in items {
                    prune(it, item_schema, false);
                }
            }
        }
        _ => {}
    }
}
