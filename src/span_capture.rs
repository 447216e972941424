//! The spans a test's code opened, with their fields and parents (a tracing layer that keeps
//! them), for tests of what the runtime's spans carry.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::prelude::*;
use tracing_subscriber::registry::LookupSpan;

/// One span: its name, its fields as text, and its parent's name.
#[derive(Clone, Debug, Default)]
pub(crate) struct Captured {
    pub name: String,
    pub fields: BTreeMap<String, String>,
    pub parent: Option<String>,
}

impl Captured {
    pub(crate) fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
}

/// The spans opened while the guard of [`Spans::capture`] lives, in the order they opened.
#[derive(Clone, Default)]
pub(crate) struct Spans(Arc<Mutex<Vec<Captured>>>);

struct Index(usize);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().into(), format!("{value:?}"));
    }
}

impl Spans {
    /// Capture this thread's spans (a current-thread runtime's tasks included) until the
    /// guard drops.
    pub(crate) fn capture(&self) -> tracing::subscriber::DefaultGuard {
        tracing::subscriber::set_default(tracing_subscriber::registry().with(self.clone()))
    }

    /// Every span named `name`, in the order they opened.
    pub(crate) fn named(&self, name: &str) -> Vec<Captured> {
        let spans = self.0.lock().unwrap();
        spans.iter().filter(|s| s.name == name).cloned().collect()
    }
}

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Spans {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, cx: Context<'_, S>) {
        let mut c = Captured {
            name: attrs.metadata().name().into(),
            ..Captured::default()
        };
        attrs.record(&mut Fields(&mut c.fields));
        c.parent = cx
            .span(id)
            .and_then(|s| s.parent())
            .map(|p| p.name().into());
        let mut spans = self.0.lock().unwrap();
        if let Some(span) = cx.span(id) {
            span.extensions_mut().insert(Index(spans.len()));
        }
        spans.push(c);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, cx: Context<'_, S>) {
        let Some(span) = cx.span(id) else { return };
        let Some(i) = span.extensions().get::<Index>().map(|i| i.0) else {
            return;
        };
        let mut spans = self.0.lock().unwrap();
        values.record(&mut Fields(&mut spans[i].fields));
    }
}
