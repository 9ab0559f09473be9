//! OpenTelemetry (feature `opentelemetry`) against the real PostgreSQL: `emit` stores the
//! emitting span's trace context as W3C headers, and each delivery's span continues it after the
//! messaging semantic conventions, the emitter's child on the first attempt and a link to it on
//! retries.
//!
//! One subscriber serves the whole binary, set once: the relay's delivery tasks run on the
//! runtime's worker threads, which a thread-local default would not reach. Tests run in parallel
//! on it, so each picks its own spans out of the shared exporter by its event's id.

mod support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, TraceContextExt, TraceFlags, TraceId, TraceState,
    TracerProvider as _,
};
use opentelemetry::{Context, Value};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use outbox_runtime::{EmitOptions, EventContext, Relay};
use sqlx::PgPool;
use support::*;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use uuid::Uuid;

/// A caller's own trace context, set with `EmitOptions::header`.
const EXPLICIT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

/// The spans every test's code ended, exported as they end.
fn exporter() -> &'static InMemorySpanExporter {
    static EXPORTER: OnceLock<(InMemorySpanExporter, SdkTracerProvider)> = OnceLock::new();
    let (exporter, _) = EXPORTER.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        // The simple processor exports each span as it ends, so no test waits on a batch.
        let provider = SdkTracerProvider::builder().with_simple_exporter(exporter.clone()).build();
        let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("outbox-tests"));
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer))
            .expect("no other subscriber is set in this binary");
        // The provider is kept: dropping its last handle would shut it down.
        (exporter, provider)
    });
    exporter
}

/// A span of the test's own, with its OpenTelemetry span context.
fn emitting_span() -> (tracing::Span, SpanContext) {
    exporter();
    let span = tracing::info_span!("place_order");
    let context = span.context().span().span_context().clone();
    assert!(context.is_valid(), "the OpenTelemetry layer sees the test's spans");
    (span, context)
}

/// The delivery spans of `event_id` once `count` have ended, in attempt order.
async fn delivery_spans(event_id: Uuid, count: usize) -> Vec<SpanData> {
    let id = Value::from(event_id.to_string());
    let find = || {
        let mut spans: Vec<SpanData> = exporter()
            .get_finished_spans()
            .unwrap()
            .into_iter()
            .filter(|span| attribute(span, "messaging.message.id") == Some(&id))
            .collect();
        spans.sort_by_key(|span| attribute(span, "delivery").map(Value::to_string));
        spans
    };
    // The row is acknowledged as its delivery ends: the span can close a moment after.
    eventually("the delivery spans are exported", || async { find().len() >= count }).await;
    find()
}

fn attribute<'a>(span: &'a SpanData, key: &str) -> Option<&'a Value> {
    span.attributes.iter().find(|kv| kv.key.as_str() == key).map(|kv| &kv.value)
}

/// The headers stored with `event_id`.
async fn headers(pool: &PgPool, event_id: Uuid) -> serde_json::Value {
    sqlx::query_scalar("SELECT headers FROM outbox.events WHERE event_id = $1")
        .bind(event_id)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Emits `event` with `options` inside `span` and commits.
async fn emit_in(span: &tracing::Span, pool: &PgPool, options: EmitOptions) -> Uuid {
    commit_with(pool, &placed(1), options).instrument(span.clone()).await
}

async fn succeed(_: EventContext, _: OrderPlaced) -> Result<(), HandlerError> {
    Ok(())
}

/// Fails each event's first delivery.
async fn fail_once(ctx: EventContext<Arc<AtomicU32>>, _: OrderPlaced) -> Result<(), HandlerError> {
    if ctx.state().fetch_add(1, Ordering::SeqCst) == 0 {
        return Err(HandlerError("the first delivery fails".into()));
    }
    Ok(())
}

fn traceparent(context: &SpanContext) -> String {
    format!("00-{}-{}-01", context.trace_id(), context.span_id())
}

#[sqlx::test(migrations = false)]
async fn every_emit_stores_the_current_span_trace_context(pool: PgPool) {
    migrated(&pool).await;
    exporter();
    // A span continuing a remote caller's trace, so it carries a `tracestate` to store.
    let caller = SpanContext::new(
        TraceId::from(Uuid::new_v4().as_u128()),
        SpanId::from(fastrand::u64(1..)),
        TraceFlags::SAMPLED,
        true,
        TraceState::from_key_value([("vendor", "opaque")]).unwrap(),
    );
    let span = tracing::info_span!("place_order");
    span.set_parent(Context::new().with_remote_span_context(caller.clone())).unwrap();
    let emitter = span.context().span().span_context().clone();
    assert_eq!(emitter.trace_id(), caller.trace_id());

    let one = emit_in(&span, &pool, EmitOptions::new().header("request_id", "req-1")).await;
    let batch = async {
        let mut tx = pool.begin().await.unwrap();
        let ids = outbox_runtime::emit_all(&mut tx, &[placed(2), placed(3)]).await.unwrap();
        tx.commit().await.unwrap();
        ids
    }
    .instrument(span.clone())
    .await;

    for id in [one].into_iter().chain(batch) {
        let stored = headers(&pool, id).await;
        assert_eq!(stored["traceparent"], traceparent(&emitter), "{stored}");
        assert_eq!(stored["tracestate"], "vendor=opaque", "{stored}");
    }
    assert_eq!(headers(&pool, one).await["request_id"], "req-1", "the caller's headers stay");
}

#[sqlx::test(migrations = false)]
async fn an_emit_outside_any_span_stores_no_trace_context(pool: PgPool) {
    migrated(&pool).await;
    exporter();
    let id = commit_with(&pool, &placed(1), EmitOptions::new()).await;
    assert_eq!(headers(&pool, id).await, serde_json::json!({}));
}

#[sqlx::test(migrations = false)]
async fn the_first_delivery_is_a_consumer_child_of_the_emitter(pool: PgPool) {
    migrated(&pool).await;
    let (span, emitter) = emitting_span();
    let id = emit_in(&span, &pool, EmitOptions::new()).await;
    assert_eq!(headers(&pool, id).await.get("tracestate"), None, "an empty tracestate is left out");

    deliver(&pool, fast(Relay::builder(pool.clone())).handler(succeed), id).await;
    let spans = delivery_spans(id, 1).await;
    assert_eq!(spans.len(), 1);
    let delivery = &spans[0];
    assert_eq!(delivery.span_context.trace_id(), emitter.trace_id(), "in the emitter's trace");
    assert_eq!(delivery.parent_span_id, emitter.span_id(), "a child of the emitting span");
    assert!(delivery.links.is_empty(), "its parent needs no link too");
    assert_eq!(delivery.span_kind, SpanKind::Consumer);
    assert_eq!(delivery.name, "process order.order.placed");
    let expected = [
        ("messaging.system", Value::from("outbox")),
        ("messaging.operation.name", Value::from("process")),
        ("messaging.operation.type", Value::from("process")),
        ("messaging.message.id", Value::from(id.to_string())),
        ("messaging.destination.name", Value::from("order.order.placed")),
        ("event_id", Value::from(id.to_string())),
        ("event_type", Value::from("order.placed")),
        ("delivery", Value::from(1_i64)),
        ("traceparent", Value::from(traceparent(&emitter))),
    ];
    for (key, value) in expected {
        assert_eq!(attribute(delivery, key), Some(&value), "{key}");
    }
}

#[sqlx::test(migrations = false)]
async fn a_retry_links_to_the_emitter_instead_of_continuing_its_trace(pool: PgPool) {
    migrated(&pool).await;
    let (span, emitter) = emitting_span();
    let id = emit_in(&span, &pool, EmitOptions::new()).await;

    let builder = fast(Relay::builder(pool.clone())).state(Arc::new(AtomicU32::new(0)));
    deliver(&pool, builder.handler(fail_once), id).await;
    let spans = delivery_spans(id, 2).await;
    let [first, retry] = &spans[..] else { panic!("two delivery spans, got {}", spans.len()) };

    assert_eq!(attribute(first, "delivery"), Some(&Value::from(1_i64)));
    assert_eq!(first.parent_span_id, emitter.span_id(), "the first attempt is the emitter's child");

    assert_eq!(attribute(retry, "delivery"), Some(&Value::from(2_i64)));
    assert_ne!(retry.span_context.trace_id(), emitter.trace_id(), "a retry starts its own trace");
    assert_ne!(retry.parent_span_id, emitter.span_id());
    let links: Vec<_> = retry.links.iter().map(|link| &link.span_context).collect();
    assert_eq!(links.len(), 1, "one link");
    assert_eq!(links[0].trace_id(), emitter.trace_id());
    assert_eq!(links[0].span_id(), emitter.span_id());
    assert_eq!(retry.span_kind, SpanKind::Consumer);
}

#[sqlx::test(migrations = false)]
async fn a_trace_context_set_by_the_caller_is_kept(pool: PgPool) {
    migrated(&pool).await;
    let (span, _) = emitting_span();
    let id = emit_in(&span, &pool, EmitOptions::new().header("traceparent", EXPLICIT)).await;
    let stored = headers(&pool, id).await;
    assert_eq!(stored, serde_json::json!({ "traceparent": EXPLICIT }), "nothing of the span added");

    // And the delivery continues the caller's trace, not the span's.
    deliver(&pool, fast(Relay::builder(pool.clone())).handler(succeed), id).await;
    let delivery = &delivery_spans(id, 1).await[0];
    assert_eq!(delivery.span_context.trace_id().to_string(), "0af7651916cd43dd8448eb211c80319c");
    assert_eq!(delivery.parent_span_id.to_string(), "b7ad6b7169203331");
}
