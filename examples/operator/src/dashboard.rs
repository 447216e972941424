//! The operator's Grafana dashboard (`chart/files/dashboard.json`), generated from the panels
//! below (`example-operator chart-dashboard`): a panel per question an SRE asks first, each a
//! PromQL query of the runtime's metrics. The chart test checks the file against this code and
//! every metric a query names against a real scrape of the running operator.

use serde_json::{Value, json};

/// One panel: its title, its unit (Grafana's), and its queries with their legends.
pub struct Panel {
    pub title: &'static str,
    pub unit: &'static str,
    pub queries: &'static [(&'static str, &'static str)],
}

/// The selector every query carries: the dashboard's namespace and job variables.
const SEL: &str = r#"namespace="$namespace", job="$job""#;

/// The panels, in rows of two.
pub fn panels() -> Vec<Panel> {
    vec![
        Panel {
            title: "Reconciles per second, by result",
            unit: "ops",
            queries: &[(
                "sum by (controller, result) (rate(actorcile_reconciles_total{SEL}[5m]))",
                "{{controller}} {{result}}",
            )],
        },
        Panel {
            title: "Reconcile duration (p50, p99)",
            unit: "s",
            queries: &[
                (
                    "histogram_quantile(0.5, sum by (controller, le) (rate(actorcile_reconcile_duration_seconds_bucket{SEL}[5m])))",
                    "{{controller}} p50",
                ),
                (
                    "histogram_quantile(0.99, sum by (controller, le) (rate(actorcile_reconcile_duration_seconds_bucket{SEL}[5m])))",
                    "{{controller}} p99",
                ),
            ],
        },
        Panel {
            title: "Queue: waiting for a slot, running, slots",
            unit: "short",
            queries: &[
                (
                    "sum by (controller) (actorcile_reconciles_waiting{SEL})",
                    "{{controller}} waiting",
                ),
                (
                    "sum by (controller) (actorcile_reconciles_running{SEL})",
                    "{{controller}} running",
                ),
                ("sum(actorcile_max_concurrent_reconciles{SEL})", "slots"),
            ],
        },
        Panel {
            title: "Wait for a slot (p99) and the longest-running reconcile",
            unit: "s",
            queries: &[
                (
                    "histogram_quantile(0.99, sum by (controller, le) (rate(actorcile_reconcile_wait_seconds_bucket{SEL}[5m])))",
                    "{{controller}} wait p99",
                ),
                (
                    "max by (controller) (actorcile_reconcile_longest_running_seconds{SEL})",
                    "{{controller}} longest running",
                ),
            ],
        },
        Panel {
            title: "API requests per second, by verb and code",
            unit: "reqps",
            queries: &[(
                "sum by (verb, code) (rate(actorcile_api_requests_total{SEL}[5m]))",
                "{{verb}} {{code}}",
            )],
        },
        Panel {
            title: "API request latency (p99), by verb and resource",
            unit: "s",
            queries: &[(
                r#"histogram_quantile(0.99, sum by (verb, resource, le) (rate(actorcile_api_request_duration_seconds_bucket{SEL, verb!="watch"}[5m])))"#,
                "{{verb}} {{resource}}",
            )],
        },
        Panel {
            title: "Objects cached and live actors",
            unit: "short",
            queries: &[
                (
                    "sum by (controller) (actorcile_objects{SEL})",
                    "{{controller}} objects",
                ),
                ("sum(actorcile_actors_live{SEL})", "live actors"),
            ],
        },
        Panel {
            title: "Trouble: failed reconciles, quarantines, refused status writes, watch restarts",
            unit: "ops",
            queries: &[
                (
                    r#"sum by (controller) (rate(actorcile_reconciles_total{SEL, result="failed"}[5m]))"#,
                    "{{controller}} failed",
                ),
                (
                    "sum(rate(actorcile_quarantined_total{SEL}[5m]))",
                    "quarantined",
                ),
                (
                    "sum(rate(actorcile_status_rejected_total{SEL}[5m]))",
                    "status refused",
                ),
                (
                    "sum(rate(actorcile_watch_restarts_total{SEL}[5m]))",
                    "watch restarts",
                ),
            ],
        },
        Panel {
            title: "CPU (cores) by pod",
            unit: "short",
            queries: &[(
                "sum by (pod) (rate(process_cpu_seconds_total{SEL}[5m]))",
                "{{pod}}",
            )],
        },
        Panel {
            title: "Resident memory and open file descriptors by pod",
            unit: "bytes",
            queries: &[
                (
                    "sum by (pod) (process_resident_memory_bytes{SEL})",
                    "{{pod}} resident",
                ),
                ("sum by (pod) (process_open_fds{SEL})", "{{pod}} open fds"),
            ],
        },
        Panel {
            title: "Leader and shards held, by pod",
            unit: "short",
            queries: &[
                ("max by (pod) (actorcile_leader{SEL})", "{{pod}} leads"),
                (
                    "max by (pod) (actorcile_shards_held{SEL})",
                    "{{pod}} shards held",
                ),
            ],
        },
        Panel {
            title: "Watches: kinds listed, watch tasks down",
            unit: "short",
            queries: &[
                (
                    "min by (controller) (actorcile_kind_synced{SEL})",
                    "{{controller}} synced",
                ),
                ("sum(actorcile_watches_down{SEL})", "watches down"),
            ],
        },
    ]
}

/// A query with the dashboard's selector in place of `SEL`.
pub fn expr(query: &str) -> String {
    query.replace("SEL", SEL)
}

/// The dashboard, as Grafana's JSON model.
pub fn dashboard() -> Value {
    let panels: Vec<Value> = panels()
        .iter()
        .enumerate()
        .map(|(i, p)| {
            json!({
                "id": i + 1,
                "type": "timeseries",
                "title": p.title,
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "gridPos": {"h": 8, "w": 12, "x": (i % 2) * 12, "y": (i / 2) * 8},
                "fieldConfig": {"defaults": {"unit": p.unit}, "overrides": []},
                "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
                "targets": p.queries.iter().enumerate().map(|(j, (q, legend))| json!({
                    "refId": char::from(b'A' + j as u8).to_string(),
                    "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    "expr": expr(q),
                    "legendFormat": legend,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    let variable = |name: &str, query: &str| {
        json!({
            "name": name,
            "type": "query",
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "query": {"query": query, "refId": name},
            "definition": query,
            "refresh": 2,
        })
    };
    json!({
        "title": "example-operator",
        "uid": "example-operator",
        "tags": ["actorcile", "operator"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus"},
            variable("namespace", "label_values(actorcile_build_info, namespace)"),
            variable("job", r#"label_values(actorcile_build_info{namespace="$namespace"}, job)"#),
        ]},
        "panels": panels,
    })
}

/// The file `chart/files/dashboard.json`.
pub fn to_json() -> String {
    let mut text = serde_json::to_string_pretty(&dashboard()).expect("JSON of JSON values");
    text.push('\n');
    text
}

/// The metric names (as a scrape shows them: `_total`, `_bucket`) each query of the dashboard
/// reads.
pub fn metrics_read() -> Vec<String> {
    let mut names: Vec<String> = panels()
        .iter()
        .flat_map(|p| p.queries.iter())
        .flat_map(|(q, _)| metric_names(q))
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The metric names in a query: the words of the runtime's prefixes (`actorcile_`, `process_`).
pub fn metric_names(query: &str) -> Vec<String> {
    query
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|w| w.starts_with("actorcile_") || w.starts_with("process_"))
        .map(str::to_string)
        .collect()
}
