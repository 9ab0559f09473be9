//! The W3C trace context in the `headers` column: written by `emit`, read by the relay.
//!
//! Always W3C Trace Context (`traceparent`, `tracestate`), whatever propagator the application
//! installed globally (the default global one propagates nothing): the relay reads these two
//! headers back, forwarding passes them on to brokers under the same names, and consumers in
//! other languages read them with any OpenTelemetry SDK.

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{SpanContext, TraceContextExt};
use opentelemetry::Context;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use serde_json::{Map, Value};
use tracing_opentelemetry::OpenTelemetrySpanExt;

const TRACEPARENT: &str = "traceparent";
const TRACESTATE: &str = "tracestate";

/// Adds the current span's trace context to `headers`, unless the caller set a trace context.
///
/// The current span is `tracing`'s, bridged by `tracing-opentelemetry`; without one (or without
/// its layer) the OpenTelemetry context attached directly is used, and without that nothing is
/// added.
pub(crate) fn store_current_context(headers: &mut Map<String, Value>) {
    store_context(headers, current_context);
}

/// Adds the span context of `context()` to `headers`, unless they hold a trace context already;
/// nothing if it holds no valid span context.
fn store_context(headers: &mut Map<String, Value>, context: impl FnOnce() -> Context) {
    // The caller's own context wins, whole: a `tracestate` belongs to its `traceparent`'s trace
    // and must not be paired with another's.
    if headers.contains_key(TRACEPARENT) || headers.contains_key(TRACESTATE) {
        return;
    }
    TraceContextPropagator::new().inject_context(&context(), &mut Writer(headers));
}

fn current_context() -> Context {
    let context = tracing::Span::current().context();
    if context.has_active_span() {
        context
    } else {
        Context::current()
    }
}

/// The span context stored in `headers`, if they hold a valid `traceparent`.
pub(crate) fn stored_context(headers: &Value) -> Option<SpanContext> {
    // The relay's fast path: most rows carry no trace context.
    headers.get(TRACEPARENT)?;
    let context = TraceContextPropagator::new().extract(&Reader(headers));
    let stored = context.span().span_context().clone();
    stored.is_valid().then_some(stored)
}

/// A context whose span is the stored, remote `span`: the parent of a first delivery.
pub(crate) fn remote_parent(span: SpanContext) -> Context {
    Context::new().with_remote_span_context(span)
}

struct Writer<'a>(&'a mut Map<String, Value>);

impl Injector for Writer<'_> {
    fn set(&mut self, key: &str, value: String) {
        // The propagator writes an empty `tracestate` when there is none; W3C lets it be left
        // out, and forwarding would otherwise send an empty header.
        if !value.is_empty() {
            self.0.insert(key.to_owned(), Value::String(value));
        }
    }
}

struct Reader<'a>(&'a Value);

impl Extractor for Reader<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key)?.as_str()
    }

    fn keys(&self) -> Vec<&str> {
        self.0.as_object().map_or_else(Vec::new, |map| map.keys().map(String::as_str).collect())
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{SpanId, TraceFlags, TraceId, TraceState};
    use serde_json::json;

    use super::*;

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn span_context(state: TraceState) -> SpanContext {
        SpanContext::new(
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap(),
            SpanId::from_hex("00f067aa0ba902b7").unwrap(),
            TraceFlags::SAMPLED,
            true,
            state,
        )
    }

    fn stored(context: &Context) -> Value {
        let mut headers = Map::new();
        store_context(&mut headers, || context.clone());
        Value::Object(headers)
    }

    #[test]
    fn a_span_context_is_stored_as_w3c_headers() {
        let state = TraceState::from_key_value([("vendor", "opaque")]).unwrap();
        let context = remote_parent(span_context(state));
        assert_eq!(
            stored(&context),
            json!({ "traceparent": PARENT, "tracestate": "vendor=opaque" })
        );
    }

    #[test]
    fn an_empty_tracestate_is_left_out() {
        let context = remote_parent(span_context(TraceState::NONE));
        assert_eq!(stored(&context), json!({ "traceparent": PARENT }));
    }

    #[test]
    fn no_span_stores_nothing() {
        assert_eq!(stored(&Context::new()), json!({}));
    }

    #[test]
    fn a_trace_context_set_by_the_caller_wins() {
        let context = remote_parent(span_context(TraceState::NONE));
        for (name, value) in [(TRACEPARENT, "00-mine"), (TRACESTATE, "mine=1")] {
            let mut headers = Map::new();
            headers.insert(name.into(), value.into());
            let before = headers.clone();
            store_context(&mut headers, || context.clone());
            assert_eq!(headers, before, "{name} set by the caller");
        }
    }

    #[test]
    fn no_current_span_stores_nothing() {
        let mut headers = Map::new();
        store_current_context(&mut headers);
        assert!(headers.is_empty());
    }

    #[test]
    fn stored_headers_read_back_as_the_span_context() {
        let state = TraceState::from_key_value([("vendor", "opaque")]).unwrap();
        let headers = stored(&remote_parent(span_context(state.clone())));
        assert_eq!(stored_context(&headers), Some(span_context(state)));
    }

    #[test]
    fn malformed_or_missing_trace_context_reads_as_none() {
        for headers in [
            json!({}),
            json!(null),
            json!({ "traceparent": 7 }),
            json!({ "traceparent": "not a traceparent" }),
            json!({ "traceparent": "00-00000000000000000000000000000000-0000000000000000-01" }),
            json!({ "tracestate": "vendor=opaque" }),
        ] {
            assert_eq!(stored_context(&headers), None, "{headers}");
        }
    }
}
