//! Label and field selectors, parsed as the Kubernetes API server parses them.

use std::collections::BTreeSet;

use serde_json::Value;

use super::error::ApiError;

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq)]
enum Requirement {
    /// `key=value` / `key==value`, or `key in (a,b)`.
    In(String, BTreeSet<String>),
    /// `key!=value`, or `key notin (a,b)` (also true when the key is absent).
    NotIn(String, BTreeSet<String>),
    /// `key`.
    Exists(String),
    /// `!key`.
    DoesNotExist(String),
    /// `key>N`.
    Gt(String, i64),
    /// `key<N`.
    Lt(String, i64),
}

/// A parsed label selector (`labelSelector` query parameter).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct LabelSelector {
    reqs: Vec<Requirement>,
}

fn bad(sel: &str, why: &str) -> ApiError {
    ApiError::bad_request(format!(
        "unable to parse requirement: invalid label selector {sel:?}: {why}"
    ))
}

pub(crate) fn valid_key(k: &str) -> bool {
    if k.is_empty() || k.len() > 317 {
        return false;
    }
    let (prefix, name) = match k.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    if let Some(p) = prefix
        && (p.is_empty()
            || !p
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.'))
    {
        return false;
    }
    valid_value(name) && !name.is_empty()
}

pub(crate) fn valid_value(v: &str) -> bool {
    v.len() <= 63
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        && v.chars().next().is_none_or(|c| c.is_ascii_alphanumeric())
        && v.chars().last().is_none_or(|c| c.is_ascii_alphanumeric())
}

/// Splits at commas that are not inside parentheses.
fn split_top(s: &str) -> Result<Vec<&str>, ()> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth < 0 {
                    return Err(());
                }
            }
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(());
    }
    out.push(&s[start..]);
    Ok(out)
}

fn parse_set(sel: &str, rest: &str) -> Result<BTreeSet<String>, ApiError> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| bad(sel, "expected a parenthesized set of values"))?;
    let mut set = BTreeSet::new();
    for v in inner.split(',') {
        let v = v.trim();
        if !valid_value(v) {
            return Err(bad(sel, &format!("invalid value {v:?}")));
        }
        set.insert(v.to_string());
    }
    Ok(set)
}

impl LabelSelector {
    /// Parses a selector; an empty string selects everything.
    pub(crate) fn parse(sel: &str) -> Result<LabelSelector, ApiError> {
        let mut reqs = Vec::new();
        if sel.trim().is_empty() {
            return Ok(LabelSelector { reqs });
        }
        for part in split_top(sel).map_err(|_| bad(sel, "unbalanced parentheses"))? {
            let p = part.trim();
            if p.is_empty() {
                return Err(bad(sel, "empty requirement"));
            }
            let key_end = p
                .find(|c: char| c.is_whitespace() || "=!<>()".contains(c))
                .unwrap_or(p.len());
            let (key, rest) = p.split_at(key_end);
            let rest_t = rest.trim_start();
            let req = if let Some(k) = p.strip_prefix('!') {
                let k = k.trim();
                if !valid_key(k) {
                    return Err(bad(sel, &format!("invalid key {k:?}")));
                }
                Requirement::DoesNotExist(k.to_string())
            } else {
                if !valid_key(key) {
                    return Err(bad(sel, &format!("invalid key {key:?}")));
                }
                let key = key.to_string();
                if rest_t.is_empty() {
                    Requirement::Exists(key)
                } else if let Some(v) = rest_t
                    .strip_prefix("==")
                    .or_else(|| rest_t.strip_prefix('='))
                {
                    let v = v.trim();
                    if !valid_value(v) {
                        return Err(bad(sel, &format!("invalid value {v:?}")));
                    }
                    Requirement::In(key, BTreeSet::from([v.to_string()]))
                } else if let Some(v) = rest_t.strip_prefix("!=") {
                    let v = v.trim();
                    if !valid_value(v) {
                        return Err(bad(sel, &format!("invalid value {v:?}")));
                    }
                    Requirement::NotIn(key, BTreeSet::from([v.to_string()]))
                } else if let Some(v) = rest_t.strip_prefix('>') {
                    let n = v
                        .trim()
                        .parse()
                        .map_err(|_| bad(sel, "expected an integer"))?;
                    Requirement::Gt(key, n)
                } else if let Some(v) = rest_t.strip_prefix('<') {
                    let n = v
                        .trim()
                        .parse()
                        .map_err(|_| bad(sel, "expected an integer"))?;
                    Requirement::Lt(key, n)
                } else if let Some(v) = rest_t.strip_prefix("notin") {
                    Requirement::NotIn(key, parse_set(sel, v)?)
                } else if let Some(v) = rest_t.strip_prefix("in") {
                    Requirement::In(key, parse_set(sel, v)?)
                } else {
                    return Err(bad(sel, &format!("unexpected {rest_t:?}")));
                }
            };
            reqs.push(req);
        }
        Ok(LabelSelector { reqs })
    }

    /// True when the selector is empty (selects everything).
    pub(crate) fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    /// Whether an object (its JSON) matches.
    pub(crate) fn matches(&self, obj: &Value) -> bool {
        if self.reqs.is_empty() {
            return true; // most lists and watches: no lookup per object
        }
        let labels = obj.pointer("/metadata/labels");
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.reqs.iter().all(|r| match r {
            Requirement::In(k, set) => get(k).is_some_and(|v| set.contains(v)),
            Requirement::NotIn(k, set) => get(k).is_none_or(|v| !set.contains(v)),
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::DoesNotExist(k) => get(k).is_none(),
            Requirement::Gt(k, n) => get(k)
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|v| v > *n),
            Requirement::Lt(k, n) => get(k)
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|v| v < *n),
        })
    }
}

/// A parsed field selector: only `metadata.name` and `metadata.namespace` are supported, as for custom
/// resources on the real server.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct FieldSelector {
    /// (field, value, equal?)
    reqs: Vec<(Field, String, bool)>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Field {
    Name,
    Namespace,
}

impl FieldSelector {
    /// Parses a field selector; an empty string selects everything.
    pub(crate) fn parse(sel: &str) -> Result<FieldSelector, ApiError> {
        let mut reqs = Vec::new();
        if sel.trim().is_empty() {
            return Ok(FieldSelector { reqs });
        }
        for part in sel.split(',') {
            let p = part.trim();
            let (field, value, eq) = if let Some((f, v)) = p.split_once("!=") {
                (f, v, false)
            } else if let Some((f, v)) = p.split_once("==") {
                (f, v, true)
            } else if let Some((f, v)) = p.split_once('=') {
                (f, v, true)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{sel}'; can't understand '{p}'"
                )));
            };
            let field = match field.trim() {
                "metadata.name" => Field::Name,
                "metadata.namespace" => Field::Namespace,
                other => {
                    return Err(ApiError::bad_request(format!(
                        "field label not supported: {other}"
                    )));
                }
            };
            reqs.push((field, value.trim().to_string(), eq));
        }
        Ok(FieldSelector { reqs })
    }

    /// True when the selector is empty (selects everything).
    pub(crate) fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    /// The single name this selector pins (`metadata.name=x`), if any: lets lists skip a scan.
    pub(crate) fn exact_name(&self) -> Option<&str> {
        self.reqs
            .iter()
            .find(|(f, _, eq)| *f == Field::Name && *eq)
            .map(|(_, v, _)| v.as_str())
    }

    /// Whether an object (its JSON) matches.
    pub(crate) fn matches(&self, obj: &Value) -> bool {
        self.reqs.iter().all(|(f, v, eq)| {
            let actual = match f {
                Field::Name => obj.pointer("/metadata/name"),
                Field::Namespace => obj.pointer("/metadata/namespace"),
            }
            .and_then(Value::as_str)
            .unwrap_or("");
            (actual == v) == *eq
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "a", "namespace": "ns", "labels": labels}})
    }

    #[test]
    fn label_selector_operators() {
        let o = obj(json!({"app": "web", "tier": "front", "n": "5"}));
        let m = |s: &str| LabelSelector::parse(s).unwrap().matches(&o);
        assert!(m(""));
        assert!(m("app=web"));
        assert!(m("app==web"));
        assert!(!m("app=db"));
        assert!(m("app!=db"));
        assert!(!m("app!=web"));
        assert!(m("app in (web, db)"));
        assert!(!m("app notin (web,db)"));
        assert!(m("tier"));
        assert!(!m("!tier"));
        assert!(m("!missing"));
        assert!(m("missing notin (x)"));
        assert!(m("n>4,n<6"));
        assert!(m("app=web,tier in (front)"));
        assert!(!m("app=web,tier in (back)"));
    }

    #[test]
    fn label_selector_rejects_garbage() {
        for s in [
            "app=(",
            "app in web",
            "=x",
            "app=web,",
            "a b c",
            "app in (x",
            "app=in valid!",
        ] {
            assert!(LabelSelector::parse(s).is_err(), "{s} should not parse");
        }
    }

    #[test]
    fn field_selector() {
        let o = obj(json!({}));
        let f = FieldSelector::parse("metadata.name=a,metadata.namespace!=x").unwrap();
        assert!(f.matches(&o));
        assert_eq!(f.exact_name(), Some("a"));
        assert!(!FieldSelector::parse("metadata.name=b").unwrap().matches(&o));
        assert!(FieldSelector::parse("spec.x=1").is_err());
        assert!(FieldSelector::parse("nonsense").is_err());
    }
}
