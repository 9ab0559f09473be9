//! Many event types: does a backlog spread over 50 event types drain as fast as the same
//! backlog in one? One relay handles an enum family of 50 event types ([`Spread`]); it drains
//! a backlog whose events go round the 50 types, and the same number of events all of the first
//! type, each in a database of its own, by 1 relay and by 4 (the relay's defaults: concurrency
//! 16, leases sized by the relay, so up to 1,000 rows a lease). Both sides run the same relay,
//! so they differ only in how the backlog is spread. The two take turns going first from run to
//! run. Beside each 1-relay drain, the WAL the whole cluster wrote per event delivered
//! (`pg_wal_lsn_diff`; other databases' writes meanwhile count too): a lease that locks more
//! rows than it keeps writes a lock record for each.

use std::sync::atomic::Ordering;

use outbox_runtime::{EventContext, OutboxEvent, Relay};
use serde::{Deserialize, Serialize};
use sqlx::{Connection, PgConnection, PgPool};

use crate::db::{self, Database};
use crate::probe;
use crate::relay::{self, Calls, Setup};

/// One event family of [`TYPES`] event types, `account.t00` to `account.t49`.
macro_rules! spread {
    ($($variant:ident $name:tt),* $(,)?) => {
        #[derive(Serialize, Deserialize, OutboxEvent)]
        #[outbox(aggregate = "account")]
        pub enum Spread {
            $(
                #[outbox(event_type = $name)]
                $variant {
                    #[outbox(id)]
                    account: u32,
                    cents: i64,
                },
            )*
        }

        /// The event of the `i`-th type (modulo [`TYPES`]).
        fn of_type(i: usize, account: u32, cents: i64) -> Spread {
            let variants = [$(Spread::$variant { account, cents }),*];
            variants.into_iter().nth(i % TYPES).unwrap()
        }
    };
}

spread!(
    T00 "account.t00", T01 "account.t01", T02 "account.t02", T03 "account.t03",
    T04 "account.t04", T05 "account.t05", T06 "account.t06", T07 "account.t07",
    T08 "account.t08", T09 "account.t09", T10 "account.t10", T11 "account.t11",
    T12 "account.t12", T13 "account.t13", T14 "account.t14", T15 "account.t15",
    T16 "account.t16", T17 "account.t17", T18 "account.t18", T19 "account.t19",
    T20 "account.t20", T21 "account.t21", T22 "account.t22", T23 "account.t23",
    T24 "account.t24", T25 "account.t25", T26 "account.t26", T27 "account.t27",
    T28 "account.t28", T29 "account.t29", T30 "account.t30", T31 "account.t31",
    T32 "account.t32", T33 "account.t33", T34 "account.t34", T35 "account.t35",
    T36 "account.t36", T37 "account.t37", T38 "account.t38", T39 "account.t39",
    T40 "account.t40", T41 "account.t41", T42 "account.t42", T43 "account.t43",
    T44 "account.t44", T45 "account.t45", T46 "account.t46", T47 "account.t47",
    T48 "account.t48", T49 "account.t49",
);

/// The event types of [`Spread`].
pub const TYPES: usize = 50;

/// Counts its calls, whatever the type.
async fn noop(ctx: EventContext<Calls>, _: Spread) -> Result<(), std::convert::Infallible> {
    ctx.state().fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// What one side measured: events/s by 1 relay and by 4, and the cluster's WAL bytes per event
/// of the 1-relay drain.
#[derive(Clone, Copy, Default)]
pub struct Side {
    pub one: f64,
    pub four: f64,
    pub wal_per_event: f64,
}

/// What the workload measured.
pub struct Types {
    /// The backlog spread over [`TYPES`] types.
    pub spread: Side,
    /// The same backlog, one type.
    pub single: Side,
    /// Handler calls beyond one per event, every drain together.
    pub duplicates: u64,
}

/// Drains `events` spread over [`TYPES`] types and `events` of one type, by 1 relay and by 4;
/// `spread_first` says which side goes first.
pub async fn run(url: &str, events: usize, spread_first: bool) -> Types {
    let mut duplicates = 0;
    let mut side = async |spread: bool| {
        let mut measured = Side::default();
        for relays in [1, 4] {
            let db = Database::fresh(url, "types").await;
            let types = if spread { TYPES } else { 1 };
            db::backlog(&db.pool, events, |i| of_type(i % types, (i % 1_000) as u32, i as i64))
                .await;
            let mut conn = PgConnection::connect(&db.url).await.unwrap();
            let lsn = probe::wal_lsn(&mut conn).await;
            let (rate, extra) = drain(&db.pool, events, relays).await;
            let wal = probe::wal_since(&mut conn, &lsn).await;
            conn.close().await.unwrap();
            db.drop().await;
            duplicates += extra;
            if relays == 1 {
                measured.one = rate;
                measured.wal_per_event = wal / events as f64;
            } else {
                measured.four = rate;
            }
        }
        measured
    };
    let (spread, single) = if spread_first {
        let spread = side(true).await;
        (spread, side(false).await)
    } else {
        let single = side(false).await;
        (side(true).await, single)
    };
    Types { spread, single, duplicates }
}

/// `relays` relays of the defaults, each handling every type of [`Spread`], drain `events`:
/// (events/s, handler calls beyond one per event).
async fn drain(pool: &PgPool, events: usize, relays: usize) -> (f64, u64) {
    let calls = Calls::default();
    let defaults = Setup::defaults(relays);
    let relays = (0..relays)
        .map(|_| {
            Relay::builder(pool.clone())
                .state(calls.clone())
                .concurrency(defaults.concurrency)
                .handler(noop)
                .build()
                .unwrap()
        })
        .collect();
    let rate = relay::until_delivered(relays, events).await.events_per_second;
    (rate, calls.load(Ordering::Relaxed) - events as u64)
}
