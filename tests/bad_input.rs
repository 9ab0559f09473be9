//! Bad input against the real PostgreSQL: a 10 MB payload, SQL-looking and unusual Unicode strings
//! in every string the API takes, hand-written rows with garbage JSON or unknown types, NUL
//! characters and failing `Serialize` impls. Each is stored verbatim or refused with a typed
//! error, and nothing is ever half-written.
//!
//! Every statement of the runtime is a constant (`outbox-runtime/src/store/`, plus the two in
//! `migrate.rs`) with every value bound, and the schema and table names are fixed, so there is no
//! identifier to inject through; these tests check that the values really travel as data.

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_runtime::dead_letters::{self, DeadFilter};
use outbox_runtime::{
    emit, emit_all, emit_all_with, emit_idempotent, emit_with, EmitOptions, Emitted, Error,
    EventContext, InvalidEvent, OutboxEvent, Relay, UnknownEvents,
};
use serde::{Deserialize, Serialize, Serializer};
use serde_json::{Map, Value};
use sqlx::PgPool;
use support::*;
use uuid::Uuid;

/// An error and its causes, `: `-separated, as error-chain printers show it.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The SQLSTATE of a database error.
fn sqlstate(error: &sqlx::Error) -> Option<String> {
    match error {
        sqlx::Error::Database(db) => db.code().map(|code| code.into_owned()),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------------
// A 10 MB payload
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "blob", event_type = "blob.stored")]
struct BlobStored {
    #[outbox(id)]
    blob: u32,
    data: String,
    numbers: Vec<u64>,
}

const TEN_MIB: usize = 10 * 1024 * 1024;

/// 10 MiB of varied text, JSON's special characters included (they are escaped, so the JSON text
/// is larger still), plus 100,000 numbers.
fn ten_megabytes() -> BlobStored {
    const ALPHABET: &[u8] =
        b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 \"\\'{}[],:/\n\t";
    let data: String =
        (0..TEN_MIB).map(|i| ALPHABET[(i * 7 + i / 1013) % ALPHABET.len()] as char).collect();
    let numbers = (0..100_000_u64).map(|n| n * n * 7919).collect();
    BlobStored { blob: 1, data, numbers }
}

#[sqlx::test(migrations = false)]
async fn a_ten_megabyte_payload_round_trips_through_emit_and_the_relay(pool: PgPool) {
    migrated(&pool).await;
    let event = ten_megabytes();
    assert_eq!(event.data.len(), TEN_MIB);

    let mut tx = pool.begin().await.unwrap();
    let id = emit(&mut tx, &event).await.expect("a 10 MB payload is accepted");
    tx.commit().await.unwrap();

    let (text_bytes, stored_bytes): (i32, i32) = sqlx::query_as(
        "SELECT octet_length(payload::text), pg_column_size(payload) FROM outbox.events \
         WHERE event_id = $1",
    )
    .bind(id)
    .fetch_one(&pool)
    .await
    .unwrap();
    println!("10 MiB payload: {text_bytes} bytes of JSON text, {stored_bytes} bytes stored");
    assert!(text_bytes as usize > TEN_MIB, "the whole payload is stored: {text_bytes} bytes");

    type SeenBlob = Arc<Mutex<Option<BlobStored>>>;
    let seen: SeenBlob = Arc::default();
    let relay = Running::start(fast(Relay::builder(pool.clone())).state(seen.clone()).handler(
        |ctx: EventContext<SeenBlob>, event: BlobStored| async move {
            *ctx.state().lock().unwrap() = Some(event);
            Ok::<_, std::io::Error>(())
        },
    ));
    eventually("the 10 MB event is published", || async { row_state(&pool, id).await.published })
        .await;
    let counts = relay.stop().await;
    assert_eq!((counts.delivered, counts.failed), (1, 0));

    let got = seen.lock().unwrap().take().expect("the handler ran");
    // Not assert_eq: a failure would print 20 MB.
    assert_eq!(got.data.len(), event.data.len());
    assert!(got.data == event.data, "the 10 MiB string reached the handler intact");
    assert!(got.numbers == event.numbers && got.blob == event.blob, "the rest did too");
}

// ---------------------------------------------------------------------------------------------
// SQL-looking and unusual strings in every string emit takes
// ---------------------------------------------------------------------------------------------

/// Strings that would break a statement built by formatting: quotes, comments, placeholders,
/// dollar quoting, escapes, backslashes; none holds a NUL.
const SQL_LOOKING: &[&str] = &[
    "'; DROP TABLE outbox.events; --",
    "\"; DROP TABLE outbox.events; --",
    "' OR '1'='1",
    "') OR ('a'='a",
    "1; DELETE FROM outbox.events WHERE true",
    "; COMMIT; DROP SCHEMA outbox CASCADE; BEGIN;",
    "$1",
    "$2::text, $3",
    "?",
    "$$; TRUNCATE outbox.events; $$",
    "$tag$ ' $tag$",
    "E'\\x27'; DROP TABLE outbox.events; --",
    "\\'; DROP TABLE outbox.events; --",
    "\\\\'\\''\\\\\\",
    "'''''",
    "\\",
    "\\u0000 is six characters here, not a NUL",
    "\\\\u0000",
    "*/ SELECT pg_sleep(10); /*",
    "'); NOTIFY outbox_events; --",
    "%s %I %L %% {} {0}",
    "\"quoted\" \\\"escaped\\\" `ticks`",
    "-- a comment",
    "",
];

/// Unicode that must come back byte for byte: other scripts, emoji and ZWJ sequences,
/// right-to-left text and overrides, combining marks (not normalized), invisible characters,
/// the highest code point, control characters, and text that only looks like bytes or escapes.
const UNUSUAL: &[&str] = &[
    "Zürich Straße",
    "日本語のテキスト",
    "🦀🚀 👩‍👩‍👧‍👦 🏳️‍🌈",
    "مرحبا بالعالم",
    "שלום עולם",
    "\u{202E}fdp.exe\u{202C} right-to-left override",
    "e\u{301} is not \u{e9}",
    "\u{FEFF}byte order mark",
    "zero\u{200B}width\u{200D}joiner",
    "\u{FFFD} replacement character",
    "\u{10FFFF}\u{E000} highest code point, private use",
    "line\u{2028}separator\u{2029}paragraph",
    "controls \u{1}\u{8}\u{b}\u{c}\u{1b}\u{7f}\u{80}\u{9f}",
    "tab\tnewline\ncarriage return\r",
    "Ã©Ã¨ mojibake",
    "\\xff\\xfe\\x00 looks like bytes",
    "\\ud800 a lone surrogate escape, as plain text",
];

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "note", event_type = "note.written")]
struct NoteWritten {
    /// The aggregate id, through the derive's `Display`.
    #[outbox(id)]
    note: String,
    text: String,
    fields: BTreeMap<String, String>,
    lines: Vec<String>,
}

/// `s` as the aggregate id, a payload string, a payload map key and value, and list items.
fn note(s: &str) -> NoteWritten {
    NoteWritten {
        note: s.to_owned(),
        text: s.to_owned(),
        fields: BTreeMap::from([(s.to_owned(), s.to_owned()), ("k".to_owned(), s.to_owned())]),
        lines: vec![s.to_owned(), format!("{s}{s}")],
    }
}

/// The headers `emit_note` writes for `s`.
fn note_headers(s: &str, index: usize) -> Value {
    let mut headers = Map::new();
    headers.insert("index".to_owned(), index.into());
    headers.insert(s.to_owned(), s.into());
    Value::Object(headers)
}

/// Emits `note(s)` with `s` as a header name and value and as the idempotency key.
async fn emit_note(pool: &PgPool, s: &str, index: usize) -> Uuid {
    let options = EmitOptions::new().header("index", index).header(s, s);
    let mut tx = pool.begin().await.unwrap();
    let emitted = emit_idempotent(&mut tx, &note(s), s, options).await.unwrap();
    tx.commit().await.unwrap();
    assert!(emitted.is_written(), "{s:?}: {emitted:?}");
    emitted.event_id()
}

/// One delivery as the handler saw it.
#[derive(Debug, Clone)]
struct Delivered {
    event_id: Uuid,
    aggregate_id: String,
    headers: Value,
    event: NoteWritten,
}

type Seen = Arc<Mutex<Vec<Delivered>>>;

async fn record_note(ctx: EventContext<Seen>, event: NoteWritten) -> Result<(), std::io::Error> {
    let delivered = Delivered {
        event_id: ctx.event_id(),
        aggregate_id: ctx.aggregate_id().to_owned(),
        headers: ctx.headers().clone(),
        event,
    };
    ctx.state().lock().unwrap().push(delivered);
    Ok(())
}

/// Emits every string through every input emit takes, checks the rows hold them verbatim, that
/// a repeated idempotency key finds its event, and that a relay hands them back unchanged.
/// Returns the event ids, in `strings` order.
async fn round_trip(pool: &PgPool, strings: &[&str]) -> Vec<Uuid> {
    let before = count_rows(pool).await;
    let mut ids = Vec::new();
    for (index, s) in strings.iter().enumerate() {
        ids.push(emit_note(pool, s, index).await);
    }
    assert_eq!(count_rows(pool).await - before, strings.len() as i64);

    for (index, (s, id)) in strings.iter().zip(&ids).enumerate() {
        let stored: (String, Option<String>, Value, Value) = sqlx::query_as(
            "SELECT aggregate_id, idempotency_key, payload, headers FROM outbox.events \
             WHERE event_id = $1",
        )
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap();
        assert_eq!(stored.0, *s, "aggregate id stored verbatim");
        assert_eq!(stored.1.as_deref(), Some(*s), "idempotency key stored verbatim");
        assert_eq!(stored.2, serde_json::to_value(note(s)).unwrap(), "payload stored verbatim");
        assert_eq!(stored.3, note_headers(s, index), "headers stored verbatim");

        // Bound in a WHERE clause, the string matches exactly its own row.
        let matching: Vec<Uuid> = sqlx::query_scalar(
            "SELECT event_id FROM outbox.events WHERE aggregate_id = $1 AND payload->>'text' = $1",
        )
        .bind(s)
        .fetch_all(pool)
        .await
        .unwrap();
        assert_eq!(matching, [*id], "{s:?} matches its own row only");

        // The key is found again by emit's lookup, and nothing more is written.
        let mut tx = pool.begin().await.unwrap();
        let again = emit_idempotent(&mut tx, &note("other"), s, EmitOptions::new()).await;
        tx.commit().await.unwrap();
        assert_eq!(again.unwrap(), Emitted::Found(*id), "the key {s:?} names its first event");
    }
    assert_eq!(count_rows(pool).await - before, strings.len() as i64, "duplicates wrote nothing");

    let seen = Seen::default();
    let relay =
        Running::start(fast(Relay::builder(pool.clone())).state(seen.clone()).handler(record_note));
    eventually("every event is delivered", || async {
        seen.lock().unwrap().len() >= strings.len()
    })
    .await;
    relay.stop().await;

    let seen = seen.lock().unwrap().clone();
    for (index, (s, id)) in strings.iter().zip(&ids).enumerate() {
        let got: Vec<&Delivered> = seen.iter().filter(|d| d.event_id == *id).collect();
        assert_eq!(got.len(), 1, "{s:?} delivered once");
        assert_eq!(got[0].aggregate_id, *s, "the handler sees the aggregate id verbatim");
        assert_eq!(got[0].event, note(s), "the handler sees the payload verbatim");
        assert_eq!(got[0].headers, note_headers(s, index), "the handler sees the headers");
    }
    ids
}

/// Checks the schema, the table, its trigger and an unrelated table all survived.
async fn nothing_was_dropped(pool: &PgPool) {
    let (events, trigger, canary): (Option<String>, i64, i64) = sqlx::query_as(
        "SELECT to_regclass('outbox.events')::text, \
                (SELECT count(*) FROM pg_trigger WHERE tgname = 'events_notify_relays'), \
                (SELECT count(*) FROM canary)",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!((events.as_deref(), trigger, canary), (Some("outbox.events"), 1, 1));
}

async fn plant_canary(pool: &PgPool) {
    sqlx::raw_sql("CREATE TABLE canary (alive int); INSERT INTO canary VALUES (1);")
        .execute(pool)
        .await
        .unwrap();
}

#[sqlx::test(migrations = false)]
async fn sql_looking_strings_in_every_emit_input_are_stored_and_delivered_verbatim(pool: PgPool) {
    migrated(&pool).await;
    plant_canary(&pool).await;
    round_trip(&pool, SQL_LOOKING).await;
    nothing_was_dropped(&pool).await;
    assert_eq!(count_rows(&pool).await, SQL_LOOKING.len() as i64);
    assert_eq!(count_published(&pool).await, SQL_LOOKING.len() as i64);
}

#[sqlx::test(migrations = false)]
async fn unusual_unicode_in_every_emit_input_round_trips(pool: PgPool) {
    migrated(&pool).await;
    round_trip(&pool, UNUSUAL).await;
    assert_eq!(count_published(&pool).await, UNUSUAL.len() as i64);
}

/// A hand-written row with `payload` given as JSON text.
async fn insert_note_json(pool: &PgPool, aggregate_id: &str, payload: &str) -> sqlx::Result<Uuid> {
    sqlx::query_scalar(
        "INSERT INTO outbox.events (event_id, aggregate_type, aggregate_id, event_type, payload) \
         VALUES ($1, 'note', $2, 'note.written', $3::jsonb) RETURNING event_id",
    )
    .bind(Uuid::now_v7())
    .bind(aggregate_id)
    .bind(payload)
    .fetch_one(pool)
    .await
}

#[sqlx::test(migrations = false)]
async fn surrogate_escapes_in_hand_written_json(pool: PgPool) {
    migrated(&pool).await;
    // A Rust `String` cannot hold a lone surrogate, but JSON text written by hand can escape
    // one. jsonb refuses it (and the NUL escape) on insert, so no such row can ever reach a
    // relay: the relay never meets a payload string it cannot turn into a Rust `String`.
    for (escape, expected) in [(r"\ud800", "22P02"), (r"\udc00", "22P02"), (r"\u0000", "22P05")] {
        let payload =
            format!(r#"{{"note": "n", "text": "{escape}", "fields": {{}}, "lines": []}}"#);
        let err = insert_note_json(&pool, "lone", &payload).await.unwrap_err();
        assert_eq!(sqlstate(&err).as_deref(), Some(expected), "{escape}: {err}");
    }
    assert_eq!(count_rows(&pool).await, 0, "nothing was written");

    // A proper surrogate pair is one character: jsonb stores the crab itself.
    let pair =
        r#"{"note": "pair", "text": "\ud83e\udd80", "fields": {"\ud83e\udd80": "x"}, "lines": []}"#;
    let id = insert_note_json(&pool, "pair", pair).await.unwrap();
    let text: String =
        sqlx::query_scalar("SELECT payload->>'text' FROM outbox.events WHERE event_id = $1")
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(text, "🦀");

    let seen = Seen::default();
    let relay =
        Running::start(fast(Relay::builder(pool.clone())).state(seen.clone()).handler(record_note));
    eventually("the row is delivered", || async { !seen.lock().unwrap().is_empty() }).await;
    relay.stop().await;
    let got = seen.lock().unwrap()[0].event.clone();
    assert_eq!(got.text, "🦀");
    assert_eq!(got.fields.keys().collect::<Vec<_>>(), ["🦀"]);
}

// ---------------------------------------------------------------------------------------------
// Hand-written rows: garbage JSON, garbage headers, unknown types
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "shipment", event_type = "shipment.sent")]
struct ShipmentSent {
    #[outbox(id)]
    shipment: u64,
    carrier: String,
}

/// A hand-written row; `payload` and `headers` are JSON text.
async fn hand_written(
    pool: &PgPool,
    aggregate_type: &str,
    event_type: &str,
    payload: &str,
    headers: &str,
) -> Uuid {
    sqlx::query_scalar(
        "INSERT INTO outbox.events \
             (event_id, aggregate_type, aggregate_id, event_type, payload, headers) \
         VALUES ($1, $2, '7', $3, $4::jsonb, $5::jsonb) RETURNING event_id",
    )
    .bind(Uuid::now_v7())
    .bind(aggregate_type)
    .bind(event_type)
    .bind(payload)
    .bind(headers)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrations = false)]
async fn wrong_shaped_rows_fail_naming_the_type_while_others_flow(pool: PgPool) {
    migrated(&pool).await;
    let emitted = |n: u64| ShipmentSent { shipment: n, carrier: format!("carrier {n}") };
    let mut tx = pool.begin().await.unwrap();
    let mut good = vec![emit(&mut tx, &emitted(1)).await.unwrap()];
    tx.commit().await.unwrap();

    // Valid jsonb, wrong shape for `ShipmentSent`: (payload, where, what serde says).
    let garbage = [
        ("[]", "", "invalid length 0"),
        ("null", "", "invalid type: null"),
        ("42", "", "invalid type: integer `42`"),
        ("\"a string\"", "", "invalid type: string"),
        ("true", "", "invalid type: boolean"),
        ("{}", "", "missing field `shipment`"),
        (
            r#"{"shipment": "7", "carrier": "x"}"#,
            " at `shipment`",
            "invalid type: string \"7\", expected u64",
        ),
        (r#"{"shipment": -1, "carrier": "x"}"#, " at `shipment`", "invalid value: integer `-1`"),
        (r#"{"shipment": 7, "carrier": ["x"]}"#, " at `carrier`", "invalid type: sequence"),
    ];
    let mut bad = Vec::new();
    for (payload, ..) in &garbage {
        bad.push(hand_written(&pool, "shipment", "shipment.sent", payload, "{}").await);
    }
    // Right payload, headers of every wrong shape: delivered, headers handed over as stored.
    let odd_headers = ["null", "[1, 2]", "\"text\"", "42", r#"{"nested": {"deep": [null]}}"#];
    let mut odd = Vec::new();
    for headers in odd_headers {
        let payload = r#"{"shipment": 8, "carrier": "hand"}"#;
        odd.push(hand_written(&pool, "shipment", "shipment.sent", payload, headers).await);
    }
    // Types no handler takes: an unknown event type, and a known event type under another
    // aggregate type.
    let payload = r#"{"shipment": 9, "carrier": "x"}"#;
    let unknown = [
        hand_written(&pool, "shipment", "shipment.lost", payload, "{}").await,
        hand_written(&pool, "parcel", "shipment.sent", payload, "{}").await,
    ];
    let mut tx = pool.begin().await.unwrap();
    good.push(emit(&mut tx, &emitted(2)).await.unwrap());
    tx.commit().await.unwrap();

    type Shipments = Arc<Mutex<Vec<(Uuid, Value, ShipmentSent)>>>;
    let seen: Shipments = Arc::default();
    let relay = Running::start(
        fast(Relay::builder(pool.clone()))
            .state(seen.clone())
            .handler(|ctx: EventContext<Shipments>, event: ShipmentSent| async move {
                ctx.state().lock().unwrap().push((ctx.event_id(), ctx.headers().clone(), event));
                Ok::<_, std::io::Error>(())
            })
            .max_attempts(1),
    );
    let all_settled = || async {
        let mut settled = true;
        for id in &bad {
            settled &= row_state(&pool, *id).await.dead;
        }
        for id in good.iter().chain(&odd) {
            settled &= row_state(&pool, *id).await.published;
        }
        settled
    };
    eventually("the garbage is dead and the rest is published", all_settled).await;
    tokio::time::sleep(Duration::from_millis(200)).await; // time to (wrongly) lease unknown rows
    let counts = relay.stop().await;

    for (id, (payload, at, serde_says)) in bad.iter().zip(&garbage) {
        let row = row_state(&pool, *id).await;
        let error = row.last_error.unwrap();
        let names = format!("payload does not deserialize into `bad_input::ShipmentSent`{at}: ");
        assert!(error.starts_with(&names), "{payload}: the type and field are named: {error}");
        assert!(error.contains(serde_says), "{payload}: serde's message is kept: {error}");
        assert!(!error.contains(" line "), "{payload}: no position in jsonb's text: {error}");
        assert_eq!((row.attempts, row.published), (1, false));
    }
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), good.len() + odd.len(), "garbage never reached the handler");
    for (id, headers) in odd.iter().zip(odd_headers) {
        let (_, got, event) = seen.iter().find(|(seen_id, ..)| seen_id == id).unwrap();
        assert_eq!(*got, serde_json::from_str::<Value>(headers).unwrap());
        assert_eq!(event.carrier, "hand");
    }
    for id in unknown {
        let row = row_state(&pool, id).await;
        assert_eq!((row.published, row.leased, row.attempts, row.dead), (false, false, 0, false));
        assert_eq!(row.last_error, None, "left for a relay that handles it");
    }
    assert_eq!((counts.delivered, counts.failed, counts.dead), (7, 9, 9));
    let stats = outbox_runtime::stats(&pool).await.unwrap();
    assert_eq!((stats.pending, stats.dead), (2, 9));
}

// ---------------------------------------------------------------------------------------------
// Typed errors that write nothing
// ---------------------------------------------------------------------------------------------

async fn side_table(pool: &PgPool) {
    sqlx::query("CREATE TABLE side_effects (note text)").execute(pool).await.unwrap();
}

async fn side_effect(tx: &mut sqlx::PgConnection, note: &str) {
    sqlx::query("INSERT INTO side_effects VALUES ($1)").bind(note).execute(tx).await.unwrap();
}

async fn side_effects(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar("SELECT note FROM side_effects ORDER BY note").fetch_all(pool).await.unwrap()
}

fn is_nul_error(result: &Result<impl std::fmt::Debug, Error>) -> bool {
    matches!(
        result,
        Err(Error::InvalidEvent {
            event_type: "note.written",
            reason: InvalidEvent::NulCharacter(_)
        })
    )
}

#[sqlx::test(migrations = false)]
async fn nul_in_header_names_and_keys_is_a_typed_error_and_writes_nothing(pool: PgPool) {
    migrated(&pool).await;
    side_table(&pool).await;
    let mut tx = pool.begin().await.unwrap();
    side_effect(&mut tx, "1 before").await;

    let nul_options = [
        EmitOptions::new().header("request\0id", "r-1"),
        EmitOptions::new().header("\0", "r-1"),
        EmitOptions::new().header("ok", "r-1").header("late\0", 1),
        EmitOptions::new().header("nested", serde_json::json!({ "in\0ner": [1, 2] })),
        EmitOptions::new().header("nested", serde_json::json!([{ "a": "b\0" }])),
    ];
    for options in nul_options {
        let result = emit_with(&mut tx, &note("n"), options.clone()).await;
        assert!(is_nul_error(&result), "{options:?}: {result:?}");
    }
    for key in ["key\0", "\0"] {
        let result = emit_idempotent(&mut tx, &note("n"), key, EmitOptions::new()).await;
        assert!(is_nul_error(&result), "{key:?}: {result:?}");
    }
    // A NUL in a header name refuses a whole batch.
    let batch = [note("a"), note("b")];
    let result = emit_all_with(&mut tx, &batch, EmitOptions::new().header("x\0", 1)).await;
    assert!(is_nul_error(&result), "{result:?}");
    let result = emit_idempotent(&mut tx, &note("n"), "k\0", EmitOptions::new()).await;
    let message = chain(&result.unwrap_err());
    assert!(message.contains("the idempotency key holds a NUL character"), "{message}");
    // A batch whose last event has a NUL in its aggregate id writes none of them.
    let batch = [note("fine"), note("bad\0id")];
    assert!(is_nul_error(&emit_all(&mut tx, &batch).await));

    // Nothing reached the database: the transaction is usable, and commits the rest.
    let good = emit_with(&mut tx, &note("n"), EmitOptions::new().header("request_id", "r-1"))
        .await
        .unwrap();
    side_effect(&mut tx, "2 after").await;
    tx.commit().await.unwrap();
    let ids: Vec<Uuid> =
        sqlx::query_scalar("SELECT event_id FROM outbox.events").fetch_all(&pool).await.unwrap();
    assert_eq!(ids, [good]);
    assert_eq!(side_effects(&pool).await, ["1 before", "2 after"]);
}

/// A value whose `Serialize` impl fails with a custom error.
#[derive(Debug, Clone, PartialEq, Deserialize)]
struct Trap;

impl Serialize for Trap {
    fn serialize<S: Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
        Err(serde::ser::Error::custom("the trap refuses to serialize"))
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "trap", event_type = "trap.sprung")]
struct TrapSprung {
    #[outbox(id)]
    trap: u32,
    armed: Option<Trap>,
    deep: BTreeMap<String, Vec<Trap>>,
}

fn trap(armed: Option<Trap>, deep: Vec<Trap>) -> TrapSprung {
    TrapSprung { trap: 1, armed, deep: BTreeMap::from([("k".to_owned(), deep)]) }
}

#[sqlx::test(migrations = false)]
async fn a_failing_serialize_impl_is_invalid_event_and_the_transaction_commits_the_rest(
    pool: PgPool,
) {
    migrated(&pool).await;
    side_table(&pool).await;
    let mut tx = pool.begin().await.unwrap();
    side_effect(&mut tx, "1 before").await;

    for event in [trap(Some(Trap), vec![]), trap(None, vec![Trap]), trap(None, vec![Trap, Trap])] {
        let err = emit(&mut tx, &event).await.unwrap_err();
        match &err {
            Error::InvalidEvent {
                event_type: "trap.sprung",
                reason: InvalidEvent::Serialize(serde_error),
            } => {
                assert!(serde_error.to_string().contains("the trap refuses to serialize"));
            }
            other => panic!("expected InvalidEvent::Serialize, got {other:?}"),
        }
        let message = chain(&err);
        assert!(message.starts_with("cannot emit `trap.sprung` event: "), "{message}");
        assert!(message.contains("the trap refuses to serialize"), "{message}");
        assert_eq!(message.matches("the trap refuses to serialize").count(), 1, "shown once");
    }
    // In a batch, one failing event refuses the batch.
    let batch = [trap(None, vec![]), trap(Some(Trap), vec![])];
    let err = emit_all(&mut tx, &batch).await.unwrap_err();
    assert!(matches!(err, Error::InvalidEvent { reason: InvalidEvent::Serialize(_), .. }));

    let good = emit(&mut tx, &trap(None, vec![])).await.unwrap();
    side_effect(&mut tx, "2 after").await;
    tx.commit().await.unwrap();
    let ids: Vec<Uuid> =
        sqlx::query_scalar("SELECT event_id FROM outbox.events").fetch_all(&pool).await.unwrap();
    assert_eq!(ids, [good], "only the event that serializes was written");
    assert_eq!(side_effects(&pool).await, ["1 before", "2 after"]);
}

// ---------------------------------------------------------------------------------------------
// Injection through the operations' inputs and hand-written types
// ---------------------------------------------------------------------------------------------

/// A hand-written dead row whose aggregate type and event type are both `s`.
async fn dead_row_typed(pool: &PgPool, s: &str) -> Uuid {
    sqlx::query_scalar(
        "INSERT INTO outbox.events (event_id, aggregate_type, aggregate_id, event_type, payload, \
                                    attempts, last_error, dead_at) \
         VALUES ($1, $2, $2, $2, jsonb_build_object('s', $2), 3, 'x', now()) RETURNING event_id",
    )
    .bind(Uuid::now_v7())
    .bind(s)
    .fetch_one(pool)
    .await
    .unwrap()
}

fn ids(events: Vec<dead_letters::DeadEvent>) -> Vec<Uuid> {
    events.into_iter().map(|e| e.event_id).collect()
}

#[sqlx::test(migrations = false)]
async fn sql_looking_types_and_dead_filters_are_data(pool: PgPool) {
    migrated(&pool).await;
    plant_canary(&pool).await;
    let mut dead = Vec::new();
    for s in SQL_LOOKING {
        dead.push(dead_row_typed(&pool, s).await);
    }
    let all = DeadFilter::all();
    assert_eq!(ids(dead_letters::list(&pool, &all, None, 1000).await.unwrap()), dead);

    // Each filter string matches exactly its own row, as aggregate type, event type or both.
    for (s, id) in SQL_LOOKING.iter().zip(&dead) {
        for filter in [
            DeadFilter::all().aggregate_type(*s),
            DeadFilter::all().event_type(*s),
            DeadFilter::all().aggregate_type(*s).event_type(*s),
        ] {
            let found = dead_letters::list(&pool, &filter, None, 1000).await.unwrap();
            assert_eq!(ids(found.clone()), [*id], "{filter:?}");
            assert_eq!((found[0].aggregate_type.as_str(), found[0].event_type.as_str()), (*s, *s));
            assert_eq!(found[0].payload, serde_json::json!({ "s": s }));
        }
    }

    // Tautologies and wildcards match nothing: not a row listed, requeued or discarded.
    for s in ["nope' OR '1'='1", "nope') OR true --", "%", "_", ".*", "*", "' OR 1=1; --"] {
        for filter in [DeadFilter::all().aggregate_type(s), DeadFilter::all().event_type(s)] {
            assert!(dead_letters::list(&pool, &filter, None, 1000).await.unwrap().is_empty());
            assert_eq!(dead_letters::requeue(&pool, &filter).await.unwrap(), 0, "{filter:?}");
            assert_eq!(dead_letters::discard(&pool, &filter).await.unwrap(), 0, "{filter:?}");
        }
    }
    assert_eq!(outbox_runtime::stats(&pool).await.unwrap().dead, SQL_LOOKING.len() as i64);

    // The per-type figures report the types verbatim.
    let by_type = outbox_runtime::stats_by_type(&pool).await.unwrap();
    for s in SQL_LOOKING {
        let row = by_type.iter().find(|t| t.aggregate_type == *s && t.event_type == *s);
        assert_eq!(row.map(|t| (t.pending, t.dead)), Some((0, 1)), "{s:?}");
    }

    // Requeue and discard act on exactly the named rows.
    let (requeued, discarded) = (SQL_LOOKING[0], SQL_LOOKING[1]);
    let filter = DeadFilter::all().aggregate_type(requeued).event_type(requeued);
    assert_eq!(dead_letters::requeue(&pool, &filter).await.unwrap(), 1);
    let filter = DeadFilter::all().event_type(discarded);
    assert_eq!(dead_letters::discard(&pool, &filter).await.unwrap(), 1);
    let stats = outbox_runtime::stats(&pool).await.unwrap();
    assert_eq!((stats.pending, stats.dead), (1, SQL_LOOKING.len() as i64 - 2));
    nothing_was_dropped(&pool).await;

    // A relay without a handler for the requeued row's types leaves it pending...
    let known = emit_note(&pool, "known", 0).await;
    let relay = Running::start(
        fast(Relay::builder(pool.clone())).state(Seen::default()).handler(record_note),
    );
    eventually("the known event is published", || async {
        row_state(&pool, known).await.published
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    relay.stop().await;
    let row = row_state(&pool, dead[0]).await;
    assert_eq!((row.dead, row.leased, row.attempts), (false, false, 0), "left for others");

    // ...and one told to fail unknown types records its types verbatim in the error.
    let relay = Running::start(
        fast(Relay::builder(pool.clone()))
            .state(Seen::default())
            .handler(record_note)
            .unknown_events(UnknownEvents::Fail)
            .max_attempts(1),
    );
    eventually("the row is dead again", || async { row_state(&pool, dead[0]).await.dead }).await;
    relay.stop().await;
    assert_eq!(
        row_state(&pool, dead[0]).await.last_error.unwrap(),
        format!("no handler registered for aggregate `{requeued}`, event type `{requeued}`")
    );
    nothing_was_dropped(&pool).await;
    assert_eq!(count_rows(&pool).await, SQL_LOOKING.len() as i64);
}
