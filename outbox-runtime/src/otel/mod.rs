//! The delivery span, and with the `opentelemetry` feature the trace context that links it to
//! the code that emitted its event.
//!
//! With the feature, `emit` stores the OpenTelemetry context of the caller's current `tracing`
//! span as W3C `traceparent` and `tracestate` headers (module `headers`), and each delivery's span
//! follows OpenTelemetry's messaging semantic conventions: a `consumer` span named
//! `process {aggregate_type}.{event_type}`. The
//! stored context is the parent of the first delivery's span and only a link from a retry's, as
//! the conventions recommend for redeliveries: a retry minutes later is its own unit of work,
//! and parenting it would stretch the emitter's trace over every backoff.
//!
//! Without the feature the span is the plain `outbox.deliver` span with the row's fields, and no
//! OpenTelemetry crate is compiled.

#[cfg(feature = "opentelemetry")]
mod headers;

use tracing::Span;

use crate::store::LeasedEvent;

#[cfg(feature = "opentelemetry")]
pub(crate) use headers::store_current_context;

/// The span a delivery of `row` runs in.
#[cfg(not(feature = "opentelemetry"))]
pub(crate) fn delivery_span(row: &LeasedEvent, delivery: u32) -> Span {
    tracing::info_span!(
        "outbox.deliver",
        event_id = %row.event_id,
        aggregate_type = %row.aggregate_type,
        aggregate_id = %row.aggregate_id,
        event_type = %row.event_type,
        delivery,
        traceparent = row.headers.get("traceparent").and_then(|v| v.as_str()),
    )
}

/// The span a delivery of `row` runs in, after the messaging semantic conventions, continuing
/// the trace context stored with the row (see the module docs).
#[cfg(feature = "opentelemetry")]
pub(crate) fn delivery_span(row: &LeasedEvent, delivery: u32) -> Span {
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    // The destination forwarding uses by default, so a forwarded message and its processing
    // span carry one name. Both parts are bounded sets, as a span name must be.
    let destination = format!("{}.{}", row.aggregate_type, row.event_type);
    let span = tracing::info_span!(
        "outbox.deliver",
        otel.name = format!("process {destination}").as_str(),
        otel.kind = "consumer",
        messaging.system = "outbox",
        messaging.operation.name = "process",
        messaging.operation.type = "process",
        messaging.message.id = %row.event_id,
        messaging.destination.name = destination.as_str(),
        event_id = %row.event_id,
        aggregate_type = %row.aggregate_type,
        aggregate_id = %row.aggregate_id,
        event_type = %row.event_type,
        // `tracing-opentelemetry` records unsigned integers as text; `i64` stays a number.
        delivery = i64::from(delivery),
        traceparent = row.headers.get("traceparent").and_then(|v| v.as_str()),
    );
    // Before the span is first entered: once started, its parent is fixed.
    if let Some(stored) = headers::stored_context(&row.headers) {
        if delivery == 1 {
            // Fails only when no OpenTelemetry layer sees the span: then there is no trace to
            // continue.
            let _ = span.set_parent(headers::remote_parent(stored));
        } else {
            span.add_link(stored);
        }
    }
    span
}
