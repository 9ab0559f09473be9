//! The lease: one statement that finds, locks and leases a batch of available rows.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, PgPool, Row};
use uuid::Uuid;

use super::{micros, Query};

/// A row the relay holds a lease on.
#[derive(Debug)]
pub(crate) struct LeasedEvent {
    pub(crate) event_id: Uuid,
    pub(crate) aggregate_type: String,
    pub(crate) aggregate_id: String,
    pub(crate) event_type: String,
    /// The version the payload was written at.
    pub(crate) event_version: i32,
    pub(crate) payload: String,
    pub(crate) headers: serde_json::Value,
    pub(crate) created_at: DateTime<Utc>,
    /// Failed deliveries so far.
    pub(crate) attempts: i32,
    /// Expired leases so far, the one this lease replaced included.
    pub(crate) expired_leases: i32,
    pub(crate) lease_token: Uuid,
    /// The previous lease expired and that was the last attempt: the row is now dead and must
    /// not be delivered.
    pub(crate) died: bool,
    /// Where the row stood in its type's pending index before this lease moved it.
    pub(crate) position: Position,
    /// Delivered one at a time per aggregate (and subscriber), in `seq` order.
    pub(crate) ordered: bool,
    /// The subscriber a copy is for; empty for an event as emitted.
    pub(crate) subscriber: String,
    /// A copy's event, whose id its handler sees; `None` for an event as emitted.
    pub(crate) source_event_id: Option<Uuid>,
}

impl LeasedEvent {
    /// The id of the event delivered: a copy's event's, else the row's own.
    pub(crate) fn delivered_event_id(&self) -> Uuid {
        self.source_event_id.unwrap_or(self.event_id)
    }
}

/// A row's key in the pending index within its type: `(available_at, seq)`.
pub(crate) type Position = (DateTime<Utc>, i64);

/// Where a lease starts scanning each type: past the rows the relay leased last (see
/// [`LEASE_HANDLED`]), or at the head of the index.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Scan<'a> {
    /// Every type the plan leases, from the head: finds every available row.
    Full,
    /// Only the types listed, each past its position.
    From(&'a Positions),
}

/// A lease's key: `(aggregate_type, event_type, subscriber)`, the subscriber empty for events
/// as emitted.
pub(crate) type LeaseKey = (String, String, String);

/// Per lease key, the position of the last row a relay leased, and the newest version it reads.
#[derive(Debug, Clone, Default)]
pub(crate) struct Positions(HashMap<LeaseKey, (Position, i32)>);

impl Positions {
    /// Moves each type's position to the last of `rows` (a lease's, in index order per type).
    pub(crate) fn advance<'a>(
        &mut self,
        plan: &LeasePlan,
        rows: impl IntoIterator<Item = &'a LeasedEvent>,
    ) {
        for row in rows {
            let key = (row.aggregate_type.clone(), row.event_type.clone(), row.subscriber.clone());
            match self.0.get_mut(&key) {
                Some((position, _)) => *position = row.position.max(*position),
                None => {
                    let newest = plan.types.newest_version(&key);
                    self.0.insert(key, (row.position, newest));
                }
            }
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Which event types a relay leases.
pub(crate) enum LeaseTypes {
    /// Only these types, up to their versions.
    Only(TypeVersions),
    /// Every event, but the listed types only up to their versions.
    All(TypeVersions),
}

/// `(aggregate_type, event_type, subscriber, newest version read)`, column-wise: the relay
/// leaves rows of a newer version for a relay that reads it. The subscriber is empty for events
/// as emitted, a name for that subscriber's copies.
#[derive(Debug, Clone, Default)]
pub(crate) struct TypeVersions {
    pub(crate) aggregate_types: Vec<String>,
    pub(crate) event_types: Vec<String>,
    pub(crate) subscribers: Vec<String>,
    pub(crate) versions: Vec<i32>,
}

impl LeaseTypes {
    /// The newest version of a type the relay reads (every version, for a type a relay leasing
    /// every type does not handle).
    pub(crate) fn newest_version(
        &self,
        (aggregate_type, event_type, subscriber): &LeaseKey,
    ) -> i32 {
        let (LeaseTypes::Only(types) | LeaseTypes::All(types)) = self;
        (0..types.event_types.len())
            .find(|&i| {
                types.aggregate_types[i] == *aggregate_type
                    && types.event_types[i] == *event_type
                    && types.subscribers[i] == *subscriber
            })
            .map_or(i32::MAX, |i| types.versions[i])
    }
}

impl LeaseTypes {
    /// The keys listed, each with the newest version read of it.
    pub(crate) fn listed(&self) -> Vec<(LeaseKey, i32)> {
        let (LeaseTypes::Only(types) | LeaseTypes::All(types)) = self;
        (0..types.event_types.len())
            .map(|i| {
                let key = (
                    types.aggregate_types[i].clone(),
                    types.event_types[i].clone(),
                    types.subscribers[i].clone(),
                );
                (key, types.versions[i])
            })
            .collect()
    }
}

impl TypeVersions {
    /// Adds a lease key: `subscriber` empty for the events as emitted.
    pub(crate) fn push(
        &mut self,
        aggregate_type: &str,
        event_type: &str,
        subscriber: &str,
        newest: i32,
    ) {
        self.aggregate_types.push(aggregate_type.to_owned());
        self.event_types.push(event_type.to_owned());
        self.subscribers.push(subscriber.to_owned());
        self.versions.push(newest);
    }
}

/// What every lease of a relay asks for, decided once when the relay is built.
pub(crate) struct LeasePlan {
    pub(crate) types: LeaseTypes,
    pub(crate) lease_timeout: Duration,
    pub(crate) max_expired_leases: i32,
    /// Whether a dead ordered event lets the later ones of its aggregate through.
    pub(crate) skip_dead_ordered: bool,
}

/// Whether leasing the row `e` counts an expired lease: it was leased, and not by the relay
/// leasing it now, which holds the ids `$held`.
macro_rules! expired {
    ($held:literal) => {
        concat!("(e.lease_token IS NOT NULL AND e.event_id <> ALL (", $held, "::uuid[]))")
    };
}

/// The lease statement around a `candidates` query that selects and locks the rows to lease.
///
/// The candidates are located by `ctid`, the address of the row version they locked (no other
/// statement can replace it while the lock is held): that spares a second, primary-key lookup
/// per row, and leaves the planner a single plan, so the relay can reuse it instead of
/// planning each lease anew.
///
/// The lease pushes `available_at` past the lease timeout, so the row stays invisible to every
/// other relay after this statement commits, until the lease expires. Leasing a row whose
/// previous lease expired counts that expiry (apart from failed deliveries), and kills the row
/// if it reached `$4`, the most expiries allowed; but not a row the leasing relay still holds
/// (`$held`, the ids it holds): its delivery or acknowledgement goes on under the new token, and
/// a row it is about to publish must not die under it. Each row comes back with the position it
/// had in the index before the lease moved it, where the relay's next scan of its type can
/// start.
macro_rules! lease_sql {
    ($held:literal, $($candidates:expr),+) => {
        concat!(
            "WITH candidates AS (",
            $($candidates,)+
            "), leased AS ( \
             UPDATE outbox.events e \
             SET lease_token  = $2, \
                 available_at = now() + $3::bigint * interval '1 microsecond', \
                 expired_leases = e.expired_leases + (", expired!($held), ")::int, \
                 last_error   = CASE WHEN ", expired!($held), " AND e.expired_leases + 1 >= $4 \
                                THEN format('its lease expired %s times before a relay \
                                             acknowledged it', e.expired_leases + 1) \
                                ELSE e.last_error END, \
                 dead_at      = CASE WHEN ", expired!($held), " AND e.expired_leases + 1 >= $4 \
                                THEN now() END \
             WHERE e.ctid = ANY (ARRAY(SELECT ctid FROM candidates)) \
             RETURNING e.event_id, e.aggregate_type, e.aggregate_id, e.event_type, \
                       e.payload::text, e.headers, e.created_at, e.attempts, \
                       e.expired_leases, e.dead_at IS NOT NULL AS died, e.event_version, e.seq, \
                       e.ordered, e.subscriber, e.source_event_id \
             ) \
             SELECT l.*, c.available_at FROM leased l JOIN candidates c USING (seq)"
        )
    };
}

/// The condition that keeps an ordered row `r` back while an earlier ordered event of its
/// aggregate is undelivered (leased, failing, delayed, or dead unless `$5` skips dead ones):
/// an event as emitted waits for the earlier events as emitted, a subscriber's copy for those
/// and for the subscriber's earlier copies.
/// Gap-free because an ordered emit locks its aggregate before drawing `seq`: every earlier
/// event of the aggregate was committed, and so is visible here, before `r` could exist. A copy
/// is written when its event is acknowledged, which a later event of the aggregate waits for:
/// so copies of one subscriber also take `seq` in the order of their events.
macro_rules! first_in_aggregate {
    () => {
        "(NOT r.ordered OR NOT EXISTS ( \
             SELECT 1 FROM outbox.events p \
             WHERE p.ordered AND p.published_at IS NULL \
               AND p.aggregate_type = r.aggregate_type AND p.aggregate_id = r.aggregate_id \
               AND p.seq < r.seq AND p.subscriber IN ('', r.subscriber) \
               AND (p.dead_at IS NULL OR NOT $5)))"
    };
}

/// The conditions under which `r` is a row the relay may lease of the key `h` (`aggregate_type`,
/// `event_type`, `subscriber`, `newest_version`), with `(r.available_at, r.seq)` then
/// `$position` (a comparison with a position, for the index scan to start at).
macro_rules! leasable {
    ($position:expr) => {
        concat!(
            "r.aggregate_type = h.aggregate_type AND r.event_type = h.event_type \
             AND r.subscriber = h.subscriber AND (r.available_at, r.seq) ",
            $position,
            " AND r.published_at IS NULL AND r.dead_at IS NULL AND r.available_at <= now() \
             AND r.event_version <= h.newest_version AND ",
            first_in_aggregate!()
        )
    };
}

/// Selects and locks up to `$1` available rows of the types in `types` (a relation of
/// `aggregate_type, event_type, newest_version, from_at, from_seq`) up to their newest version,
/// past `(from_at, from_seq)` (from the head where NULL), the oldest of each type first: short
/// scans of the `events_pending_by_type` index, two or three per type, so rows of other types
/// cost nothing however many pile up.
///
/// Only the rows it returns are locked. A first version locked up to `$1` rows of every type
/// (`LIMIT $1 FOR UPDATE SKIP LOCKED` inside the join) and kept the oldest `$1` of them: a lease
/// of 1,000 over 50 types with a backlog locked 50,000 rows, each lock a tuple header write and
/// a WAL record (51,000 lock records and 2.8 MB of WAL, against 2,000 and 108 kB for the same
/// 1,000 rows now), and other relays skipped the 49,000 rows nobody leased: one relay drained
/// such a backlog at 0.29x the rate of the same backlog in one type, 0.96x now (BENCHMARKS.md,
/// `types`).
/// Now each type gets a share of `$1` in proportion to how long its oldest available row (its
/// head) has waited, and locks no more than that:
/// - `heads`: each type's head, read without locking it (an index probe, `LIMIT 1`), and its
///   part: how long it has waited over the total of its own wait and those of the older heads,
///   the types still to come when its turn comes (1 for the oldest). Types without an
///   available row drop out here.
/// - `turns`: the types with a head, youngest head first, as arrays the next step indexes;
///   `MATERIALIZED`, or the planner inlines it into the recursive step, which then probes every
///   head again at each turn (2,550 probes for 50 types: `tests/plans.rs` caught it).
/// - `taken`, a first lap: type by type, youngest head first, locks up to
///   `floor(remaining * part)` rows of the type from its head (the scan starts there, not at
///   the position, so it steps over nothing the probe stepped over) with `SKIP LOCKED` (rows
///   another relay is leasing are left to it), and passes what it did not take on. The oldest
///   head comes last and gets everything left (its part is 1): so what a young type with a few
///   rows leaves of its share goes to the older ones, those with a backlog; and the type waiting
///   longest always gets a row, however small `$1` (what is left when it comes is at least its
///   share of `$1`, so at least one).
/// - `taken`, a second lap, only while rows are left to take (the oldest type ran out, or other
///   relays hold its rows): oldest head first, each type that filled its share takes what is
///   left, past the last row it took. So a lease comes back short only when no type has more to
///   lease, which is what the relay's cursor and lease sizing read a short lease as (`pace.rs`,
///   `cursor.rs`). A type that gave out in the first lap (took less than its share) is skipped.
///
/// Shares by waiting time keep the delivery close to oldest first across types without reading
/// more than each type's head: a type that falls behind gets more of the next lease, and one
/// leased less than its rows keeps its head and grows older until its share catches up, so none
/// starves; a young type gets a row once its head has waited about the oldest head's wait over
/// `$1`. `waited` gets a millisecond more than it waited, so heads that became available at this
/// very instant still share. A head that landed long ago (an event scheduled in the past) makes
/// its type take most of one lease, as oldest-first would. Each type's rows come oldest first,
/// and rows of one ordered aggregate never two at a time: `first_in_aggregate!` sees the rows
/// this statement already locked as undelivered.
macro_rules! oldest_per_type {
    ($types:expr) => {
        concat!(
            "WITH RECURSIVE heads AS ( \
                 SELECT h.aggregate_type, h.event_type, h.subscriber, h.newest_version, \
                        f.available_at, f.seq, \
                        CASE WHEN row_number() OVER by_age = 1 THEN 1 \
                             ELSE f.waited / sum(f.waited) OVER (by_age ROWS UNBOUNDED PRECEDING) \
                        END AS part \
                 FROM ",
            $types,
            " AS h(aggregate_type, event_type, subscriber, newest_version, from_at, from_seq) \
                 CROSS JOIN LATERAL ( \
                     SELECT r.available_at, r.seq, \
                            extract(epoch FROM now() - r.available_at)::float8 + 0.001 AS waited \
                     FROM outbox.events r WHERE ",
            leasable!("> (coalesce(h.from_at, '-infinity'), coalesce(h.from_seq, 0))"),
            " \
                     ORDER BY r.available_at, r.seq LIMIT 1 \
                 ) f \
                 WINDOW by_age AS (ORDER BY f.available_at, f.seq) \
             ), turns AS MATERIALIZED ( \
                 SELECT array_agg(aggregate_type ORDER BY available_at DESC, seq DESC) AS aggregate_types, \
                        array_agg(event_type ORDER BY available_at DESC, seq DESC) AS event_types, \
                        array_agg(subscriber ORDER BY available_at DESC, seq DESC) AS subscribers, \
                        array_agg(newest_version ORDER BY available_at DESC, seq DESC) AS versions, \
                        array_agg(available_at ORDER BY available_at DESC, seq DESC) AS head_ats, \
                        array_agg(seq ORDER BY available_at DESC, seq DESC) AS head_seqs, \
                        array_agg(part ORDER BY available_at DESC, seq DESC) AS parts \
                 FROM heads \
             ), taken(turn, remaining, ctids, ats, seqs, after_ats, after_seqs) AS ( \
                 SELECT 0, $1::bigint, NULL::tid[], NULL::timestamptz[], NULL::int8[], \
                        '{}'::timestamptz[], '{}'::int8[] \
                 UNION ALL \
                 SELECT t.turn + 1, t.remaining - l.taken, l.ctids, l.ats, l.seqs, \
                        CASE WHEN n.first_lap THEN t.after_ats || \
                             CASE WHEN l.taken < h.take THEN NULL \
                                  ELSE coalesce(l.last_at, h.from_at) END \
                             ELSE t.after_ats END, \
                        CASE WHEN n.first_lap THEN t.after_seqs || \
                             CASE WHEN l.taken < h.take THEN NULL \
                                  ELSE coalesce(l.last_seq, h.from_seq) END \
                             ELSE t.after_seqs END \
                 FROM taken t CROSS JOIN turns o \
                 CROSS JOIN LATERAL ( \
                     SELECT t.turn < cardinality(o.parts) AS first_lap, \
                            CASE WHEN t.turn < cardinality(o.parts) THEN t.turn + 1 \
                                 ELSE 2 * cardinality(o.parts) - t.turn END AS k \
                 ) n \
                 CROSS JOIN LATERAL ( \
                     SELECT o.aggregate_types[n.k] AS aggregate_type, \
                            o.event_types[n.k] AS event_type, \
                            o.subscribers[n.k] AS subscriber, \
                            o.versions[n.k] AS newest_version, \
                            CASE WHEN n.first_lap THEN o.head_ats[n.k] \
                                 ELSE t.after_ats[n.k] END AS from_at, \
                            CASE WHEN n.first_lap THEN o.head_seqs[n.k] - 1 \
                                 ELSE t.after_seqs[n.k] END AS from_seq, \
                            CASE WHEN n.first_lap THEN floor(t.remaining * o.parts[n.k])::bigint \
                                 WHEN t.after_seqs[n.k] IS NULL THEN 0 \
                                 ELSE t.remaining END AS take \
                 ) h \
                 CROSS JOIN LATERAL ( \
                     SELECT count(*) AS taken, array_agg(c.ctid) AS ctids, \
                            array_agg(c.available_at) AS ats, array_agg(c.seq) AS seqs, \
                            (array_agg(c.available_at ORDER BY c.available_at DESC, c.seq DESC))[1] \
                                AS last_at, \
                            (array_agg(c.seq ORDER BY c.available_at DESC, c.seq DESC))[1] \
                                AS last_seq \
                     FROM ( \
                         SELECT r.ctid, r.available_at, r.seq FROM outbox.events r WHERE ",
            leasable!("> (h.from_at, h.from_seq)"),
            " \
                         ORDER BY r.available_at, r.seq \
                         LIMIT h.take \
                         FOR UPDATE SKIP LOCKED \
                     ) c \
                 ) l \
                 WHERE t.remaining > 0 AND t.turn < 2 * cardinality(o.parts) \
             ) \
             SELECT c.ctid, c.available_at, c.seq \
             FROM taken t, unnest(t.ctids, t.ats, t.seqs) AS c(ctid, available_at, seq)"
        )
    };
}

/// Selects and locks up to `$1` available rows of the one type in `types` (as for
/// [`oldest_per_type!`]), oldest first, and returns their `columns` (of `r`): one scan of the
/// `events_pending_by_type` index, as a hand-written query would. With a single type there is
/// nothing to share out, so the turns of [`oldest_per_type!`] only cost (a third of a lease of
/// 870 rows, measured).
macro_rules! one_type {
    ($types:expr, $columns:expr) => {
        concat!(
            "SELECT c.* FROM ",
            $types,
            " AS h(aggregate_type, event_type, subscriber, newest_version, from_at, from_seq) \
             CROSS JOIN LATERAL ( \
                 SELECT ",
            $columns,
            " FROM outbox.events r WHERE ",
            leasable!("> (coalesce(h.from_at, '-infinity'), coalesce(h.from_seq, 0))"),
            " \
                 ORDER BY r.available_at, r.seq \
                 LIMIT $1 \
                 FOR UPDATE SKIP LOCKED \
             ) c"
        )
    };
}

/// Whether the type of `t` (a relation with `aggregate_type` and `event_type`) is not paused: a
/// primary-key probe of `outbox.paused_types` per type, not per row.
macro_rules! not_paused {
    ($t:literal) => {
        concat!(
            "NOT EXISTS (SELECT 1 FROM outbox.paused_types p WHERE p.aggregate_type = ",
            $t,
            ".aggregate_type AND p.event_type = ",
            $t,
            ".event_type)"
        )
    };
}

/// The keys a lease of the handled types reads: `$6` to `$9`, each past `$10`, `$11`; those of
/// types not paused.
macro_rules! handled_types {
    () => {
        concat!(
            "(SELECT * FROM UNNEST($6::text[], $7::text[], $8::text[], $9::int4[], \
                                   $10::timestamptz[], $11::int8[]) \
                 AS t(aggregate_type, event_type, subscriber, newest_version, from_at, from_seq) \
             WHERE ",
            not_paused!("t"),
            ")"
        )
    };
}

/// Every type with pending rows and not paused, its events as emitted, those in `$6` to `$9` up
/// to their versions, from the head: a skip scan of the per-type index (one probe per type), not
/// an index of their own; and the subscribers' copies listed there.
macro_rules! pending_types {
    () => {
        concat!("(WITH RECURSIVE pending_types AS ( \
         (SELECT r.aggregate_type, r.event_type FROM outbox.events r \
          WHERE r.published_at IS NULL AND r.dead_at IS NULL \
          ORDER BY r.aggregate_type, r.event_type LIMIT 1) \
         UNION ALL \
         SELECT n.aggregate_type, n.event_type FROM pending_types t CROSS JOIN LATERAL ( \
             SELECT r.aggregate_type, r.event_type FROM outbox.events r \
             WHERE r.published_at IS NULL AND r.dead_at IS NULL \
               AND (r.aggregate_type, r.event_type) > (t.aggregate_type, t.event_type) \
             ORDER BY r.aggregate_type, r.event_type LIMIT 1 \
         ) n \
     ) \
     SELECT t.aggregate_type, t.event_type, '', coalesce(v.newest, 2147483647), \
            NULL::timestamptz, NULL::int8 \
     FROM pending_types t \
     LEFT JOIN UNNEST($6::text[], $7::text[], $8::text[], $9::int4[]) \
         AS v(aggregate_type, event_type, subscriber, newest) \
     ON v.aggregate_type = t.aggregate_type AND v.event_type = t.event_type AND v.subscriber = '' \
     WHERE ", not_paused!("t"), " \
     UNION ALL \
     SELECT v.aggregate_type, v.event_type, v.subscriber, v.newest, NULL::timestamptz, NULL::int8 \
     FROM UNNEST($6::text[], $7::text[], $8::text[], $9::int4[]) \
         AS v(aggregate_type, event_type, subscriber, newest) \
     WHERE v.subscriber <> '' AND ", not_paused!("v"), ")")
    };
}

/// Leases the oldest available rows of the keys `$6` to `$9` (up to their versions), each past
/// the position `$10`, `$11`; all column-wise. `$12`: the rows the relay holds.
///
/// A row removed from the pending rows (leased, published, deleted) leaves its index entry
/// behind, dead, at the head of the index, where every scan from the head steps over it until
/// vacuum removes it: on a large backlog, more with every row drained, so a drain slowed as it
/// went (a lease of 100 rows read 2,500 index pages after 300,000 rows, against 6 at the start).
/// So while a relay drains a backlog, each lease starts past the last row its previous lease
/// took of the type; it reads from the head (NULL) again once it has caught up, and at
/// least once a second, for the rows that land behind that position (a transaction that
/// committed late, an event scheduled in the past).
pub(crate) const LEASE_HANDLED: &str = lease_sql!("$12", oldest_per_type!(handled_types!()));

/// [`LEASE_HANDLED`] for a single key (`$6` to `$11` hold one element each).
pub(crate) const LEASE_ONE: &str =
    lease_sql!("$12", one_type!(handled_types!(), "r.ctid, r.available_at, r.seq"));

/// Leases the oldest available rows of any type, those in `$6` to `$9` up to their versions, and
/// the copies of the subscribers listed there (`$10`: the rows the relay holds).
pub(crate) const LEASE_ANY: &str = lease_sql!("$10", oldest_per_type!(pending_types!()));

/// What the held-transaction lease returns of each row `r`, in [`lease_sql!`]'s order, then
/// the address of the row version it locked (see [`hold`]).
macro_rules! held_columns {
    () => {
        "r.event_id, r.aggregate_type, r.aggregate_id, r.event_type, r.payload::text, r.headers, \
         r.created_at, r.attempts, r.expired_leases, false AS died, r.event_version, r.seq, \
         r.ordered, r.subscriber, r.source_event_id, r.available_at, r.ctid::text"
    };
}

/// The held-transaction lease (`LeaseMode::HeldTransaction`) around a `candidates` query: it
/// only reads the rows the candidates locked, by `ctid`, and writes nothing. The row locks are
/// the lease: they last until the relay's transaction ends, and every other relay skips the
/// rows meanwhile. The rows come back as [`lease_sql!`] returns them (with `died` false: no
/// expired lease is counted), so one reader serves both; `available_at` is unchanged, so it is
/// the row's position.
macro_rules! hold_sql {
    ($($candidates:expr),+) => {
        concat!(
            "WITH candidates AS (",
            $($candidates,)+
            ") SELECT ",
            held_columns!(),
            " FROM outbox.events r WHERE r.ctid = ANY (ARRAY(SELECT ctid FROM candidates))"
        )
    };
}

/// [`LEASE_HANDLED`] in a held transaction: locks and reads, writes nothing. Binds what
/// `LEASE_HANDLED` binds but the held rows; `$2` to `$4` are unused.
pub(crate) const HOLD_HANDLED: &str = hold_sql!(oldest_per_type!(handled_types!()));

/// [`LEASE_ONE`] in a held transaction, as [`HOLD_HANDLED`] is [`LEASE_HANDLED`]: the rows
/// come straight from the scan that locks them.
pub(crate) const HOLD_ONE: &str = one_type!(handled_types!(), held_columns!());

/// [`LEASE_ANY`] in a held transaction, as [`HOLD_HANDLED`] is [`LEASE_HANDLED`].
pub(crate) const HOLD_ANY: &str = hold_sql!(oldest_per_type!(pending_types!()));

/// The settings of the relay's own connections. Each statement is planned once and the plan
/// reused (planning each lease took a fifth of its time), so that plan must stay index-driven
/// however small the table was when it was made, and whatever its statistics say (an outbox is
/// usually empty when it was last analyzed): no sequential scans (one planned on an empty
/// outbox took 14 ms a lease once it held 10,000 rows). And no JIT, which a reused plan's cost
/// estimate, with its row counts unknown, would trigger on every statement. The statements are
/// written so that their indexes are the only other way (see `ack.rs`).
pub(crate) const RELAY_SESSION: &str =
    "SET plan_cache_mode = force_generic_plan; SET enable_seqscan = off; SET jit = off";

/// Sets how long the server lets a transaction of this session wait for its next statement
/// (`idle_in_transaction_session_timeout`), for the rest of the session.
pub(crate) async fn set_idle_in_transaction_timeout(
    conn: &mut PgConnection,
    timeout: Duration,
) -> Result<(), sqlx::Error> {
    let millis = i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX).max(1);
    sqlx::query("SELECT set_config('idle_in_transaction_session_timeout', $1, false)")
        .bind(format!("{millis}ms"))
        .execute(conn)
        .await?;
    Ok(())
}

/// Leases up to `limit` available rows in one statement under a fresh fencing token; `held`:
/// the rows the relay holds, whose expired leases it does not count when it leases them again.
pub(crate) async fn lease(
    pool: &PgPool,
    plan: &LeasePlan,
    scan: Scan<'_>,
    limit: i64,
    held: &[Uuid],
) -> Result<Vec<LeasedEvent>, sqlx::Error> {
    let token = Uuid::new_v4();
    let rows = lease_query(plan, scan, limit, token, Some(held)).fetch_all(pool).await?;
    rows.iter().map(|row| leased_event(row, token)).collect()
}

/// Locks up to `limit` available rows in the transaction `tx` and reads them, writing nothing
/// (see [`HOLD_HANDLED`]): they stay leased until `tx` ends. Their `lease_token` is `token`,
/// for the relay's bookkeeping only. Each comes with its [`RowAddress`].
pub(crate) async fn hold(
    tx: &mut PgConnection,
    plan: &LeasePlan,
    scan: Scan<'_>,
    limit: i64,
    token: Uuid,
) -> Result<Vec<(LeasedEvent, RowAddress)>, sqlx::Error> {
    let rows = lease_query(plan, scan, limit, token, None).fetch_all(tx).await?;
    rows.iter().map(|row| Ok((leased_event(row, token)?, RowAddress(row.try_get(16)?)))).collect()
}

/// Where a held row's locked version lies (its `ctid`, as text): it cannot move while the
/// transaction holding the lock lives, so that transaction's statements find the row by it,
/// without a primary-key lookup (a delete of 870 rows took 0.8–1.2 ms so, 1.9–2.7 ms by key).
#[derive(Debug, Clone)]
pub(crate) struct RowAddress(pub(crate) String);

fn leased_event(row: &PgRow, token: Uuid) -> Result<LeasedEvent, sqlx::Error> {
    Ok(LeasedEvent {
        event_id: row.try_get(0)?,
        aggregate_type: row.try_get(1)?,
        aggregate_id: row.try_get(2)?,
        event_type: row.try_get(3)?,
        payload: row.try_get(4)?,
        headers: row.try_get(5)?,
        created_at: row.try_get(6)?,
        attempts: row.try_get(7)?,
        expired_leases: row.try_get(8)?,
        died: row.try_get(9)?,
        event_version: row.try_get(10)?,
        position: (row.try_get(15)?, row.try_get(11)?),
        ordered: row.try_get(12)?,
        subscriber: row.try_get(13)?,
        source_event_id: row.try_get(14)?,
        lease_token: token,
    })
}

/// `$1` limit, `$2` token, `$3` lease in microseconds, `$4` most expired leases, `$5` skip dead
/// ordered events, `$6` to `$9` the keys and their newest versions, and for
/// [`LEASE_HANDLED`] `$10`, `$11` where each key's scan starts; all column-wise; then the held
/// rows (`$12`, or `$10` for [`LEASE_ANY`]). `held` `None`: the held-transaction statements
/// ([`HOLD_HANDLED`], [`HOLD_ANY`]), which take no held rows.
pub(super) fn lease_query<'q>(
    plan: &'q LeasePlan,
    scan: Scan<'_>,
    limit: i64,
    token: Uuid,
    held: Option<&'q [Uuid]>,
) -> Query<'q> {
    let (handled, one, any) = match held {
        Some(_) => (LEASE_HANDLED, LEASE_ONE, LEASE_ANY),
        None => (HOLD_HANDLED, HOLD_ONE, HOLD_ANY),
    };
    let handled = |types: usize| if types == 1 { one } else { handled };
    let query = |sql| {
        sqlx::query(sql)
            .bind(limit)
            .bind(token)
            .bind(micros(plan.lease_timeout))
            .bind(plan.max_expired_leases)
            .bind(plan.skip_dead_ordered)
    };
    let query = match (scan, &plan.types) {
        (Scan::Full, LeaseTypes::All(types)) => query(any)
            .bind(&types.aggregate_types)
            .bind(&types.event_types)
            .bind(&types.subscribers)
            .bind(&types.versions),
        (Scan::Full, LeaseTypes::Only(types)) => {
            let head = types.event_types.len();
            query(handled(head))
                .bind(&types.aggregate_types)
                .bind(&types.event_types)
                .bind(&types.subscribers)
                .bind(&types.versions)
                .bind(vec![None::<DateTime<Utc>>; head])
                .bind(vec![None::<i64>; head])
        }
        (Scan::From(positions), _) => {
            let mut columns =
                (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for ((aggregate_type, event_type, subscriber), ((at, seq), newest)) in &positions.0 {
                columns.0.push(aggregate_type.clone());
                columns.1.push(event_type.clone());
                columns.2.push(subscriber.clone());
                columns.3.push(*newest);
                columns.4.push(*at);
                columns.5.push(*seq);
            }
            query(handled(columns.0.len()))
                .bind(columns.0)
                .bind(columns.1)
                .bind(columns.2)
                .bind(columns.3)
                .bind(columns.4)
                .bind(columns.5)
        }
    };
    match held {
        Some(held) => query.bind(held),
        None => query,
    }
}
