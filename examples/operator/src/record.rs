//! `run --record-reconciles FILE`: a tracing layer that appends, one line each, every reconcile's start
//! and end (the runtime's `reconcile` span) and every shard this replica acquires or loses, with the
//! wall-clock time in microseconds. The sharding process test reads the files of all replicas
//! to prove that no two reconciles of one object overlapped and that each replica ran only objects
//! of shards it held.
//!
//! ```text
//! 1732550400123456 start 7 Cluster default/c-12
//! 1732550400125001 end 7
//! 1732550400100000 acquire 3
//! 1732550402100000 lose 3
//! ```
//!
//! The number after `start`/`end` is the span's id; ids are reused once a span closed, so a
//! reader pairs each `end` with the latest `start` of its id, in file order.
//!
//! Lines are written unbuffered (one `write` each, appending), so a replica killed with
//! SIGKILL leaves every line it had written.

use std::fmt::Write as _;
use std::fs::File;
use std::io::Write as _;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Event, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// The layer; see the module docs.
pub struct ReconcileRecorder {
    file: Mutex<File>,
}

impl ReconcileRecorder {
    pub fn create(path: &std::path::Path) -> std::io::Result<Self> {
        let file = File::options().create(true).append(true).open(path)?;
        Ok(Self {
            file: Mutex::new(file),
        })
    }

    fn line(&self, text: std::fmt::Arguments<'_>) {
        let micros = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_micros();
        let line = format!("{micros} {text}\n");
        let mut f = self.file.lock().unwrap_or_else(|e| e.into_inner());
        let _ = f.write_all(line.as_bytes());
    }
}

/// The fields of a reconcile span or a shard event, as text.
#[derive(Default)]
struct Fields {
    kind: String,
    namespace: String,
    name: String,
    message: String,
    shard: Option<u64>,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let mut s = String::new();
        let _ = write!(s, "{value:?}");
        match field.name() {
            "kind" => self.kind = s,
            "namespace" => self.namespace = s.trim_matches('"').to_string(),
            "name" => self.name = s,
            "message" => self.message = s,
            _ => {}
        }
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "namespace" => self.namespace = value.to_string(),
            "message" => self.message = value.to_string(),
            _ => self.record_debug(field, &value),
        }
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "shard" {
            self.shard = Some(value);
        }
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        if field.name() == "shard" {
            self.shard = u64::try_from(value).ok();
        }
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for ReconcileRecorder {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
        if attrs.metadata().name() != "reconcile"
            || !attrs.metadata().target().starts_with("actorcile")
        {
            return;
        }
        let mut f = Fields::default();
        attrs.record(&mut f);
        let key = match f.namespace.as_str() {
            "" => f.name,
            ns => format!("{ns}/{}", f.name),
        };
        self.line(format_args!("start {} {} {key}", id.into_u64(), f.kind));
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        if ctx.span(&id).is_some_and(|s| {
            s.name() == "reconcile" && s.metadata().target().starts_with("actorcile")
        }) {
            self.line(format_args!("end {}", id.into_u64()));
        }
    }

    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        if !event.metadata().target().starts_with("actorcile::sharding") {
            return;
        }
        let mut f = Fields::default();
        event.record(&mut f);
        let Some(shard) = f.shard else { return };
        if f.message.starts_with("acquired shard") {
            self.line(format_args!("acquire {shard}"));
        } else if f.message.starts_with("shard no longer held") {
            self.line(format_args!("lose {shard}"));
        }
    }
}
