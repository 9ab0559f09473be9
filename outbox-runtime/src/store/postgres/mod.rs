//! Every PostgreSQL statement of the crate, next to the schema in `outbox-runtime/migrations/` it
//! is tuned for (the migrations themselves run through sqlx's migrator, in `migrate.rs`).
//!
//! Values are always bound, never formatted into SQL. Statements that touch many rows take
//! arrays and `UNNEST` them, so a batch costs one round trip. Each statement is built by a
//! `*_query` function that binds its parameters in one place, where a unit test checks them
//! against the `$N`s its SQL names; the function beside it runs it.

use sqlx::postgres::PgArguments;
use sqlx::Postgres;

/// `$query.$method(tx)` in an [`indexes_only`] transaction, committed: its result, or `?` on
/// the error.
macro_rules! on_indexes {
    ($pool:expr, $method:ident, $query:expr) => {{
        let mut tx = super::indexes_only($pool).await?;
        let result = $query.$method(&mut *tx).await?;
        tx.commit().await?;
        result
    }};
}

mod ack;
mod activity;
mod emit;
pub(crate) mod inbox;
mod lease;
mod lookup;
mod ops;
mod pauses;
mod relays;
mod replay;
mod schema;
mod sleepers;
mod subscribers;
#[cfg(feature = "testing")]
pub(crate) mod testing;

pub(crate) use ack::{
    fail, fail_held, fan_out, publish, publish_held, publish_in, release, renew, snooze,
    snooze_held, still_leased, Copy, FanOuts, OnPublish,
};
#[cfg_attr(not(feature = "console"), allow(unused_imports))]
pub(crate) use activity::{activity, ActivityRow};
pub(crate) use activity::{add_delivered, record_reading};
pub(crate) use lease::{
    hold, lease, set_idle_in_transaction_timeout, LeaseKey, LeasePlan, LeaseTypes, LeasedEvent,
    Positions, RowAddress, Scan, TypeVersions, RELAY_SESSION,
};
pub(crate) use lookup::{aggregate_events, event, EventRow, AGGREGATE_INDEX};
pub(crate) use ops::DeadRow;
pub(crate) use ops::{
    count_dead, dead, discard_dead, purge_published, requeue_dead, shared_stats_by_type,
    stats_by_type, DeadSelection, TypeCounts,
};
pub(crate) use pauses::{pause, paused, resume};
pub(crate) use relays::{forget_silent, heartbeat, relays, withdraw, RelayEntry, RelayRow};
pub(crate) use replay::{count_published, replay, replay_to};
pub(crate) use schema::{applied_migrations, create_schema, find_schema, History};
pub(crate) use sleepers::{
    backend_pid, inserting_transactions, notify_relays, register_sleeper, unregister_sleeper,
};
pub(crate) use subscribers::{
    behind, list as subscribers, register as register_subscribers, remove as remove_subscriber,
    SubscriberRow,
};

/// The statements whose plans the tests check, by name.
#[cfg(feature = "test-hooks")]
pub(crate) use {
    ack::{
        FAIL, FAN_OUT, FAN_OUT_DELETE, HELD_FAIL, HELD_PUBLISH, HELD_PUBLISH_DELETE, HELD_SNOOZE,
        PUBLISH, PUBLISH_DELETE, PUBLISH_ONE, PUBLISH_ONE_DELETE, RELEASE, RENEW, SNOOZE,
        STILL_LEASED,
    },
    inbox::{
        CLAIM as INBOX_CLAIM, COUNT_DEAD as INBOX_COUNT_DEAD, DEAD as INBOX_DEAD,
        DISCARD as INBOX_DISCARD, FAIL as INBOX_FAIL, IS_DEAD as INBOX_IS_DEAD,
        PURGE_HANDLED as INBOX_PURGE_HANDLED, REVIVE as INBOX_REVIVE,
    },
    lease::{HOLD_ANY, HOLD_HANDLED, HOLD_ONE, LEASE_ANY, LEASE_HANDLED, LEASE_ONE},
    ops::PURGE_PUBLISHED,
    subscribers::{
        BEHIND, LIST as SUBSCRIBERS, REGISTER as REGISTER_SUBSCRIBERS, REMOVE as REMOVE_SUBSCRIBER,
    },
};
/// The operations' statements (`outbox status`, dead letters, event lookup, the console's charts),
/// whose plans the tests check too.
#[cfg(feature = "test-hooks")]
pub(crate) use {
    activity::ACTIVITY,
    lookup::{AGGREGATE_ALL, AGGREGATE_UNDELIVERED, EVENT},
    ops::{COUNT_DEAD, DEAD, DISCARD, REQUEUE, STATS},
    replay::{COUNT_PUBLISHED, REPLAY, REPLAY_TO},
};

/// A statement with its parameters bound.
type Query<'q> = sqlx::query::Query<'q, Postgres, PgArguments>;
/// A statement returning one column.
type Scalar<'q, T> = sqlx::query::QueryScalar<'q, Postgres, T, PgArguments>;
/// A statement returning rows of `T`.
type Rows<'q, T> = sqlx::query::QueryAs<'q, Postgres, T, PgArguments>;

/// A transaction in which the planner uses no sequential scan, for the operations' statements
/// (status, dead letters, lookups, the console). They run on the application's pool, whose
/// connections keep a statement's plan, and a plan made while the outbox was empty, as a healthy
/// outbox often is, finds a sequential scan free; the relay's own sessions rule them out the same
/// way (`RELAY_SESSION`). tests/console_plans.rs checks every such statement.
pub(super) async fn indexes_only(
    pool: &sqlx::PgPool,
) -> Result<sqlx::Transaction<'static, Postgres>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query(INDEXES_ONLY).execute(&mut *tx).await?;
    Ok(tx)
}

/// What [`indexes_only`] sets.
#[cfg_attr(not(feature = "test-hooks"), allow(unreachable_pub))]
pub(crate) const INDEXES_ONLY: &str = "SET LOCAL enable_seqscan = off";

/// The channel the insert trigger notifies; relays LISTEN on it.
pub(crate) const NOTIFY_CHANNEL: &str = "outbox_events";

pub(crate) use super::micros;

impl super::Store for Postgres {
    async fn stats(pool: &sqlx::PgPool) -> Result<crate::stats::OutboxStats, crate::error::Error> {
        Ok(crate::stats::OutboxStats::total(&crate::stats::stats_by_type(pool).await?))
    }

    fn relay_db(pool: sqlx::PgPool) -> Result<crate::store::Db, &'static str> {
        Ok(crate::store::Db::Postgres(pool))
    }

    async fn insert_events(
        conn: &mut sqlx::PgConnection,
        shared: super::InsertShared<'_>,
        rows: &super::NewEvents,
    ) -> Result<Vec<uuid::Uuid>, sqlx::Error> {
        emit::insert_events(conn, shared, rows).await
    }

    async fn event_for_key(
        conn: &mut sqlx::PgConnection,
        aggregate_type: &str,
        idempotency_key: &str,
    ) -> Result<Option<uuid::Uuid>, sqlx::Error> {
        emit::event_for_key(conn, aggregate_type, idempotency_key).await
    }

    async fn migrate(pool: &sqlx::PgPool) -> Result<(), crate::Error> {
        crate::migrate::postgres(pool).await
    }

    async fn check_schema(pool: &sqlx::PgPool) -> Result<(), crate::Error> {
        crate::migrate::check_postgres(pool).await
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use sqlx::{Arguments, Execute};
    use uuid::Uuid;

    use super::*;
    use crate::event::EventType;
    use crate::store::{Available, Failures, InsertShared, NewEvents, Snoozes};

    /// The highest `$N` a statement names.
    fn highest_parameter(sql: &str) -> usize {
        sql.split('$')
            .skip(1)
            .filter_map(|after| {
                let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
                digits.parse().ok()
            })
            .max()
            .unwrap_or(0)
    }

    /// `(highest $N in its SQL, values bound)` of a built statement.
    pub(super) fn parameters<'q>(mut query: impl Execute<'q, Postgres>) -> (usize, usize) {
        let bound = query.take_arguments().unwrap().map_or(0, |arguments| arguments.len());
        // `&str` on sqlx 0.8; on 0.9 an `SqlStr`, for which `sql` consumes the query.
        let named = highest_parameter(AsRef::<str>::as_ref(&query.sql()));
        (named, bound)
    }

    #[test]
    fn every_statement_binds_each_parameter_its_sql_names() {
        let (ids, tokens) = (vec![Uuid::nil()], vec![Uuid::nil()]);
        let nil = Uuid::nil();
        let plan = |types| LeasePlan {
            types,
            lease_timeout: Duration::from_secs(1),
            max_expired_leases: 3,
            skip_dead_ordered: false,
        };
        let types = || {
            let mut types = TypeVersions::default();
            types.push("order", "order.placed", "", 1);
            types
        };
        let only = plan(LeaseTypes::Only(types()));
        let positions = Positions::default();
        let (from, held) = (Scan::From(&positions), Some(ids.as_slice()));
        let all = plan(LeaseTypes::All(types()));
        let mut failures = Failures::default();
        failures.push(Uuid::nil(), Uuid::nil(), "boom".to_owned(), Duration::from_secs(1), 3);
        let mut fan_outs = FanOuts::default();
        fan_outs.push(Uuid::nil(), Uuid::nil(), [("receipts", Copy::Taken)]);
        let mut snoozes = Snoozes::default();
        snoozes.push(Uuid::nil(), Uuid::nil(), Duration::from_secs(1));
        let selection = DeadSelection {
            aggregate_type: None,
            event_type: None,
            event_id: None,
            error_contains: None,
            dead_after: None,
            dead_before: None,
            subscriber: None,
        };
        let one = DeadSelection { event_id: Some(Uuid::nil()), ..selection };
        let mut rows = NewEvents::default();
        const PLACED: EventType = EventType::new("order.placed", 1, 1, false);
        rows.push(Uuid::nil(), &PLACED, "1".to_owned(), "{}".to_owned());
        let shared = |idempotency_key| InsertShared {
            aggregate_type: "order",
            headers: "{}",
            available: Available::Now,
            idempotency_key,
        };
        let at = chrono::Utc::now();
        let entry = relays::RelayEntry {
            relay_id: Uuid::nil(),
            host: "host".to_owned(),
            pid: 1,
            version: "0",
            lease_mode: "written",
            handles: vec!["order/order.placed".to_owned()],
            forwards: None,
        };
        let inbox_key = inbox::InboxKey {
            consumer: "c",
            event_id: Uuid::nil(),
            aggregate_type: "order",
            aggregate_id: "1",
            event_type: "order.placed",
            version: 1,
        };
        let headers = serde_json::json!({});
        let inbox_failure = inbox::InboxFailure {
            error: "boom",
            rejected: false,
            max_attempts: 3,
            payload: "{}",
            headers: &headers,
        };
        let statements = [
            ("lease handled", parameters(lease::lease_query(&only, Scan::Full, 10, nil, held))),
            ("lease any", parameters(lease::lease_query(&all, Scan::Full, 10, nil, held))),
            ("lease from", parameters(lease::lease_query(&all, from, 10, nil, held))),
            ("hold handled", parameters(lease::lease_query(&only, Scan::Full, 10, nil, None))),
            ("hold any", parameters(lease::lease_query(&all, Scan::Full, 10, nil, None))),
            ("hold from", parameters(lease::lease_query(&all, from, 10, nil, None))),
            ("publish", parameters(ack::publish_query(&ids, &tokens, OnPublish::Mark))),
            ("publish delete", parameters(ack::publish_query(&ids, &tokens, OnPublish::Delete))),
            ("publish one", parameters(ack::publish_one_query(nil, nil, OnPublish::Mark))),
            ("publish one delete", parameters(ack::publish_one_query(nil, nil, OnPublish::Delete))),
            ("fail", parameters(ack::fail_query(&failures))),
            ("fan out", parameters(ack::fan_out_query(&fan_outs, OnPublish::Mark))),
            ("fan out delete", parameters(ack::fan_out_query(&fan_outs, OnPublish::Delete))),
            ("register subscribers", parameters(subscribers::register_query(&[], &[], &[]))),
            ("behind", parameters(subscribers::behind_query("o", "1", false))),
            ("subscribers", parameters(subscribers::list_query())),
            ("remove subscriber", parameters(subscribers::remove_query("s"))),
            ("publish held", parameters(ack::publish_held_query(&["(0,1)"], OnPublish::Mark))),
            (
                "publish held delete",
                parameters(ack::publish_held_query(&["(0,1)"], OnPublish::Delete)),
            ),
            ("fail held", parameters(ack::fail_held_query(&failures))),
            ("snooze held", parameters(ack::snooze_held_query(&snoozes))),
            ("snooze", parameters(ack::snooze_query(&snoozes))),
            ("release", parameters(ack::release_query(&ids, &tokens))),
            ("renew", parameters(ack::renew_query(&ids, &tokens, Duration::from_secs(1)))),
            ("still leased", parameters(ack::still_leased_query(&ids, &tokens))),
            ("insert one", parameters(emit::insert_one_query(&shared(None), &rows))),
            ("insert one keyed", parameters(emit::insert_one_query(&shared(Some("k")), &rows))),
            ("insert many", parameters(emit::insert_many_query(&shared(None), &rows))),
            ("event for key", parameters(emit::event_for_key_query("order", "k"))),
            ("stats", parameters(ops::stats_query())),
            ("fresh reading", parameters(ops::fresh_reading_query(Duration::ZERO))),
            ("count lock", parameters(ops::count_lock_query())),
            ("take reading", parameters(ops::take_reading_query())),
            ("dead", parameters(ops::dead_query(&selection, None, 10))),
            ("dead one", parameters(ops::dead_query(&one, None, 10))),
            ("count dead one", parameters(ops::count_dead_query(&one))),
            ("requeue one", parameters(ops::requeue_query(&one))),
            ("discard one", parameters(ops::discard_query(&one))),
            ("requeue", parameters(ops::requeue_query(&selection))),
            ("count dead", parameters(ops::count_dead_query(&selection))),
            ("notify", parameters(ops::notify_query())),
            ("discard", parameters(ops::discard_query(&selection))),
            ("purge", parameters(ops::purge_query(Duration::from_secs(1), 10))),
            ("register", parameters(sleepers::register_query(Uuid::nil(), None, Duration::ZERO))),
            ("unregister", parameters(sleepers::unregister_query(Uuid::nil()))),
            ("inserting transactions", parameters(sleepers::inserting_transactions_query(None))),
            ("notify relays", parameters(sleepers::notify_query("check"))),
            ("heartbeat", parameters(relays::heartbeat_query(&entry, 1, 1))),
            ("inbox claim", parameters(inbox::claim_query(&inbox_key))),
            ("inbox is dead", parameters(inbox::is_dead_query("c", Uuid::nil()))),
            ("inbox fail", parameters(inbox::fail_query(&inbox_key, &inbox_failure))),
            ("inbox purge", parameters(inbox::purge_handled_query("c", Duration::ZERO, 1))),
            ("inbox dead", parameters(inbox::dead_query("c", 1))),
            ("inbox count dead", parameters(inbox::count_dead_query("c"))),
            ("inbox discard", parameters(inbox::discard_query("c", Uuid::nil()))),
            ("inbox revive", parameters(inbox::revive_query("c", Uuid::nil(), 1))),
            ("pause", parameters(pauses::pause_query("order", "order.placed", None))),
            ("resume", parameters(pauses::resume_query("order", "order.placed"))),
            ("paused", parameters(pauses::paused_query())),
            ("event", parameters(lookup::event_query(Uuid::nil()))),
            (
                "aggregate all",
                parameters(lookup::aggregate_query(lookup::AGGREGATE_ALL, "o", "1", 1)),
            ),
            (
                "aggregate undelivered",
                parameters(lookup::aggregate_query(lookup::AGGREGATE_UNDELIVERED, "o", "1", 1)),
            ),
            ("count published", parameters(replay::count_query("o", "o.p", at, at))),
            ("replay", parameters(replay::replay_query("o", "o.p", at, at))),
            ("replay to", parameters(replay::replay_to_query("s", "o", "o.p", at, at))),
            ("forget silent", parameters(relays::forget_silent_query(Duration::ZERO))),
            ("withdraw", parameters(relays::withdraw_query(Uuid::nil()))),
            ("relays", parameters(relays::relays_query())),
            ("add delivered", parameters(activity::add_delivered_query(1))),
            ("record reading", parameters(activity::record_reading_query(1, 1, None))),
            ("activity", parameters(activity::activity_query(at))),
            ("migrate lock", parameters(schema::migrate_lock_query())),
            ("find schema", parameters(schema::find_schema_query())),
            ("applied outbox", parameters(schema::applied_query(History::Outbox))),
            ("applied search path", parameters(schema::applied_query(History::SearchPath))),
        ];
        for (name, (named, bound)) in statements {
            assert_eq!(named, bound, "`{name}` names ${named} but binds {bound} values");
        }
    }

    #[test]
    fn highest_parameter_reads_multi_digit_numbers() {
        assert_eq!(highest_parameter("SELECT $1, $10::int, $2"), 10);
        assert_eq!(highest_parameter("SELECT 1"), 0);
    }
}
