//! The relay's statements, for this repository's tests: the plan tests prepare them on an empty
//! outbox, and the model-based test drives them one at a time. Not for applications: the relay
//! drives these, and none of it is covered by semver.

/// The settings of the relay's own connections.
pub const RELAY_SESSION: &str = crate::store::RELAY_SESSION;

/// The relay's default lease statement. Parameters: `$1` limit, `$2` token, `$3` lease micros,
/// `$4` most expired leases, `$5` skip dead ordered events, `$6` to `$9` handled aggregate
/// types, event types, subscribers (empty for the events as emitted) and the newest version read
/// of each, `$10`, `$11` the `(available_at, seq)` each key's scan starts after (NULL: from the
/// head), `$12` the ids the relay holds.
pub const LEASE: &str = crate::store::LEASE_HANDLED;
/// The lease of a relay that takes every event type (`UnknownEvents::Fail`), from the head:
/// parameters as [`LEASE`] up to `$9`, which cap the versions of the types listed, then `$10`
/// the ids the relay holds.
pub const LEASE_ANY: &str = crate::store::LEASE_ANY;
/// `$1` ids, `$2` tokens.
pub const PUBLISH: &str = crate::store::PUBLISH;
/// `$1` ids, `$2` tokens, `$3` `{"<id>": ["error", retry micros, most attempts]}`.
pub const FAIL: &str = crate::store::FAIL;
/// `$1` ids, `$2` tokens, `$3` `{"<id>": delay micros}`.
pub const SNOOZE: &str = crate::store::SNOOZE;
/// The acknowledgement of events delivered to subscribers: `$1` ids, `$2` tokens, `$3`
/// `{"<id>": {"<subscriber>": null | [error, delay micros, attempts, dead]}}`.
pub const FAN_OUT: &str = crate::store::FAN_OUT;
/// [`FAN_OUT`] of a relay that deletes published rows.
pub const FAN_OUT_DELETE: &str = crate::store::FAN_OUT_DELETE;
/// The subscribers an ordered event waits for: `$1` aggregate type, `$2` aggregate id, `$3` skip
/// dead events.
pub const BEHIND: &str = crate::store::BEHIND;
/// Registers subscribers: `$1` aggregate types, `$2` event types, `$3` names.
pub const REGISTER_SUBSCRIBERS: &str = crate::store::REGISTER_SUBSCRIBERS;
/// `$1` ids, `$2` tokens.
pub const RELEASE: &str = crate::store::RELEASE;
/// `$1` ids, `$2` tokens, `$3` lease micros.
pub const RENEW: &str = crate::store::RENEW;
/// `$1` ids, `$2` tokens.
pub const STILL_LEASED: &str = crate::store::STILL_LEASED;
/// A transactional handler's acknowledgement: `$1` id, `$2` token.
pub const PUBLISH_ONE: &str = crate::store::PUBLISH_ONE;
/// [`PUBLISH`] of a relay that deletes published rows: `$1` ids, `$2` tokens.
pub const PUBLISH_DELETE: &str = crate::store::PUBLISH_DELETE;
/// [`PUBLISH_ONE`] of a relay that deletes published rows: `$1` id, `$2` token.
pub const PUBLISH_ONE_DELETE: &str = crate::store::PUBLISH_ONE_DELETE;
/// [`LEASE`] for a relay of one lease key (`$6` to `$11` of one element each), which leases
/// with a single index scan: parameters as [`LEASE`].
pub const LEASE_ONE: &str = crate::store::LEASE_ONE;
/// The held-transaction lease (`LeaseMode::HeldTransaction`): parameters as [`LEASE`] but the
/// last (`$2` to `$4` unused); locks and reads, writes nothing.
pub const HOLD: &str = crate::store::HOLD_HANDLED;
/// [`HOLD`] for a relay of one event type: parameters as [`HOLD`].
pub const HOLD_ONE: &str = crate::store::HOLD_ONE;
/// [`LEASE_ANY`] in a held transaction: parameters as [`LEASE_ANY`] but the last.
pub const HOLD_ANY: &str = crate::store::HOLD_ANY;
/// Marks rows of a held transaction published: `$1` ids.
pub const HELD_PUBLISH: &str = crate::store::HELD_PUBLISH;
/// Deletes rows of a held transaction: `$1` ids.
pub const HELD_PUBLISH_DELETE: &str = crate::store::HELD_PUBLISH_DELETE;
/// Failures of rows of a held transaction: `$1` ids, `$2` as [`FAIL`]'s `$3`.
pub const HELD_FAIL: &str = crate::store::HELD_FAIL;
/// Snoozes of rows of a held transaction: `$1` ids, `$2` as [`SNOOZE`]'s `$3`.
pub const HELD_SNOOZE: &str = crate::store::HELD_SNOOZE;
/// Retention: `$1` age in micros, `$2` most rows.
pub const PURGE_PUBLISHED: &str = crate::store::PURGE_PUBLISHED;
/// The inbox's claim of a message (`inbox::Inbox::receive`).
pub const INBOX_CLAIM: &str = crate::store::INBOX_CLAIM;
/// Whether a settled inbox message is dead.
pub const INBOX_IS_DEAD: &str = crate::store::INBOX_IS_DEAD;
/// A failed inbox message's record.
pub const INBOX_FAIL: &str = crate::store::INBOX_FAIL;
/// `Inbox::purge_handled`'s statement.
pub const INBOX_PURGE_HANDLED: &str = crate::store::INBOX_PURGE_HANDLED;
/// `inbox::dead_letters::list`.
pub const INBOX_DEAD: &str = crate::store::INBOX_DEAD;
/// `inbox::dead_letters::count`.
pub const INBOX_COUNT_DEAD: &str = crate::store::INBOX_COUNT_DEAD;
/// `inbox::dead_letters::discard`.
pub const INBOX_DISCARD: &str = crate::store::INBOX_DISCARD;
/// `Inbox::requeue_dead`'s revival of the row.
pub const INBOX_REVIVE: &str = crate::store::INBOX_REVIVE;
/// What the operations' transactions set before their statements.
pub const INDEXES_ONLY: &str = crate::store::INDEXES_ONLY;
/// `stats_by_type`: no parameters.
pub const STATS: &str = crate::store::STATS;
/// A page of dead letters, `[by time range, by event id]`: `$1` aggregate type, `$2` event
/// type, `$3` event id, `$4` error text, `$5` died since, `$6` died before, `$7` after this id,
/// `$8` rows.
pub const DEAD: [&str; 2] = crate::store::DEAD;
/// How many dead letters match, `[by time range, by event id]`: `$1..$6` as [`DEAD`].
pub const COUNT_DEAD: [&str; 2] = crate::store::COUNT_DEAD;
/// Requeues dead letters, `[by time range, by event id]`: `$1..$6` as [`DEAD`].
pub const REQUEUE: [&str; 2] = crate::store::REQUEUE;
/// Discards dead letters, `[by time range, by event id]`: `$1..$6` as [`DEAD`].
pub const DISCARD: [&str; 2] = crate::store::DISCARD;
/// An event by id: `$1`.
pub const EVENT: &str = crate::store::EVENT;
/// An aggregate's undelivered ordered events: `$1` aggregate type, `$2` id, `$3` rows.
pub const AGGREGATE_UNDELIVERED: &str = crate::store::AGGREGATE_UNDELIVERED;
/// An aggregate's events, on the optional index: `$1..$3` as [`AGGREGATE_UNDELIVERED`].
pub const AGGREGATE_ALL: &str = crate::store::AGGREGATE_ALL;
/// The relays' activity since `$1`.
pub const ACTIVITY: &str = crate::store::ACTIVITY;
/// Published rows of a type in a time range (replay's count): `$1` aggregate type, `$2` event
/// type, `$3` from, `$4` until.
pub const COUNT_PUBLISHED: &str = crate::store::COUNT_PUBLISHED;
/// Replays them: `$1..$4` as [`COUNT_PUBLISHED`].
pub const REPLAY: &str = crate::store::REPLAY;
/// Replays them to one subscriber: `$1..$4` as [`COUNT_PUBLISHED`], `$5` the subscriber.
pub const REPLAY_TO: &str = crate::store::REPLAY_TO;
/// The registered subscribers with their pending and dead copies.
pub const SUBSCRIBERS: &str = crate::store::SUBSCRIBERS;
/// Removes a subscriber: `$1` its name.
pub const REMOVE_SUBSCRIBER: &str = crate::store::REMOVE_SUBSCRIBER;

/// The relays' shared reading for their gauges, at most `max_age` old: `None` while another
/// caller takes it.
pub async fn shared_stats_by_type(
    pool: &sqlx::PgPool,
    max_age: std::time::Duration,
) -> Result<Option<Vec<crate::TypeStats>>, crate::Error> {
    crate::stats::shared_stats_by_type(pool, max_age).await
}

/// The relay's statements one at a time, for the model-based test that checks the table's
/// invariants after every step.
pub mod steps {
    use std::time::Duration;

    use sqlx::PgPool;
    use uuid::Uuid;

    use crate::store::{self, Failures, LeasePlan, LeaseTypes, TypeVersions};

    /// A leased row: `(event id, token, attempts, expired leases, died on expiry)`.
    pub type Leased = (Uuid, Uuid, i32, i32, bool);

    /// Leases up to `limit` rows of the given `(aggregate_type, event_type)` pairs with the
    /// relay's default statement, as a relay that holds the rows `held`.
    pub async fn lease(
        pool: &PgPool,
        types: &[(&str, &str)],
        limit: i64,
        lease_timeout: Duration,
        max_expired_leases: i32,
        skip_dead_ordered: bool,
        held: &[Uuid],
    ) -> Result<Vec<Leased>, sqlx::Error> {
        let mut versions = TypeVersions::default();
        for &(aggregate_type, event_type) in types {
            versions.push(aggregate_type, event_type, "", i32::MAX);
        }
        let plan = LeasePlan {
            types: LeaseTypes::Only(versions),
            lease_timeout,
            max_expired_leases,
            skip_dead_ordered,
        };
        let rows = store::lease(pool, &plan, store::Scan::Full, limit, held).await?;
        Ok(rows
            .into_iter()
            .map(|r| (r.event_id, r.lease_token, r.attempts, r.expired_leases, r.died))
            .collect())
    }

    /// Publishes under `token`; whether the lease was still valid.
    pub async fn publish(pool: &PgPool, event_id: Uuid, token: Uuid) -> Result<bool, sqlx::Error> {
        let done = store::publish(pool, &[event_id], &[token], store::OnPublish::Mark).await?;
        Ok(!done.is_empty())
    }

    /// Records a failure under `token`; `None` if refused, else whether the row died.
    pub async fn fail(
        pool: &PgPool,
        event_id: Uuid,
        token: Uuid,
        error: &str,
        retry_in: Duration,
        max_attempts: i32,
    ) -> Result<Option<bool>, sqlx::Error> {
        let mut failures = Failures::default();
        failures.push(event_id, token, error.to_owned(), retry_in, max_attempts.unsigned_abs());
        let recorded = store::fail(pool, &failures).await?;
        Ok(recorded.first().map(|&(_, dead)| dead))
    }

    /// Hands a row back under `token`; whether the lease was still valid.
    pub async fn release(pool: &PgPool, event_id: Uuid, token: Uuid) -> Result<bool, sqlx::Error> {
        Ok(!store::release(pool, &[event_id], &[token]).await?.is_empty())
    }

    /// Renews a lease under `token`; whether it was still valid.
    pub async fn renew(
        pool: &PgPool,
        event_id: Uuid,
        token: Uuid,
        lease_timeout: Duration,
    ) -> Result<bool, sqlx::Error> {
        Ok(!store::renew(pool, &[event_id], &[token], lease_timeout).await?.is_empty())
    }
}

/// The relay's statements on SQLite, by name, for the plan test: each is planned as written
/// (unbound parameters are NULL, which changes no plan).
#[cfg(feature = "sqlite")]
pub mod sqlite {
    use crate::store::sqlite::{ops, relay};

    /// Every one, named.
    pub const ALL: &[(&str, &str)] = &[
        ("lease candidates", relay::CANDIDATES),
        ("next pending type", relay::NEXT_PENDING_TYPE),
        ("lease", relay::LEASE),
        ("lease expired", relay::LEASE_EXPIRED),
        ("publish", relay::PUBLISH),
        ("publish delete", relay::PUBLISH_DELETE),
        ("fail", relay::FAIL),
        ("release", relay::RELEASE),
        ("snooze", relay::SNOOZE),
        ("renew", relay::RENEW),
        ("still leased", relay::STILL_LEASED),
        ("purge published", relay::PURGE_PUBLISHED),
        ("stats", ops::STATS),
    ];
}

/// The relay's statements on MySQL and MariaDB, by name, for the plan test.
#[cfg(feature = "mysql")]
pub mod mysql {
    use crate::store::mysql::{ops, relay};

    /// Every one, named.
    pub const ALL: &[(&str, &str)] = &[
        ("head", relay::HEAD),
        ("lease candidates", relay::CANDIDATES),
        ("next pending type", relay::NEXT_PENDING_TYPE),
        ("lease", relay::LEASE),
        ("leased", relay::LEASED),
        ("fenced", relay::FENCED),
        ("still leased", relay::STILL_LEASED),
        ("publish", relay::PUBLISH),
        ("publish delete", relay::PUBLISH_DELETE),
        ("fail", relay::FAIL),
        ("release", relay::RELEASE),
        ("snooze", relay::SNOOZE),
        ("renew", relay::RENEW),
        ("purge published", relay::PURGE_PUBLISHED),
        ("stats", ops::STATS),
    ];
}
