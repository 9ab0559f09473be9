//! A payload `emit` accepts reaches the handler's type unchanged, through `jsonb` and the relay's
//! decoder; a payload the relay could not decode is refused at `emit`; a payload that no longer
//! fits the handler's type fails naming the field.
//!
//! The edges: `jsonb` stores numbers as `numeric` and prints them in plain decimal (`f64::MAX` as
//! a 309-digit integer, `5e-324` with 324 decimals, `-0.0` as `0.0`), and `serde_json`'s decoder
//! refuses arrays and objects nested deeper than 127 levels, which its encoder and `jsonb` take.

mod support;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use outbox_runtime::{
    emit, emit_with, EmitOptions, Error, EventContext, InvalidEvent, OutboxEvent, Relay,
    RelayBuilder,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sqlx::PgPool;
use support::*;
use uuid::Uuid;

/// The deepest nesting of arrays and objects the relay decodes; a payload's own object is one.
const LIMIT: usize = 127;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "sample", event_type = "sample.taken")]
struct Sample {
    #[outbox(id)]
    id: u64,
    doubles: Vec<f64>,
    singles: Vec<f32>,
    maybe: Option<f64>,
    signed: i64,
    unsigned: u64,
    wide: i128,
    unsigned_wide: u128,
    text: String,
    by_name: BTreeMap<String, Vec<Option<f64>>>,
    /// Arrays and objects nested inside the payload's own object.
    deep: Value,
}

impl Sample {
    fn plain(id: u64) -> Sample {
        Sample {
            id,
            doubles: vec![],
            singles: vec![],
            maybe: None,
            signed: 0,
            unsigned: 0,
            wide: 0,
            unsigned_wide: 0,
            text: String::new(),
            by_name: BTreeMap::new(),
            deep: Value::Null,
        }
    }
}

/// `levels` arrays, one inside the other.
fn nested(levels: usize) -> Value {
    nested_as(std::iter::repeat_n(false, levels))
}

/// Arrays and objects (`true`), one inside the other, the first innermost.
fn nested_as(shape: impl IntoIterator<Item = bool>) -> Value {
    shape.into_iter().fold(json!("leaf"), |inner, object| {
        if object {
            json!({ "k": inner })
        } else {
            json!([inner])
        }
    })
}

const EXTREME_F64: [f64; 18] = [
    f64::MAX,
    f64::MIN,
    f64::MIN_POSITIVE,
    -f64::MIN_POSITIVE,
    5e-324, // the smallest subnormal
    -5e-324,
    2.225_073_858_507_201e-308, // the largest subnormal
    1e308,
    1e-300,
    0.1,
    0.0,
    -0.0,
    1e16,
    1e22,
    1e23,
    123_456_789_012_345_680_000.0,
    f32::MAX as f64,
    f32::MIN_POSITIVE as f64,
];

const EXTREME_F32: [f32; 8] =
    [f32::MAX, f32::MIN, f32::MIN_POSITIVE, 1e-45, -1e-45, 0.1, -0.0, 16_777_217.0];

/// Any finite `f64`: every sign and class, uniform bit patterns (mostly huge and tiny exponents,
/// the longest plain decimals `jsonb` prints), and the extremes.
fn finite_f64() -> impl Strategy<Value = f64> {
    use prop::num::f64::{NEGATIVE, NORMAL, POSITIVE, SUBNORMAL, ZERO};
    prop_oneof![
        POSITIVE | NEGATIVE | NORMAL | SUBNORMAL | ZERO,
        any::<u64>().prop_map(f64::from_bits).prop_filter("finite", |x| x.is_finite()),
        prop::sample::select(EXTREME_F64.to_vec()),
    ]
}

fn finite_f32() -> impl Strategy<Value = f32> {
    use prop::num::f32::{NEGATIVE, NORMAL, POSITIVE, SUBNORMAL, ZERO};
    prop_oneof![
        POSITIVE | NEGATIVE | NORMAL | SUBNORMAL | ZERO,
        any::<u32>().prop_map(f32::from_bits).prop_filter("finite", |x| x.is_finite()),
        prop::sample::select(EXTREME_F32.to_vec()),
    ]
}

/// Any Unicode text up to `max` characters, without NUL (which `emit` refuses; see `bad_input`).
fn unicode(max: usize) -> impl Strategy<Value = String> {
    prop::collection::vec(any::<char>().prop_filter("not NUL", |c| *c != '\0'), 0..max)
        .prop_map(String::from_iter)
}

fn sample() -> impl Strategy<Value = Sample> {
    let numbers = (
        prop::collection::vec(finite_f64(), 0..12),
        prop::collection::vec(finite_f32(), 0..6),
        prop::option::of(finite_f64()),
        prop_oneof![Just(i64::MIN), Just(i64::MAX), any::<i64>()],
        prop_oneof![Just(u64::MAX), any::<u64>()],
        prop_oneof![Just(i128::MIN), Just(i128::MAX), any::<i128>()],
        prop_oneof![Just(u128::MAX), any::<u128>()],
    );
    let text = prop_oneof![3 => unicode(200), 1 => unicode(20_000)];
    let by_name = prop::collection::btree_map(
        unicode(12),
        prop::collection::vec(prop::option::of(finite_f64()), 0..4),
        0..4,
    );
    // Up to one level past the limit: the payload's object plus `LIMIT` is refused.
    let depth = prop_oneof![1 => Just(LIMIT - 1), 1 => Just(LIMIT), 4 => 0..LIMIT - 1];
    let deep = depth.prop_flat_map(|levels| prop::collection::vec(any::<bool>(), levels));
    (any::<u64>(), numbers, text, by_name, deep).prop_map(
        |(
            id,
            (doubles, singles, maybe, signed, unsigned, wide, unsigned_wide),
            text,
            by_name,
            deep,
        )| {
            Sample {
                id,
                doubles,
                singles,
                maybe,
                signed,
                unsigned,
                wide,
                unsigned_wide,
                text,
                by_name,
                deep: nested_as(deep),
            }
        },
    )
}

/// How deep a sample's payload nests: its object, then the deepest of `deep`, the arrays (`[]`
/// counts as a level, for `serde_json`'s decoder as for `emit`) and the map of arrays.
fn depth_of(sample: &Sample) -> usize {
    fn levels(value: &Value) -> usize {
        match value {
            Value::Array(items) => 1 + items.iter().map(levels).max().unwrap_or(0),
            Value::Object(members) => 1 + members.values().map(levels).max().unwrap_or(0),
            _ => 0,
        }
    }
    let others = if sample.by_name.is_empty() { 1 } else { 2 };
    1 + levels(&sample.deep).max(others)
}

/// Emits `sample` and commits; reads the payload back as the relay does and decodes it into the
/// handler's type. The id of the row, or `None` if `emit` refused the sample as too deep.
async fn round_trip(pool: &PgPool, sample: &Sample) -> Result<Option<Uuid>, TestCaseError> {
    let mut tx = pool.begin().await.unwrap();
    match emit(&mut tx, sample).await {
        Ok(id) => {
            tx.commit().await.unwrap();
            prop_assert!(depth_of(sample) <= LIMIT, "emit accepted depth {}", depth_of(sample));
            let text: String =
                sqlx::query_scalar("SELECT payload::text FROM outbox.events WHERE event_id = $1")
                    .bind(id)
                    .fetch_one(pool)
                    .await
                    .unwrap();
            // The relay's decode is `serde_json::from_str` with this workspace's features.
            let decoded: Sample = serde_json::from_str(&text)
                .map_err(|error| TestCaseError::fail(format!("{error}, decoding {text}")))?;
            prop_assert_eq!(&decoded, sample);
            Ok(Some(id))
        }
        Err(Error::InvalidEvent {
            reason: InvalidEvent::TooDeep { what, depth, limit }, ..
        }) => {
            prop_assert_eq!((what, depth, limit), ("the payload", depth_of(sample), LIMIT));
            prop_assert!(depth > LIMIT);
            Ok(None)
        }
        Err(other) => Err(TestCaseError::fail(format!("emit refused a storable payload: {other}"))),
    }
}

type Seen = Arc<Mutex<Vec<(Uuid, Value, Sample)>>>;

/// A relay whose handler records every sample it decodes, with its headers.
fn recording(pool: &PgPool, seen: &Seen) -> RelayBuilder<Seen> {
    fast(Relay::builder(pool.clone())).state(seen.clone()).max_attempts(1).handler(
        |ctx: EventContext<Seen>, event: Sample| async move {
            ctx.state().lock().unwrap().push((ctx.event_id(), ctx.headers().clone(), event));
            Ok::<_, std::io::Error>(())
        },
    )
}

/// Runs `relay` until every row is published or dead; the last errors of the dead ones.
async fn drain(pool: &PgPool, relay: RelayBuilder<Seen>) -> Vec<String> {
    let relay = Running::start(relay);
    eventually("every event is published or dead", || async {
        let unsettled: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM outbox.events WHERE published_at IS NULL AND dead_at IS NULL",
        )
        .fetch_one(pool)
        .await
        .unwrap();
        unsettled == 0
    })
    .await;
    relay.stop().await;
    sqlx::query_scalar("SELECT last_error FROM outbox.events WHERE dead_at IS NOT NULL")
        .fetch_all(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrations = false)]
async fn every_payload_emit_accepts_reaches_the_handler_unchanged(pool: PgPool) {
    migrated(&pool).await;
    // proptest calls back synchronously: run it beside the test's runtime, blocking on it.
    let runtime = tokio::runtime::Handle::current();
    let producer = pool.clone();
    let accepted = tokio::task::spawn_blocking(move || {
        let config = Config { cases: 64, failure_persistence: None, ..Config::default() };
        let accepted = RefCell::new(Vec::new());
        TestRunner::new(config)
            .run(&sample(), |sample| {
                if let Some(id) = runtime.block_on(round_trip(&producer, &sample))? {
                    accepted.borrow_mut().push((id, sample));
                }
                Ok(())
            })
            .map_err(|failure| failure.to_string())?;
        Ok::<_, String>(accepted.into_inner())
    })
    .await
    .unwrap()
    .unwrap_or_else(|failure| panic!("{failure}"));
    assert!(accepted.len() >= 32, "most samples are within the limit: {}", accepted.len());

    // And the relay hands every one of them to the handler, equal.
    let seen = Seen::default();
    let failed = drain(&pool, recording(&pool, &seen)).await;
    assert_eq!(failed, Vec::<String>::new(), "no sample failed to decode");
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), accepted.len());
    for (id, sample) in &accepted {
        let (_, _, decoded) = seen.iter().find(|(seen_id, ..)| seen_id == id).unwrap();
        assert_eq!(decoded, sample);
    }
}

#[sqlx::test(migrations = false)]
async fn extreme_numbers_reach_the_handler_bit_for_bit(pool: PgPool) {
    migrated(&pool).await;
    let text = "é🦀\u{10FFFF}\u{1}\"\\ \u{2028}".repeat(5_000);
    let by_name = BTreeMap::from([
        ("ünïcode 🦀".to_owned(), vec![Some(f64::MAX), None, Some(-5e-324)]),
        (String::new(), vec![]),
    ]);
    let low = Sample {
        doubles: EXTREME_F64.to_vec(),
        singles: EXTREME_F32.to_vec(),
        maybe: Some(f64::MIN_POSITIVE),
        signed: i64::MIN,
        unsigned: u64::MAX,
        wide: i128::MIN,
        unsigned_wide: u128::MAX,
        text,
        by_name,
        deep: nested(LIMIT - 1),
        ..Sample::plain(1)
    };
    let high = Sample { signed: i64::MAX, wide: i128::MAX, maybe: Some(f64::MAX), ..low.clone() };
    let untyped = Sample { deep: json!([1e15, 1e16, -1e16, 1.8e19, 1e20]), ..Sample::plain(2) };
    let mut tx = pool.begin().await.unwrap();
    let ids = outbox_runtime::emit_all(&mut tx, [&low, &high, &untyped]).await.unwrap();
    tx.commit().await.unwrap();

    let seen = Seen::default();
    let failed = drain(&pool, recording(&pool, &seen)).await;
    assert_eq!(failed, Vec::<String>::new(), "every sample decodes");
    let seen = seen.lock().unwrap();
    for (id, sent) in ids.iter().zip([&low, &high]) {
        let (_, _, got) = seen.iter().find(|(seen_id, ..)| seen_id == id).unwrap();
        assert_eq!(got, sent);
        for (got, sent) in got.doubles.iter().zip(&sent.doubles) {
            // `numeric` has no negative zero: -0.0 comes back as 0.0, equal by `==`.
            let sent = if *sent == 0.0 { 0.0 } else { *sent };
            assert_eq!(got.to_bits(), sent.to_bits(), "{got:e} came back for {sent:e}");
        }
        for (got, sent) in got.singles.iter().zip(&sent.singles) {
            let sent = if *sent == 0.0 { 0.0 } else { *sent };
            assert_eq!(got.to_bits(), sent.to_bits(), "{got:e} came back for {sent:e}");
        }
    }
    // In a `Value`, the text `jsonb` printed decides the kind of number: a whole float from 1e16
    // up that fits 64 bits comes back as an integer, of the same value.
    let (_, _, got) = seen.iter().find(|(seen_id, ..)| *seen_id == ids[2]).unwrap();
    let integers = json!([
        1e15,
        10_000_000_000_000_000_u64,
        -10_000_000_000_000_000_i64,
        18_000_000_000_000_000_000_u64,
        1e20
    ]);
    assert_eq!(got.deep, integers);
    let as_f64 = |v: &Value| v.as_array().unwrap().iter().map(Value::as_f64).collect::<Vec<_>>();
    assert_eq!(as_f64(&got.deep), as_f64(&untyped.deep));
}

#[sqlx::test(migrations = false)]
async fn nesting_deeper_than_the_relay_decodes_is_refused_at_emit(pool: PgPool) {
    migrated(&pool).await;
    let mut tx = pool.begin().await.unwrap();
    let too_deep = Sample { deep: nested(LIMIT), ..Sample::plain(1) };
    match emit(&mut tx, &too_deep).await {
        Err(Error::InvalidEvent {
            event_type: "sample.taken",
            reason: InvalidEvent::TooDeep { what: "the payload", depth, limit },
        }) => assert_eq!((depth, limit), (LIMIT + 1, LIMIT)),
        other => panic!("expected TooDeep, got {other:?}"),
    }
    // The headers' object is the first level of a header.
    let deep_header = EmitOptions::new().header("trace", nested(LIMIT));
    match emit_with(&mut tx, &Sample::plain(2), deep_header).await {
        Err(Error::InvalidEvent {
            reason: InvalidEvent::TooDeep { what: "a header", .. }, ..
        }) => {}
        other => panic!("expected TooDeep, got {other:?}"),
    }

    // The transaction is still usable, and both at the limit are stored and delivered.
    let at_limit = Sample { deep: nested(LIMIT - 1), ..Sample::plain(3) };
    let header = EmitOptions::new().header("trace", nested(LIMIT - 1));
    let id = emit_with(&mut tx, &at_limit, header).await.unwrap();
    tx.commit().await.unwrap();
    let rows: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox.events").fetch_one(&pool).await.unwrap();
    assert_eq!(rows, 1, "nothing of the refused events was written");

    let seen = Seen::default();
    deliver(&pool, recording(&pool, &seen), id).await;
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].1, json!({ "trace": nested(LIMIT - 1) }));
    assert_eq!(seen[0].2, at_limit);
}

/// What a newer producer emits: a line's quantity may be a text.
#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "parcel", event_type = "parcel.packed")]
struct PackedByNewProducer {
    #[outbox(id)]
    parcel: u64,
    lines: Vec<LineByNewProducer>,
}

#[derive(Serialize, Deserialize)]
struct LineByNewProducer {
    sku: String,
    qty: Value,
}

/// What the handler still expects.
#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "parcel", event_type = "parcel.packed")]
struct Packed {
    #[outbox(id)]
    parcel: u64,
    lines: Vec<Line>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Line {
    sku: String,
    qty: u32,
}

#[sqlx::test(migrations = false)]
async fn a_payload_that_no_longer_fits_fails_naming_the_field(pool: PgPool) {
    migrated(&pool).await;
    let line = |sku: &str, qty: Value| LineByNewProducer { sku: sku.into(), qty };
    let event = PackedByNewProducer {
        parcel: 7,
        lines: vec![line("a", json!(1)), line("b", json!(2)), line("c", json!("heavy"))],
    };
    let mut tx = pool.begin().await.unwrap();
    let id = emit(&mut tx, &event).await.unwrap();
    tx.commit().await.unwrap();

    let relay = Running::start(
        fast(Relay::builder(pool.clone()))
            .handler(|_: EventContext<()>, _: Packed| async { Ok::<_, std::io::Error>(()) })
            .max_attempts(1),
    );
    eventually("the event is dead", || async { row_state(&pool, id).await.dead }).await;
    relay.stop().await;
    assert_eq!(
        row_state(&pool, id).await.last_error.as_deref(),
        Some(
            "payload does not deserialize into `payloads::Packed` at `lines[2].qty`: \
             invalid type: string \"heavy\", expected u32"
        )
    );
}
