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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::testing::*;
    use super::prune;

    #[test]
    fn undeclared_fields_are_dropped_and_the_root_keeps_its_type_and_metadata() {
        let schema = json!({"type": "object", "properties": {
            "spec": {"type": "object", "properties": {"size": {"type": "integer"}}}}});
        let mut v = json!({"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "a", "x": 1},
            "spec": {"size": 1, "colour": "red"}, "extra": true});
        prune(&mut v, &schema, true);
        assert_eq!(
            v,
            json!({"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "a", "x": 1},
                "spec": {"size": 1}})
        );
        // Below the root, apiVersion / kind / metadata are ordinary fields.
        let mut nested = json!({"spec": {"kind": "K", "size": 1}});
        prune(&mut nested, &schema, true);
        assert_eq!(nested, json!({"spec": {"size": 1}}));
    }

    #[test]
    fn values_are_not_validated() {
        let schema = json!({"properties": {"spec": {"properties": {"size": {"type": "integer"}}}}});
        let mut v = json!({"spec": {"size": "big"}});
        prune(&mut v, &schema, true);
        assert_eq!(v, json!({"spec": {"size": "big"}}));
    }

    #[test]
    fn preserve_unknown_fields_keeps_undeclared_fields_but_prunes_declared_ones() {
        let schema = json!({"properties": {"spec": {
            "x-kubernetes-preserve-unknown-fields": true,
            "properties": {"known": {"properties": {"a": {}}}}}}});
        let mut v = json!({"spec": {"anything": {"deep": 1}, "known": {"a": 1, "b": 2}}});
        prune(&mut v, &schema, true);
        assert_eq!(
            v,
            json!({"spec": {"anything": {"deep": 1}, "known": {"a": 1}}})
        );

        let open_map = json!({"properties": {"labels": {"additionalProperties": true}}});
        let mut v = json!({"labels": {"a": "1", "b": {"c": 2}}});
        prune(&mut v, &open_map, true);
        assert_eq!(v, json!({"labels": {"a": "1", "b": {"c": 2}}}));
    }

    #[test]
    fn an_additional_properties_schema_applies_to_every_value() {
        let schema = json!({"properties": {"ports": {
            "additionalProperties": {"properties": {"port": {"type": "integer"}}}}}});
        let mut v = json!({"ports": {"http": {"port": 80, "junk": 1}, "https": {"port": 443}}});
        prune(&mut v, &schema, true);
        assert_eq!(
            v,
            json!({"ports": {"http": {"port": 80}, "https": {"port": 443}}})
        );
    }

    #[test]
    fn an_items_schema_applies_to_every_list_element() {
        let schema = json!({"properties": {
            "list": {"items": {"properties": {"name": {}}}},
            "untyped": {}}});
        let mut v = json!({"list": [{"name": "a", "junk": 1}, {"junk": 2}, 3],
            "untyped": [{"kept": true}]});
        prune(&mut v, &schema, true);
        assert_eq!(
            v,
            json!({"list": [{"name": "a"}, {}, 3], "untyped": [{"kept": true}]})
        );
    }

    #[test]
    fn custom_resources_are_pruned_on_every_write() {
        let (mut s, widgets) = store_with_widgets();
        let mut body = widget("w", json!({"size": 1, "colour": "red"}));
        body["extra"] = json!(1);
        let created = create(&mut s, &widgets, Some("default"), body);
        assert_eq!(created["spec"], json!({"size": 1}));
        assert!(created.get("extra").is_none());

        let mut replaced = created.clone();
        replaced["spec"] = json!({"size": 2, "shape": "round"});
        let updated = put(&mut s, &widgets, Some("default"), replaced, false).unwrap();
        assert_eq!(updated["spec"], json!({"size": 2}));
        let stored = get(&s, &widgets, Some("default"), "w").unwrap();
        assert_eq!(stored["spec"], json!({"size": 2}));

        // The status schema preserves unknown fields.
        let mut with_status = stored.clone();
        with_status["status"] = json!({"ready": true, "anything": [1]});
        let status = put(&mut s, &widgets, Some("default"), with_status, true).unwrap();
        assert_eq!(status["status"], json!({"ready": true, "anything": [1]}));
    }
}
