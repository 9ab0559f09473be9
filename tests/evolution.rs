//! Evolving events against the real PostgreSQL: rows written at older versions reach a handler
//! of the newest through the `upcast_from` chain and JSON upcasters; a failed upcast is a
//! recorded failure naming both versions; rows of a newer version wait for a relay that reads
//! them; enum families write and read the same rows as their variants' structs.

mod support;

use std::sync::{Arc, Mutex};

use outbox_runtime::{
    emit_all, BuildError, EventContext, NewerVersions, OutboxEvent, Relay, RelayBuilder,
};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::PgPool;
use support::*;
use uuid::Uuid;

/// Version 1: the total in whole units.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "invoice", event_type = "invoice.issued")]
struct InvoiceIssuedV1 {
    #[outbox(id)]
    invoice_id: i64,
    total: i64,
}

/// Version 2: the total in cents, renamed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "invoice", event_type = "invoice.issued", version = 2, upcast_from = InvoiceIssuedV1)]
struct InvoiceIssuedV2 {
    #[outbox(id)]
    invoice_id: i64,
    total_cents: i64,
}

impl From<InvoiceIssuedV1> for InvoiceIssuedV2 {
    fn from(v1: InvoiceIssuedV1) -> Self {
        InvoiceIssuedV2 { invoice_id: v1.invoice_id, total_cents: v1.total * 100 }
    }
}

/// Version 3: the amount split into currency and cents; an invoice cannot be negative.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "invoice", event_type = "invoice.issued", version = 3, upcast_from = InvoiceIssuedV2)]
struct InvoiceIssued {
    #[outbox(id)]
    invoice_id: i64,
    currency: String,
    cents: u64,
}

impl TryFrom<InvoiceIssuedV2> for InvoiceIssued {
    type Error = HandlerError;

    fn try_from(v2: InvoiceIssuedV2) -> Result<Self, HandlerError> {
        let cents = u64::try_from(v2.total_cents)
            .map_err(|_| HandlerError(format!("negative total {}", v2.total_cents)))?;
        Ok(InvoiceIssued { invoice_id: v2.invoice_id, currency: "EUR".into(), cents })
    }
}

/// What a handler saw: the stored version and the value as the handler's type.
type Seen<E> = Arc<Mutex<Vec<(u32, E)>>>;

async fn record<E>(ctx: EventContext<Seen<E>>, event: E) -> Result<(), HandlerError> {
    ctx.state().lock().unwrap().push((ctx.version(), event));
    Ok(())
}

fn seen_sorted<E: Clone>(seen: &Seen<E>) -> Vec<(u32, E)> {
    let mut all = seen.lock().unwrap().clone();
    all.sort_by_key(|(version, _)| *version);
    all
}

/// Runs `builder` until `ids` are published, then stops it.
async fn deliver_all<S: Clone + Send + Sync + 'static>(
    pool: &PgPool,
    builder: RelayBuilder<S>,
    ids: &[Uuid],
) {
    let relay = Running::start(builder);
    for &id in ids {
        until_published(pool, id).await;
    }
    relay.stop().await;
}

async fn event_version(pool: &PgPool, id: Uuid) -> i32 {
    sqlx::query_scalar("SELECT event_version FROM outbox.events WHERE event_id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Inserts a row as SQL written for the reference design would: no `event_version`.
async fn insert_by_sql(pool: &PgPool, event_type: &str, payload: serde_json::Value) -> Uuid {
    sqlx::query_scalar(
        "INSERT INTO outbox.events (event_id, aggregate_type, aggregate_id, event_type, payload) \
         VALUES (gen_random_uuid(), $1, $2, $3, $4) RETURNING event_id",
    )
    .bind(event_type.split('.').next().unwrap())
    .bind(payload["invoice_id"].to_string())
    .bind(event_type)
    .bind(payload)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Waits until the row has failed at least once; returns its state.
async fn failed(pool: &PgPool, id: Uuid) -> RowState {
    eventually("the delivery failed", || async { row_state(pool, id).await.attempts > 0 }).await;
    row_state(pool, id).await
}

#[sqlx::test(migrations = false)]
async fn a_handler_of_the_newest_version_reads_every_older_one(pool: PgPool) {
    migrated(&pool).await;
    let v1 = emit_committed(&pool, &[InvoiceIssuedV1 { invoice_id: 1, total: 12 }]).await[0];
    let v2 =
        emit_committed(&pool, &[InvoiceIssuedV2 { invoice_id: 2, total_cents: 1250 }]).await[0];
    let v3 = InvoiceIssued { invoice_id: 3, currency: "USD".into(), cents: 99 };
    let v3 = emit_committed(&pool, &[v3]).await[0];
    // Rows written by SQL that does not know the column read as version 1.
    let by_sql =
        insert_by_sql(&pool, "invoice.issued", json!({ "invoice_id": 4, "total": 7 })).await;
    for (id, version) in [(v1, 1), (v2, 2), (v3, 3), (by_sql, 1)] {
        assert_eq!(event_version(&pool, id).await, version);
    }

    let seen: Seen<InvoiceIssued> = Seen::default();
    let builder = fast(Relay::builder(pool.clone())).state(seen.clone()).handler(record);
    deliver_all(&pool, builder, &[v1, v2, v3, by_sql]).await;

    let invoice = |invoice_id, currency: &str, cents| InvoiceIssued {
        invoice_id,
        currency: currency.into(),
        cents,
    };
    let mut all = seen_sorted(&seen);
    all.sort_by_key(|(version, event)| (*version, event.invoice_id));
    assert_eq!(
        all,
        [
            (1, invoice(1, "EUR", 1200)),
            (1, invoice(4, "EUR", 700)),
            (2, invoice(2, "EUR", 1250)),
            (3, invoice(3, "USD", 99)),
        ],
        "each row through the chain from its own version, each exactly once"
    );
}

#[sqlx::test(migrations = false)]
async fn a_failed_upcast_is_a_recorded_failure_naming_both_versions(pool: PgPool) {
    migrated(&pool).await;
    let id = emit_committed(&pool, &[InvoiceIssuedV2 { invoice_id: 5, total_cents: -3 }]).await[0];
    let seen: Seen<InvoiceIssued> = Seen::default();
    let relay = Running::start(
        fast(Relay::builder(pool.clone())).state(seen.clone()).handler(record).max_attempts(2),
    );
    eventually("the row is dead", || async { row_state(&pool, id).await.dead }).await;
    relay.stop().await;

    let row = row_state(&pool, id).await;
    assert_eq!(row.attempts, 2);
    assert_eq!(
        row.last_error.unwrap(),
        format!(
            "cannot upcast `{}` (version 2) to `{}` (version 3): negative total -3",
            std::any::type_name::<InvoiceIssuedV2>(),
            std::any::type_name::<InvoiceIssued>()
        )
    );
    assert!(seen.lock().unwrap().is_empty(), "the handler never ran");
}

/// Version 3 of a shipment, whose versions 1 and 2 have no struct any more.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "invoice", event_type = "invoice.shipped", version = 3)]
struct InvoiceShipped {
    #[outbox(id)]
    invoice_id: i64,
    carrier: String,
    tracking: String,
}

/// Version 1 held `"parcel": "carrier:tracking"`; version 2 renamed it to `shipment`.
fn v1_to_v2(mut v1: serde_json::Value) -> Result<serde_json::Value, HandlerError> {
    let parcel = v1["parcel"].take();
    let object = v1.as_object_mut().ok_or_else(|| HandlerError("not an object".into()))?;
    object.remove("parcel");
    object.insert("shipment".into(), parcel);
    Ok(v1)
}

/// Version 3 split `shipment` into `carrier` and `tracking`.
fn v2_to_v3(mut v2: serde_json::Value) -> Result<serde_json::Value, HandlerError> {
    let shipment = v2["shipment"].as_str().unwrap_or_default().to_owned();
    let (carrier, tracking) = shipment
        .split_once(':')
        .ok_or_else(|| HandlerError(format!("no carrier in {shipment:?}")))?;
    v2["carrier"] = carrier.into();
    v2["tracking"] = tracking.into();
    Ok(v2)
}

async fn insert_version(pool: &PgPool, version: i32, payload: serde_json::Value) -> Uuid {
    let id = insert_by_sql(pool, "invoice.shipped", payload).await;
    sqlx::query("UPDATE outbox.events SET event_version = $2 WHERE event_id = $1")
        .bind(id)
        .bind(version)
        .execute(pool)
        .await
        .unwrap();
    id
}

#[sqlx::test(migrations = false)]
async fn json_upcasters_read_versions_whose_structs_are_gone(pool: PgPool) {
    migrated(&pool).await;
    let v1 = insert_version(&pool, 1, json!({ "invoice_id": 1, "parcel": "ups:1Z9" })).await;
    let v2 = insert_version(&pool, 2, json!({ "invoice_id": 2, "shipment": "dhl:42" })).await;
    let broken = insert_version(&pool, 2, json!({ "invoice_id": 3, "shipment": "nowhere" })).await;
    let v3 = InvoiceShipped { invoice_id: 4, carrier: "fedex".into(), tracking: "7".into() };
    let v3 = emit_committed(&pool, &[v3]).await[0];

    let seen: Seen<InvoiceShipped> = Seen::default();
    let builder = fast(Relay::builder(pool.clone()))
        .state(seen.clone())
        .handler(record)
        .upcast_json::<InvoiceShipped, _>("invoice.shipped", 2, v2_to_v3)
        .upcast_json::<InvoiceShipped, _>("invoice.shipped", 1, v1_to_v2)
        .max_attempts(1);
    let relay = Running::start(builder);
    for id in [v1, v2, v3] {
        until_published(&pool, id).await;
    }
    eventually("the broken row is dead", || async { row_state(&pool, broken).await.dead }).await;
    relay.stop().await;

    let shipped = |invoice_id, carrier: &str, tracking: &str| InvoiceShipped {
        invoice_id,
        carrier: carrier.into(),
        tracking: tracking.into(),
    };
    assert_eq!(
        seen_sorted(&seen),
        [
            (1, shipped(1, "ups", "1Z9")),
            (2, shipped(2, "dhl", "42")),
            (3, shipped(4, "fedex", "7"))
        ]
    );
    assert_eq!(
        row_state(&pool, broken).await.last_error.unwrap(),
        "the JSON upcaster of `invoice.shipped` from version 2 to 3 failed: \
         no carrier in \"nowhere\""
    );
}

#[sqlx::test(migrations = false)]
async fn a_version_older_than_any_reader_is_a_failure_that_says_what_to_register(pool: PgPool) {
    migrated(&pool).await;
    let v1 = insert_version(&pool, 1, json!({ "invoice_id": 1, "parcel": "ups:1Z9" })).await;
    let seen: Seen<InvoiceShipped> = Seen::default();
    let relay = Running::start(fast(Relay::builder(pool.clone())).state(seen).handler(record));
    let row = failed(&pool, v1).await;
    relay.stop().await;
    assert_eq!(
        row.last_error.unwrap(),
        format!(
            "`invoice.shipped` version 1 is older than `{}` reads (version 3): register JSON \
             upcasters with `RelayBuilder::upcast_json`",
            std::any::type_name::<InvoiceShipped>()
        )
    );
}

#[sqlx::test(migrations = false)]
async fn rows_of_a_newer_version_wait_for_a_relay_that_reads_them(pool: PgPool) {
    migrated(&pool).await;
    // A new producer writes version 3 before every relay was upgraded to read it.
    let old = emit_committed(&pool, &[InvoiceIssuedV2 { invoice_id: 1, total_cents: 5 }]).await[0];
    let new = InvoiceIssued { invoice_id: 1, currency: "EUR".into(), cents: 7 };
    let new = emit_committed(&pool, &[new]).await[0];

    // An old relay reads up to version 2: it delivers the old row and leaves the new one.
    let old_seen: Seen<InvoiceIssuedV2> = Seen::default();
    let old_relay =
        Running::start(fast(Relay::builder(pool.clone())).state(old_seen.clone()).handler(record));
    until_published(&pool, old).await;
    // Some more leases go by (the relay polls every 50 ms): none takes the newer row.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let waiting = row_state(&pool, new).await;
    assert!(!waiting.published && !waiting.leased && !waiting.dead, "{waiting:?}");
    assert_eq!((waiting.attempts, waiting.last_error), (0, None));
    let stats = outbox_runtime::stats_by_type(&pool).await.unwrap();
    let versions: Vec<(&str, u32, i64)> =
        stats.iter().map(|t| (t.event_type.as_str(), t.version, t.pending)).collect();
    assert_eq!(versions, [("invoice.issued", 3, 1)], "the waiting row is counted by version");
    old_relay.stop().await;
    assert_eq!(seen_sorted(&old_seen), [(2, InvoiceIssuedV2 { invoice_id: 1, total_cents: 5 })]);

    // The upgraded relay reads it.
    let seen: Seen<InvoiceIssued> = Seen::default();
    let builder = fast(Relay::builder(pool.clone())).state(seen.clone()).handler(record);
    deliver_all(&pool, builder, &[new]).await;
    assert_eq!(
        seen_sorted(&seen),
        [(3, InvoiceIssued { invoice_id: 1, currency: "EUR".into(), cents: 7 })]
    );
}

#[sqlx::test(migrations = false)]
async fn the_fail_policy_fails_newer_versions_naming_both(pool: PgPool) {
    migrated(&pool).await;
    let new = InvoiceIssued { invoice_id: 1, currency: "EUR".into(), cents: 7 };
    let new = emit_committed(&pool, &[new]).await[0];
    let seen: Seen<InvoiceIssuedV2> = Seen::default();
    let relay = Running::start(
        fast(Relay::builder(pool.clone()))
            .state(seen.clone())
            .handler(record)
            .newer_versions(NewerVersions::Fail)
            .max_attempts(1),
    );
    eventually("the row is dead", || async { row_state(&pool, new).await.dead }).await;
    relay.stop().await;
    assert_eq!(
        row_state(&pool, new).await.last_error.unwrap(),
        format!(
            "`invoice.issued` version 3 is newer than `{}` reads (versions 1 to 2)",
            std::any::type_name::<InvoiceIssuedV2>()
        )
    );
    assert!(seen.lock().unwrap().is_empty());
}

/// One variant's struct of the family below.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, OutboxEvent, schemars::JsonSchema)]
#[outbox(aggregate = "cart", event_type = "cart.item_added", ordered)]
struct ItemAdded {
    #[outbox(id)]
    cart_id: Uuid,
    sku: String,
    qty: u32,
}

/// Every event of a cart, in one type.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, OutboxEvent, schemars::JsonSchema)]
#[outbox(aggregate = "cart", ordered)]
#[serde(rename_all = "snake_case")]
enum CartEvent {
    #[outbox(event_type = "cart.item_added")]
    ItemAdded(ItemAdded),
    #[outbox(event_type = "cart.checked_out", version = 2)]
    CheckedOut {
        #[outbox(id)]
        cart_id: Uuid,
        #[serde(rename = "total")]
        total_cents: i64,
    },
}

#[sqlx::test(migrations = false)]
async fn an_enum_family_writes_its_variants_rows_and_reads_them_back(pool: PgPool) {
    migrated(&pool).await;
    let cart_id = Uuid::now_v7();
    let added = ItemAdded { cart_id, sku: "tea".into(), qty: 2 };
    let events =
        [CartEvent::ItemAdded(added.clone()), CartEvent::CheckedOut { cart_id, total_cents: 900 }];
    let mut tx = pool.begin().await.unwrap();
    let ids = emit_all(&mut tx, &events).await.unwrap();
    // The variant's struct writes the same kind of row.
    let more = ItemAdded { cart_id, sku: "cup".into(), qty: 1 };
    let by_struct = outbox_runtime::emit(&mut tx, &more).await.unwrap();
    tx.commit().await.unwrap();

    let rows: Vec<(String, String, i32, bool, serde_json::Value)> = sqlx::query_as(
        "SELECT event_type, aggregate_id, event_version, ordered, payload FROM outbox.events \
         ORDER BY seq",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let cart = cart_id.to_string();
    assert_eq!(
        rows,
        [
            (
                "cart.item_added".into(),
                cart.clone(),
                1,
                true,
                json!({ "cart_id": cart, "sku": "tea", "qty": 2 })
            ),
            (
                "cart.checked_out".into(),
                cart.clone(),
                2,
                true,
                json!({ "cart_id": cart, "total": 900 })
            ),
            (
                "cart.item_added".into(),
                cart.clone(),
                1,
                true,
                json!({ "cart_id": cart, "sku": "cup", "qty": 1 })
            ),
        ],
        "each variant's event type and version, its content as the payload, the family's order"
    );

    // One handler of the family receives every variant, in the aggregate's order.
    let seen: Seen<CartEvent> = Seen::default();
    let builder = fast(Relay::builder(pool.clone())).state(seen.clone()).handler(record);
    deliver_all(&pool, builder, &[ids[0], ids[1], by_struct]).await;
    let received: Vec<CartEvent> = seen.lock().unwrap().iter().map(|(_, e)| e.clone()).collect();
    assert_eq!(
        received,
        [events[0].clone(), events[1].clone(), CartEvent::ItemAdded(more.clone())],
        "the family handler reads rows its variants' struct wrote too, in order"
    );

    // A handler of one variant's struct reads the rows the family wrote.
    sqlx::query(
        "UPDATE outbox.events SET published_at = NULL, available_at = now(), lease_token = NULL \
         WHERE event_type = 'cart.item_added'",
    )
    .execute(&pool)
    .await
    .unwrap();
    let items: Seen<ItemAdded> = Seen::default();
    let builder = fast(Relay::builder(pool.clone())).state(items.clone()).handler(record);
    deliver_all(&pool, builder, &[ids[0], by_struct]).await;
    let received: Vec<ItemAdded> = items.lock().unwrap().iter().map(|(_, e)| e.clone()).collect();
    assert_eq!(received, [added, more]);
}

#[tokio::test]
async fn build_refuses_handlers_and_upcasters_that_would_be_ambiguous_or_never_run() {
    let pool = || PgPool::connect_lazy("postgres://localhost/unused").unwrap();
    async fn item(_: EventContext, _: ItemAdded) -> Result<(), HandlerError> {
        Ok(())
    }
    async fn cart(_: EventContext, _: CartEvent) -> Result<(), HandlerError> {
        Ok(())
    }
    async fn v2(_: EventContext, _: InvoiceIssuedV2) -> Result<(), HandlerError> {
        Ok(())
    }
    async fn v3(_: EventContext, _: InvoiceIssued) -> Result<(), HandlerError> {
        Ok(())
    }

    let family_and_variant = Relay::builder(pool()).handler(cart).handler(item).build();
    assert_eq!(
        family_and_variant.err(),
        Some(BuildError::DuplicateHandler {
            aggregate_type: "cart",
            event_type: "cart.item_added",
            first: std::any::type_name::<CartEvent>(),
            second: std::any::type_name::<ItemAdded>(),
        })
    );
    let two_versions = Relay::builder(pool()).handler(v2).handler(v3).build();
    assert!(
        matches!(
            two_versions,
            Err(BuildError::DuplicateHandler { event_type: "invoice.issued", .. })
        ),
        "two versions of one event type on one relay"
    );

    let identity = |value| Ok::<_, HandlerError>(value);
    let reason = |builder: RelayBuilder| match builder.build() {
        Err(BuildError::InvalidUpcaster { reason, .. }) => reason,
        other => panic!("expected an invalid upcaster, got {:?}", other.err()),
    };
    let no_handler = Relay::builder(pool()).handler(v3).upcast_json::<InvoiceShipped, _>(
        "invoice.shipped",
        1,
        identity,
    );
    assert_eq!(reason(no_handler), "no handler takes this event type");
    let read_by_the_chain = Relay::builder(pool()).handler(v3).upcast_json::<InvoiceIssued, _>(
        "invoice.issued",
        1,
        identity,
    );
    assert!(reason(read_by_the_chain).contains("reads versions 1 to 3 itself"));
    let shipped = |_: EventContext, _: InvoiceShipped| async { Ok::<_, HandlerError>(()) };
    let gap = Relay::builder(pool()).handler(shipped).upcast_json::<InvoiceShipped, _>(
        "invoice.shipped",
        1,
        identity,
    );
    assert!(reason(gap).contains("version 2 has no upcaster"));
    let twice = Relay::builder(pool())
        .handler(shipped)
        .upcast_json::<InvoiceShipped, _>("invoice.shipped", 2, identity)
        .upcast_json::<InvoiceShipped, _>("invoice.shipped", 2, identity);
    assert_eq!(reason(twice), "registered twice");
}

#[test]
fn every_event_type_has_the_json_schema_of_its_payload() {
    let schemas = outbox_runtime::event_schemas::<CartEvent>();
    let names: Vec<(&str, &str, u32, String)> = schemas
        .iter()
        .map(|s| (s.aggregate_type, s.event_type, s.version, s.file_name()))
        .collect();
    assert_eq!(
        names,
        [
            ("cart", "cart.item_added", 1, "cart.item_added.v1.schema.json".into()),
            ("cart", "cart.checked_out", 2, "cart.checked_out.v2.schema.json".into()),
        ]
    );
    let [item_added, checked_out] = [&schemas[0].schema, &schemas[1].schema];
    assert_eq!(
        item_added["x-outbox"],
        json!({ "aggregate_type": "cart", "event_type": "cart.item_added", "version": 1 })
    );
    assert_eq!(item_added["type"], "object");
    assert_eq!(item_added["required"], json!(["cart_id", "sku", "qty"]));
    // The variant's content, as its rows store it: renamed fields as serde writes them.
    assert_eq!(checked_out["required"], json!(["cart_id", "total"]));
    assert_eq!(checked_out["x-outbox"]["version"], 2);
    assert!(checked_out["$schema"].as_str().unwrap().contains("2020-12"));
    // The variant struct's own schema is the same as its variant's.
    let [own] = outbox_runtime::event_schemas::<ItemAdded>().try_into().unwrap();
    assert_eq!(own.schema["properties"], item_added["properties"]);
}
