//! The lease statement over many event types: what each type gets of a lease.
//!
//! A lease locks only the rows it returns: each type a share of the limit by how long its oldest
//! available row (its head) has waited, what a type cannot fill going to the types with older
//! heads (`oldest_per_type!` in `store/lease.rs`). These tests run the relay's statement itself,
//! one lease at a time, and check:
//! - a lease over types with a backlog each comes back full, every type in it;
//! - what young types with a few rows leave goes to the old one with a backlog: still full;
//! - however small the lease, the type waiting longest is served first;
//! - two relays leasing at once take disjoint rows, and both come back full;
//! - a lease past the positions of the previous one takes only rows past them, in every type.

mod support;

use std::collections::{BTreeMap, HashSet};

use chrono::{DateTime, Utc};
use sqlx::{PgExecutor, PgPool, Row};
use support::*;
use uuid::Uuid;

use outbox_runtime::__private::test_hooks as hooks;

/// One leased row: its event type, `seq`, and its position before the lease.
#[derive(Debug, Clone, PartialEq)]
struct Leased {
    event_type: String,
    seq: i64,
    position: (DateTime<Utc>, i64),
}

/// The event type `account.t{n:02}`.
fn type_name(n: usize) -> String {
    format!("account.t{n:02}")
}

/// Runs the relay's lease over `types` (aggregate `account`), from the head of each or past
/// `positions` (one per type, in the order of `types`), for up to `limit` rows.
async fn lease<'e>(
    executor: impl PgExecutor<'e>,
    types: &[String],
    positions: Option<&[(DateTime<Utc>, i64)]>,
    limit: i64,
) -> Vec<Leased> {
    let n = types.len();
    let (at, seq): (Vec<_>, Vec<_>) = match positions {
        Some(positions) => positions.iter().map(|&(at, seq)| (Some(at), Some(seq))).unzip(),
        None => (vec![None::<DateTime<Utc>>; n], vec![None::<i64>; n]),
    };
    let rows = sqlx::query(hooks::LEASE)
        .bind(limit)
        .bind(Uuid::new_v4())
        .bind(30_000_000_i64)
        .bind(10_i32)
        .bind(false)
        .bind(vec!["account"; n])
        .bind(types)
        .bind(vec![""; n])
        .bind(vec![i32::MAX; n])
        .bind(at)
        .bind(seq)
        .bind(Vec::<Uuid>::new())
        .fetch_all(executor)
        .await
        .unwrap();
    rows.iter()
        .map(|row| Leased {
            event_type: row.get(3),
            seq: row.get(11),
            position: (row.get(15), row.get(11)),
        })
        .collect()
}

/// Rows leased per event type.
fn per_type(rows: &[Leased]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for row in rows {
        *counts.entry(row.event_type.clone()).or_default() += 1;
    }
    counts
}

/// `per_type` pending rows of each of `types` event types, the types taking turns, all
/// available since `waited` ago (a PostgreSQL interval), in one statement.
async fn backlog(pool: &PgPool, types: usize, per_type: i64, waited: &str) {
    sqlx::query(
        "INSERT INTO outbox.events (event_id, aggregate_type, aggregate_id, event_type, payload, \
                                    available_at) \
         SELECT gen_random_uuid(), 'account', i::text, \
                'account.t' || lpad((i % $1)::text, 2, '0'), '{}', now() - $3::interval \
         FROM generate_series(0, $1 * $2 - 1) AS i",
    )
    .bind(types as i32)
    .bind(per_type)
    .bind(waited)
    .execute(pool)
    .await
    .unwrap();
}

#[sqlx::test(migrations = false)]
async fn a_lease_over_many_types_with_a_backlog_is_full_and_takes_from_each(pool: PgPool) {
    migrated(&pool).await;
    backlog(&pool, 50, 100, "1 minute").await;
    let types: Vec<String> = (0..50).map(type_name).collect();

    let leased = lease(&pool, &types, None, 1_000).await;
    let counts = per_type(&leased);
    assert_eq!(leased.len(), 1_000);
    assert_eq!(counts.len(), 50, "every type has its share: {counts:?}");
    // Heads that waited as long share alike (up to rounding).
    assert!(counts.values().all(|&n| (18..=25).contains(&n)), "{counts:?}");
}

#[sqlx::test(migrations = false)]
async fn what_young_types_with_few_rows_leave_goes_to_the_old_backlog(pool: PgPool) {
    migrated(&pool).await;
    // One type with a backlog waiting 10 s; 49 with two rows each, waiting 5 s: their shares
    // (about 20 rows each) are more than they have.
    sqlx::query(
        "INSERT INTO outbox.events (event_id, aggregate_type, aggregate_id, event_type, payload, \
                                    available_at) \
         SELECT gen_random_uuid(), 'account', i::text, 'account.t00', '{}', \
                now() - interval '10 seconds' \
         FROM generate_series(1, 2000) AS i",
    )
    .execute(&pool)
    .await
    .unwrap();
    for n in 1..50 {
        sqlx::query(
            "INSERT INTO outbox.events (event_id, aggregate_type, aggregate_id, event_type, \
                                        payload, available_at) \
             SELECT gen_random_uuid(), 'account', i::text, $1, '{}', now() - interval '5 seconds' \
             FROM generate_series(1, 2) AS i",
        )
        .bind(type_name(n))
        .execute(&pool)
        .await
        .unwrap();
    }
    let types: Vec<String> = (0..50).map(type_name).collect();

    let leased = lease(&pool, &types, None, 1_000).await;
    let counts = per_type(&leased);
    assert_eq!(leased.len(), 1_000, "full: {counts:?}");
    assert_eq!(counts[&type_name(0)], 1_000 - 49 * 2, "the backlog gets the rest: {counts:?}");
}

#[sqlx::test(migrations = false)]
async fn however_small_the_lease_the_type_waiting_longest_goes_first(pool: PgPool) {
    migrated(&pool).await;
    // Ten types of one row each; type n has waited 10 - n minutes, so t00 is the oldest.
    for n in 0..10 {
        sqlx::query(
            "INSERT INTO outbox.events (event_id, aggregate_type, aggregate_id, event_type, \
                                        payload, available_at) \
             VALUES (gen_random_uuid(), 'account', '1', $1, '{}', \
                     now() - (10 - $2) * interval '1 minute')",
        )
        .bind(type_name(n))
        .bind(n as i32)
        .execute(&pool)
        .await
        .unwrap();
    }
    // Listed youngest first, so the order of the list is not what decides.
    let types: Vec<String> = (0..10).rev().map(type_name).collect();

    let mut order = Vec::new();
    for _ in 0..10 {
        let leased = lease(&pool, &types, None, 1).await;
        assert_eq!(leased.len(), 1, "a lease of one row takes one while any waits");
        order.push(leased[0].event_type.clone());
    }
    assert_eq!(order, (0..10).map(type_name).collect::<Vec<_>>(), "oldest head first");
    assert!(lease(&pool, &types, None, 1).await.is_empty(), "all leased");
}

#[sqlx::test(migrations = false)]
async fn two_relays_leasing_at_once_take_disjoint_rows_and_both_are_full(pool: PgPool) {
    migrated(&pool).await;
    backlog(&pool, 50, 40, "1 minute").await;
    let types: Vec<String> = (0..50).map(type_name).collect();

    // The first relay's lease holds its locks (its statement has not committed) while the
    // second leases.
    let mut first_tx = pool.begin().await.unwrap();
    let first = lease(&mut *first_tx, &types, None, 1_000).await;
    let second = lease(&pool, &types, None, 1_000).await;
    first_tx.commit().await.unwrap();

    assert_eq!((first.len(), second.len()), (1_000, 1_000));
    let first_seqs: HashSet<i64> = first.iter().map(|row| row.seq).collect();
    assert!(second.iter().all(|row| !first_seqs.contains(&row.seq)), "disjoint");
    assert_eq!(per_type(&second).len(), 50, "the second takes from every type too");
    assert!(lease(&pool, &types, None, 1_000).await.is_empty(), "the backlog is all leased");
}

#[sqlx::test(migrations = false)]
async fn a_lease_past_the_positions_takes_only_rows_past_them_in_every_type(pool: PgPool) {
    migrated(&pool).await;
    backlog(&pool, 50, 60, "1 minute").await;
    let types: Vec<String> = (0..50).map(type_name).collect();

    let first = lease(&pool, &types, None, 1_000).await;
    // As the relay's cursor keeps them: per type, the position of the last row it leased.
    let mut last: BTreeMap<String, (DateTime<Utc>, i64)> = BTreeMap::new();
    for row in &first {
        let position = last.entry(row.event_type.clone()).or_insert(row.position);
        *position = row.position.max(*position);
    }
    assert_eq!(last.len(), 50);
    let positions: Vec<_> = types.iter().map(|t| last[t]).collect();

    let next = lease(&pool, &types, Some(&positions), 1_000).await;
    assert_eq!(next.len(), 1_000, "the 2,000 rows past the positions offer a full lease");
    for row in &next {
        assert!(row.position > last[&row.event_type], "{row:?} is behind its type's position");
    }
    assert_eq!(per_type(&next).len(), 50);
}

#[sqlx::test(migrations = false)]
async fn when_the_oldest_type_runs_out_the_others_fill_the_lease(pool: PgPool) {
    migrated(&pool).await;
    // t00 waited longest but has 5 rows; t01 has a backlog a little younger.
    for (name, rows, waited) in [(type_name(0), 5, "1 minute"), (type_name(1), 1_000, "30 seconds")]
    {
        sqlx::query(
            "INSERT INTO outbox.events (event_id, aggregate_type, aggregate_id, event_type, \
                                        payload, available_at) \
             SELECT gen_random_uuid(), 'account', i::text, $1, '{}', now() - $3::interval \
             FROM generate_series(1, $2) AS i",
        )
        .bind(name)
        .bind(rows)
        .bind(waited)
        .execute(&pool)
        .await
        .unwrap();
    }
    let types = [type_name(0), type_name(1)];

    let leased = lease(&pool, &types, None, 100).await;
    let counts = per_type(&leased);
    assert_eq!(leased.len(), 100, "full: {counts:?}");
    assert_eq!(counts[&type_name(0)], 5, "{counts:?}");
    let seqs: HashSet<i64> = leased.iter().map(|row| row.seq).collect();
    assert_eq!(seqs.len(), 100, "no row twice");
    // t01's are its oldest 95, in one run: the second lap went on past the first's last row.
    let mut t01: Vec<i64> =
        leased.iter().filter(|row| row.event_type == type_name(1)).map(|row| row.seq).collect();
    t01.sort();
    assert_eq!(t01, (6..=100).collect::<Vec<i64>>());
}

/// A relay that leases again a row it still holds (its renewals could not reach the row for a
/// lease timeout, and its own lease found it first) counts no expiry: the row, whose delivery
/// goes on under the new token, does not die under it at `max_expired_leases`, and its
/// acknowledgement under the new token publishes it. Another relay's lease counts the expiry
/// and, at the limit, kills the row.
#[sqlx::test(migrations = false)]
async fn leasing_again_a_row_the_relay_holds_counts_no_expiry(pool: PgPool) {
    use outbox_runtime::__private::test_hooks::steps;
    use std::time::Duration;

    migrated(&pool).await;
    let types = [("order", "order.placed")];
    // One-millisecond leases, and the first expiry kills.
    let lease = |held: Vec<Uuid>| {
        let pool = pool.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(20)).await; // past the last lease
            steps::lease(&pool, &types, 1, Duration::from_millis(1), 1, false, &held).await.unwrap()
        }
    };
    let held = emit_committed(&pool, &[placed(1)]).await[0];
    assert_eq!(lease(vec![]).await.len(), 1);
    let again = lease(vec![held]).await;
    let &[(id, token, _, expired_leases, died)] = again.as_slice() else { panic!("{again:?}") };
    assert_eq!((id, expired_leases, died), (held, 0, false), "its own lease is no expiry");
    assert!(steps::publish(&pool, id, token).await.unwrap(), "published under the new token");

    let other = emit_committed(&pool, &[placed(2)]).await[0];
    assert_eq!(lease(vec![]).await.len(), 1);
    let taken = lease(vec![held]).await; // this relay holds another row, not this one
    let &[(id, _, _, expired_leases, died)] = taken.as_slice() else { panic!("{taken:?}") };
    assert_eq!((id, expired_leases, died), (other, 1, true), "another relay's lease counts it");
}
