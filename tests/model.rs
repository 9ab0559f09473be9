//! Model-based test of the outbox table: random sequences of emit, lease, succeed, fail, expire,
//! renew, release, stale acknowledgements and requeue, run one statement at a time through
//! `__private::test_hooks::steps` against the real PostgreSQL (a fresh database per case), under
//! randomly drawn relay settings, with a small in-memory model that every row is checked against
//! after every step.
//!
//! Invariants checked after each step:
//! - the table holds exactly the model's rows, in emit (`seq`) order;
//! - no row is both published and pending or dead; published rows stay published with the same
//!   `published_at`; state, attempts, expired leases, lease token and `last_error` match the
//!   model;
//! - attempts and expired leases never decrease, except a requeue resetting a dead row's both to
//!   0 (pending, available, no token, `last_error` kept);
//! - a fenced acknowledgement (a publish, fail, release or renewal under a token the row no
//!   longer holds, under the token a lease left in the row it killed, or of a published row) is
//!   refused and changes no row;
//! - a renewal under the row's token (its lease live, or expired while nobody re-leased the row)
//!   is accepted, makes the lease live again and changes nothing but `available_at`, which it
//!   never moves back;
//! - a lease returns only rows the model considers leasable (pending or lease expired, and for
//!   an ordered row no earlier ordered row of its aggregate unpublished: dead ones included,
//!   unless the case skips past them as `DeadOrderedEvents::SkipPast` does), as many as there
//!   are up to `limit`, of each type its oldest by `(available_at, seq)`, and at least one of the
//!   type whose oldest leasable row waited longest (how many of each type depends on how long
//!   each type's head waited by the database's clock, which the model does not know);
//! - expired leases are counted apart from failed deliveries: a lease of a row whose lease
//!   expired counts it in `expired_leases`, never in `attempts`, and kills the row at
//!   `max_expired_leases` with a `last_error` saying so; only a failure counts an attempt, and it
//!   kills the row at `max_attempts`;
//! - per ordered aggregate, leaving out the rows a lease skipped past while they were dead, the
//!   published rows are a prefix in emit order, published in that order, and only the first
//!   unpublished row can hold a live lease.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox_runtime::__private::test_hooks::steps;
use outbox_runtime::dead_letters::{self, DeadFilter};
use outbox_runtime::OutboxEvent;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};
use serde::{Deserialize, Serialize};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use uuid::Uuid;

/// The relay settings a case runs under.
#[derive(Debug, Clone, Copy)]
struct Settings {
    max_attempts: i32,
    max_expired_leases: i32,
    /// `DeadOrderedEvents::SkipPast`: a dead ordered row no longer holds back the later ones of
    /// its aggregate.
    skip_dead_ordered: bool,
}

/// The settings of the scripted cases; random cases draw both limits from 1 to 3, and whether
/// to skip dead ordered rows.
const SCRIPTED: Settings =
    Settings { max_attempts: 3, max_expired_leases: 3, skip_dead_ordered: false };
/// Long enough that only the explicit `Expire` step ends a lease.
const LEASE_TIMEOUT: Duration = Duration::from_secs(60);
/// The `(aggregate_type, event_type)` pairs a lease asks for: every type this test emits.
const TYPES: &[(&str, &str)] =
    &[(Posted::AGGREGATE_TYPE, Posted::EVENT_TYPE), (Noted::AGGREGATE_TYPE, Noted::EVENT_TYPE)];
/// Cases per run; `MODEL_CASES` overrides.
const DEFAULT_CASES: u32 = 32;

/// What a lease writes when it kills a row whose lease expired for the `expiries`th time.
fn expired_error(expiries: i32) -> String {
    format!("its lease expired {expiries} times before a relay acknowledged it")
}
// ---------------------------------------------------------------------------------------------
// Events
// ---------------------------------------------------------------------------------------------

/// Ordered: delivered one at a time per account, in emit order.
#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "account", event_type = "account.posted", ordered)]
struct Posted {
    #[outbox(id)]
    account: u32,
    n: u32,
}

/// Unordered, same aggregate type: neither blocks nor is blocked by ordered events.
#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "account", event_type = "account.noted")]
struct Noted {
    #[outbox(id)]
    account: u32,
    n: u32,
}

// ---------------------------------------------------------------------------------------------
// Operations
// ---------------------------------------------------------------------------------------------

/// One step. `which` picks among the candidates modulo their number; with none it is a no-op.
#[derive(Debug, Clone)]
enum Op {
    /// Emits `count` events for account `aggregate` in one committed transaction.
    Emit { aggregate: u32, ordered: bool, count: u32 },
    /// One lease statement for up to `limit` rows.
    Lease { limit: i64 },
    /// Publishes a live lease with its token.
    Succeed { which: usize },
    /// Records a failure of a live lease with its token (retry at once).
    Fail { which: usize },
    /// Hands a live lease back.
    Release { which: usize },
    /// Renews a lease with its token: a live one, or one that expired while nobody re-leased
    /// the row.
    Renew { which: usize },
    /// Lets a live lease run out (the token stays in the row, as in a real expiry).
    Expire { which: usize },
    /// Acknowledges under a token the row no longer holds, or acknowledges a published row
    /// again.
    StaleAck { which: usize, ack: Ack },
    /// Requeues every dead row.
    Requeue,
    /// Acknowledges a row that died on a lease (the lease reported `died`) with the token that
    /// lease left in it. Must be refused like a stale token (see
    /// `dead_row_keeps_a_token_that_acknowledges_it`).
    AckDied { which: usize, ack: Ack },
}

/// What a fenced step attempts under a token that must be refused.
#[derive(Debug, Clone, Copy)]
enum Ack {
    Publish,
    Fail,
    Release,
    Renew,
}

fn ack() -> impl Strategy<Value = Ack> {
    prop_oneof![Just(Ack::Publish), Just(Ack::Fail), Just(Ack::Release), Just(Ack::Renew)]
}

fn op() -> impl Strategy<Value = Op> {
    // Mostly the oldest candidate, so one row goes through several attempts and dies.
    let which = prop_oneof![2 => Just(0usize), 1 => 0..16usize];
    prop_oneof![
        2 => (0..3u32, any::<bool>(), 1..=3u32)
            .prop_map(|(aggregate, ordered, count)| Op::Emit { aggregate, ordered, count }),
        4 => (1..5i64).prop_map(|limit| Op::Lease { limit }),
        2 => which.clone().prop_map(|which| Op::Succeed { which }),
        3 => which.clone().prop_map(|which| Op::Fail { which }),
        1 => which.clone().prop_map(|which| Op::Release { which }),
        1 => which.clone().prop_map(|which| Op::Renew { which }),
        3 => which.clone().prop_map(|which| Op::Expire { which }),
        2 => (which.clone(), ack()).prop_map(|(which, ack)| Op::StaleAck { which, ack }),
        1 => (which, ack()).prop_map(|(which, ack)| Op::AckDied { which, ack }),
        1 => Just(Op::Requeue),
    ]
}

fn settings() -> impl Strategy<Value = Settings> {
    (1..=3i32, 1..=3i32, any::<bool>()).prop_map(
        |(max_attempts, max_expired_leases, skip_dead_ordered)| Settings {
            max_attempts,
            max_expired_leases,
            skip_dead_ordered,
        },
    )
}

// ---------------------------------------------------------------------------------------------
// The model
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Pending,
    Leased { expired: bool },
    Published,
    Dead,
}

#[derive(Debug, Clone)]
struct Event {
    id: Uuid,
    aggregate: u32,
    ordered: bool,
    state: State,
    /// Failed deliveries.
    attempts: i32,
    /// Leases that expired and were counted by the next lease.
    expired_leases: i32,
    /// The `lease_token` column: set by a lease, cleared by fail, release and requeue, kept by
    /// publish and by a lease that kills the row.
    token: Option<Uuid>,
    last_error: Option<String>,
    /// A later ordered row of its aggregate was leased while this one lay dead (the case skips
    /// dead ordered rows): emit order no longer holds for it.
    skipped: bool,
}

#[derive(Default)]
struct Model {
    /// In emit order, which is `seq` order.
    events: Vec<Event>,
    position: HashMap<Uuid, usize>,
    /// Every `(event, token)` a lease handed out, in order.
    issued: Vec<(Uuid, Uuid)>,
    /// Whether dead ordered rows let the later ones of their aggregate through.
    skip_dead_ordered: bool,
}

impl Model {
    fn event(&mut self, id: Uuid) -> &mut Event {
        &mut self.events[self.position[&id]]
    }

    /// The earlier ordered rows of `i`'s aggregate, if `i` is ordered.
    fn earlier(&self, i: usize) -> impl Iterator<Item = usize> + '_ {
        let e = &self.events[i];
        (0..i).filter(move |&j| {
            let p = &self.events[j];
            e.ordered && p.ordered && p.aggregate == e.aggregate
        })
    }

    /// The earliest ordered row of `i`'s aggregate before it that holds it back, if any: one
    /// unpublished, and not dead if the case skips dead ones.
    fn blocker(&self, i: usize) -> Option<usize> {
        self.earlier(i).find(|&j| match self.events[j].state {
            State::Published => false,
            State::Dead => !self.skip_dead_ordered,
            State::Pending | State::Leased { .. } => true,
        })
    }

    /// The dead ordered rows of `i`'s aggregate before it, which a lease of `i` skips past.
    fn dead_before(&self, i: usize) -> impl Iterator<Item = usize> + '_ {
        self.earlier(i).filter(|&j| self.events[j].state == State::Dead)
    }

    fn leasable(&self, i: usize) -> bool {
        matches!(self.events[i].state, State::Pending | State::Leased { expired: true })
            && self.blocker(i).is_none()
    }

    /// Rows a relay holds a lease on (expired or not, while nobody re-leased them).
    fn leases(&self) -> Vec<usize> {
        (0..self.events.len())
            .filter(|&i| matches!(self.events[i].state, State::Leased { .. }))
            .collect()
    }

    /// Rows that died on a lease, with the token that lease wrote.
    fn died_on_lease(&self) -> Vec<(Uuid, Uuid)> {
        self.events
            .iter()
            .filter(|e| e.state == State::Dead)
            .filter_map(|e| Some((e.id, e.token?)))
            .collect()
    }

    /// Acknowledgements that must be fenced off: tokens a row no longer holds, and the token of
    /// a published row.
    fn stale(&self) -> Vec<(Uuid, Uuid)> {
        self.issued
            .iter()
            .copied()
            .filter(|(id, token)| {
                let e = &self.events[self.position[id]];
                e.state == State::Published || e.token != Some(*token)
            })
            .collect()
    }
}

// ---------------------------------------------------------------------------------------------
// The database side
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
struct Row {
    event_id: Uuid,
    seq: i64,
    aggregate_id: String,
    event_type: String,
    ordered: bool,
    attempts: i32,
    expired_leases: i32,
    last_error: Option<String>,
    lease_token: Option<Uuid>,
    published_at: Option<DateTime<Utc>>,
    dead_at: Option<DateTime<Utc>>,
    available_at: DateTime<Utc>,
    /// `available_at <= now()`: not stored, so left out of [`Row::stored`].
    available_now: bool,
}

impl Row {
    fn stored(&self) -> Row {
        Row { available_now: false, ..self.clone() }
    }
}

async fn snapshot(pool: &PgPool) -> Result<Vec<Row>, Failure> {
    Ok(sqlx::query_as(
        "SELECT event_id, seq, aggregate_id, event_type, ordered, attempts, expired_leases, \
                last_error, lease_token, published_at, dead_at, available_at, \
                available_at <= now() AS available_now \
         FROM outbox.events ORDER BY seq",
    )
    .fetch_all(pool)
    .await?)
}

/// A failed check or an unexpected error, with what led to it.
#[derive(Debug)]
struct Failure(String);

impl<E: std::fmt::Display> From<E> for Failure {
    fn from(error: E) -> Self {
        Failure(format!("unexpected error: {error}"))
    }
}

macro_rules! check {
    ($cond:expr, $($message:tt)+) => {
        if !$cond {
            return Err(Failure(format!($($message)+)));
        }
    };
}

/// What the steps exercised, to show a run reached the interesting states.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Coverage {
    leased: u32,
    published: u32,
    failed: u32,
    released: u32,
    renewed: u32,
    /// Leases that counted an expired lease (in `expired_leases`).
    expiry_counted: u32,
    died_on_lease: u32,
    died_on_fail: u32,
    /// Stale acknowledgements refused.
    fenced: u32,
    requeued: u32,
    /// Lease steps that had to pass over an ordered row behind an unpublished one.
    ordered_blocked: u32,
    /// ... behind a dead one.
    ordered_blocked_by_dead: u32,
    /// Ordered rows leased past a dead earlier row of their aggregate.
    skipped_dead: u32,
}

impl Coverage {
    fn add(&mut self, other: Coverage) {
        self.leased += other.leased;
        self.published += other.published;
        self.failed += other.failed;
        self.released += other.released;
        self.renewed += other.renewed;
        self.expiry_counted += other.expiry_counted;
        self.died_on_lease += other.died_on_lease;
        self.died_on_fail += other.died_on_fail;
        self.fenced += other.fenced;
        self.requeued += other.requeued;
        self.ordered_blocked += other.ordered_blocked;
        self.ordered_blocked_by_dead += other.ordered_blocked_by_dead;
        self.skipped_dead += other.skipped_dead;
    }
}

/// What a step leads the checks to expect beyond the model's state.
#[derive(Default)]
struct Expect {
    /// A fenced acknowledgement: no row may change.
    unchanged: bool,
    /// Rows a requeue made pending again.
    requeued: Vec<Uuid>,
    /// A row whose lease was renewed: only its `available_at` may change.
    renewed: Option<Uuid>,
}

/// Sends `ack` for `id` under `token`; whether the database accepted it.
async fn acknowledge(
    pool: &PgPool,
    ack: Ack,
    id: Uuid,
    token: Uuid,
    settings: Settings,
) -> Result<bool, Failure> {
    Ok(match ack {
        Ack::Publish => steps::publish(pool, id, token).await?,
        Ack::Fail => {
            let error = "stale failure";
            steps::fail(pool, id, token, error, Duration::ZERO, settings.max_attempts)
                .await?
                .is_some()
        }
        Ack::Release => steps::release(pool, id, token).await?,
        Ack::Renew => steps::renew(pool, id, token, LEASE_TIMEOUT).await?,
    })
}

struct Harness {
    pool: PgPool,
    settings: Settings,
    model: Model,
    rows: Vec<Row>,
    coverage: Coverage,
}

impl Harness {
    async fn run(&mut self, ops: &[Op]) -> Result<(), Failure> {
        for (step, op) in ops.iter().enumerate() {
            let context = |Failure(why): Failure| Failure(format!("step {step} ({op:?}): {why}"));
            let expect = self.apply(step, op).await.map_err(context)?;
            let after = snapshot(&self.pool).await.map_err(context)?;
            self.check(&after, &expect).map_err(context)?;
            self.rows = after;
        }
        Ok(())
    }

    async fn apply(&mut self, step: usize, op: &Op) -> Result<Expect, Failure> {
        let pool = &self.pool;
        let model = &mut self.model;
        let coverage = &mut self.coverage;
        let settings = self.settings;
        match *op {
            Op::Emit { aggregate, ordered, count } => {
                let mut tx = pool.begin().await?;
                let ids = if ordered {
                    let events: Vec<_> =
                        (0..count).map(|n| Posted { account: aggregate, n }).collect();
                    outbox_runtime::emit_all(&mut tx, &events).await?
                } else {
                    let events: Vec<_> =
                        (0..count).map(|n| Noted { account: aggregate, n }).collect();
                    outbox_runtime::emit_all(&mut tx, &events).await?
                };
                tx.commit().await?;
                check!(ids.len() == count as usize, "emit returned {} ids for {count}", ids.len());
                for id in ids {
                    model.position.insert(id, model.events.len());
                    model.events.push(Event {
                        id,
                        aggregate,
                        ordered,
                        state: State::Pending,
                        attempts: 0,
                        expired_leases: 0,
                        token: None,
                        last_error: None,
                        skipped: false,
                    });
                }
            }

            Op::Lease { limit } => {
                let before: HashMap<Uuid, &Row> =
                    self.rows.iter().map(|r| (r.event_id, r)).collect();
                let mut expected: Vec<usize> =
                    (0..model.events.len()).filter(|&i| model.leasable(i)).collect();
                expected.sort_by_key(|&i| (before[&model.events[i].id].available_at, i));
                // What the lease takes of each type depends on how long each type's head has
                // waited, by the database's clock: the model checks what holds whatever the
                // shares (see the module's invariants).
                let expected_count = expected.len().min(limit as usize);
                let oldest_type = expected.first().map(|&i| model.events[i].ordered);
                let waiting = (0..model.events.len()).filter(|&i| {
                    matches!(
                        model.events[i].state,
                        State::Pending | State::Leased { expired: true }
                    )
                });
                let blockers: Vec<usize> = waiting.filter_map(|i| model.blocker(i)).collect();
                coverage.ordered_blocked += u32::from(!blockers.is_empty());
                coverage.ordered_blocked_by_dead +=
                    u32::from(blockers.iter().any(|&j| model.events[j].state == State::Dead));

                let leased = steps::lease(
                    pool,
                    TYPES,
                    limit,
                    LEASE_TIMEOUT,
                    settings.max_expired_leases,
                    settings.skip_dead_ordered,
                    &[],
                )
                .await?;

                // Each row on its own first: the database's own view before the lease, then the
                // model's.
                for &(id, ..) in &leased {
                    let Some(row) = before.get(&id) else {
                        return Err(Failure(format!("leased {id}, which did not exist")));
                    };
                    check!(row.published_at.is_none(), "leased published row {id}");
                    check!(row.dead_at.is_none(), "leased dead row {id}");
                    check!(row.available_now, "leased row {id} before its available_at");
                    if row.ordered {
                        let earlier = self.rows.iter().find(|p| {
                            p.ordered
                                && p.aggregate_id == row.aggregate_id
                                && p.seq < row.seq
                                && p.published_at.is_none()
                                && !(settings.skip_dead_ordered && p.dead_at.is_some())
                        });
                        check!(
                            earlier.is_none(),
                            "leased ordered row {id} (seq {}) while earlier row {:?} of its \
                             aggregate was unpublished{}",
                            row.seq,
                            earlier,
                            if settings.skip_dead_ordered { " and alive" } else { "" }
                        );
                    }
                    let i = model.position[&id];
                    check!(
                        model.leasable(i),
                        "leased row {id} the model holds unleasable: {:?}, blocked by {:?}",
                        model.events[i],
                        model.blocker(i).map(|j| &model.events[j])
                    );
                }
                let got: Vec<usize> = leased.iter().map(|l| model.position[&l.0]).collect();
                check!(
                    got.len() == expected_count,
                    "lease of {limit} returned {} rows of the {} leasable",
                    got.len(),
                    expected.len()
                );
                // Per type (the ordered rows are one type, the others another), the oldest.
                for ordered in [false, true] {
                    let of_type = |i: &&usize| model.events[**i].ordered == ordered;
                    let mut mine: Vec<usize> = got.iter().filter(of_type).copied().collect();
                    let oldest: Vec<usize> =
                        expected.iter().filter(of_type).take(mine.len()).copied().collect();
                    mine.sort_by_key(|&i| (before[&model.events[i].id].available_at, i));
                    check!(
                        mine == oldest,
                        "lease took rows {mine:?} of a type, not its oldest leasable {oldest:?}"
                    );
                }
                if let Some(ordered) = oldest_type {
                    check!(
                        got.iter().any(|&i| model.events[i].ordered == ordered),
                        "lease left out the type whose head waited longest"
                    );
                }
                let tokens: Vec<Uuid> = leased.iter().map(|l| l.1).collect();
                check!(tokens.windows(2).all(|w| w[0] == w[1]), "one lease, several tokens");

                // The dead rows these leases went past (the case skips them): emit order no
                // longer holds for them.
                let mut skipped = Vec::new();
                for &(id, ..) in &leased {
                    let before = skipped.len();
                    skipped.extend(model.dead_before(model.position[&id]));
                    coverage.skipped_dead += u32::from(skipped.len() > before);
                }
                for j in skipped {
                    model.events[j].skipped = true;
                }

                for (id, token, attempts, expired_leases, died) in leased {
                    let e = model.event(id);
                    // The previous lease expired: counted apart from failed deliveries.
                    let expired = e.token.is_some();
                    e.expired_leases += i32::from(expired);
                    let dies = expired && e.expired_leases >= settings.max_expired_leases;
                    if dies {
                        e.last_error = Some(expired_error(e.expired_leases));
                    }
                    check!(
                        attempts == e.attempts
                            && expired_leases == e.expired_leases
                            && died == dies,
                        "lease of {id} reported attempts {attempts}, expired leases \
                         {expired_leases}, died {died}; model: attempts {}, expired leases {}, \
                         died {dies}",
                        e.attempts,
                        e.expired_leases
                    );
                    coverage.leased += 1;
                    coverage.expiry_counted += u32::from(expired);
                    coverage.died_on_lease += u32::from(dies);
                    e.token = Some(token);
                    e.state = if dies { State::Dead } else { State::Leased { expired: false } };
                    model.issued.push((id, token));
                }
            }

            Op::Succeed { which } => {
                let leases = model.leases();
                if let Some(&i) = leases.get(which % leases.len().max(1)) {
                    let e = &mut model.events[i];
                    let token = e.token.expect("a lease has a token");
                    let published = steps::publish(pool, e.id, token).await?;
                    check!(published, "publish of {} under its live token refused", e.id);
                    e.state = State::Published;
                    coverage.published += 1;
                }
            }

            Op::Fail { which } => {
                let leases = model.leases();
                if let Some(&i) = leases.get(which % leases.len().max(1)) {
                    let e = &mut model.events[i];
                    let token = e.token.expect("a lease has a token");
                    let error = format!("handler failed at step {step}");
                    let recorded = steps::fail(
                        pool,
                        e.id,
                        token,
                        &error,
                        Duration::ZERO,
                        settings.max_attempts,
                    )
                    .await?;
                    e.attempts += 1;
                    let dies = e.attempts >= settings.max_attempts;
                    check!(
                        recorded == Some(dies),
                        "fail of {} under its live token returned {recorded:?}, model expected \
                         Some({dies})",
                        e.id
                    );
                    e.token = None;
                    e.last_error = Some(error);
                    e.state = if dies { State::Dead } else { State::Pending };
                    coverage.failed += 1;
                    coverage.died_on_fail += u32::from(dies);
                }
            }

            Op::Release { which } => {
                let leases = model.leases();
                if let Some(&i) = leases.get(which % leases.len().max(1)) {
                    let e = &mut model.events[i];
                    let token = e.token.expect("a lease has a token");
                    let released = steps::release(pool, e.id, token).await?;
                    check!(released, "release of {} under its live token refused", e.id);
                    e.token = None;
                    e.state = State::Pending;
                    coverage.released += 1;
                }
            }

            Op::Renew { which } => {
                let leases = model.leases();
                if let Some(&i) = leases.get(which % leases.len().max(1)) {
                    let e = &mut model.events[i];
                    let token = e.token.expect("a lease has a token");
                    let renewed = steps::renew(pool, e.id, token, LEASE_TIMEOUT).await?;
                    check!(renewed, "renewal of {} under its token refused: {:?}", e.id, e.state);
                    e.state = State::Leased { expired: false };
                    coverage.renewed += 1;
                    return Ok(Expect { renewed: Some(e.id), ..Expect::default() });
                }
            }

            Op::Expire { which } => {
                let leases = model.leases();
                if let Some(&i) = leases.get(which % leases.len().max(1)) {
                    let e = &mut model.events[i];
                    let done = sqlx::query(
                        "UPDATE outbox.events SET available_at = now() - interval '1 ms' \
                         WHERE event_id = $1",
                    )
                    .bind(e.id)
                    .execute(pool)
                    .await?;
                    check!(done.rows_affected() == 1, "expire found no row {}", e.id);
                    e.state = State::Leased { expired: true };
                }
            }

            Op::StaleAck { which, ack } | Op::AckDied { which, ack } => {
                let stale = match *op {
                    Op::StaleAck { .. } => model.stale(),
                    _ => model.died_on_lease(),
                };
                if let Some(&(id, token)) = stale.get(which % stale.len().max(1)) {
                    let accepted = acknowledge(pool, ack, id, token, settings).await?;
                    check!(!accepted, "fenced {ack:?} of {id} under {token} accepted");
                    coverage.fenced += 1;
                    return Ok(Expect { unchanged: true, ..Expect::default() });
                }
            }

            Op::Requeue => {
                let requeued = dead_letters::requeue(pool, &DeadFilter::all()).await?;
                let mut ids = Vec::new();
                for e in model.events.iter_mut().filter(|e| e.state == State::Dead) {
                    e.state = State::Pending;
                    e.attempts = 0;
                    e.expired_leases = 0;
                    e.token = None;
                    ids.push(e.id);
                }
                check!(
                    requeued == ids.len() as u64,
                    "requeue returned {requeued}, model had {} dead",
                    ids.len()
                );
                coverage.requeued += ids.len() as u32;
                return Ok(Expect { requeued: ids, ..Expect::default() });
            }
        }
        Ok(Expect::default())
    }

    fn check(&self, after: &[Row], expect: &Expect) -> Result<(), Failure> {
        let model = &self.model;
        check!(
            after.len() == model.events.len(),
            "the table holds {} rows, the model {}",
            after.len(),
            model.events.len()
        );
        let before: HashMap<Uuid, &Row> = self.rows.iter().map(|r| (r.event_id, r)).collect();

        for (row, e) in after.iter().zip(&model.events) {
            let id = row.event_id;
            check!(id == e.id, "row {id} in seq order where the model has {}", e.id);
            check!(
                row.ordered == e.ordered
                    && row.aggregate_id == e.aggregate.to_string()
                    && row.event_type
                        == if e.ordered { Posted::EVENT_TYPE } else { Noted::EVENT_TYPE },
                "row {id} stored with the wrong aggregate or type: {row:?}"
            );
            let published = row.published_at.is_some();
            let dead = row.dead_at.is_some();
            check!(!(published && dead), "row {id} is both published and dead: {row:?}");
            check!(
                published == (e.state == State::Published) && dead == (e.state == State::Dead),
                "row {id} published {published}, dead {dead}; model: {:?}",
                e.state
            );
            check!(
                row.attempts == e.attempts,
                "row {id} has attempts {}, model {}",
                row.attempts,
                e.attempts
            );
            check!(
                row.expired_leases == e.expired_leases,
                "row {id} has expired leases {}, model {}",
                row.expired_leases,
                e.expired_leases
            );
            check!(
                row.lease_token == e.token,
                "row {id} has token {:?}, model {:?}",
                row.lease_token,
                e.token
            );
            check!(
                row.last_error == e.last_error,
                "row {id} has last_error {:?}, model {:?}",
                row.last_error,
                e.last_error
            );
            match e.state {
                State::Pending => check!(row.available_now, "pending row {id} not available"),
                State::Leased { expired } => check!(
                    row.available_now == expired,
                    "row {id} leased (expired: {expired}) but available_now {}",
                    row.available_now
                ),
                State::Published | State::Dead => {}
            }

            let Some(old) = before.get(&id) else { continue };
            if expect.requeued.contains(&id) {
                check!(old.dead_at.is_some(), "requeue touched live row {id}");
                check!(
                    row.attempts == 0
                        && row.expired_leases == 0
                        && !dead
                        && !published
                        && row.lease_token.is_none()
                        && row.available_now,
                    "requeued row {id} is not pending with attempts and expired leases 0: {row:?}"
                );
                check!(
                    row.last_error == old.last_error,
                    "requeue of {id} lost last_error {:?}",
                    old.last_error
                );
            } else {
                check!(
                    row.attempts >= old.attempts,
                    "attempts of {id} went down from {} to {}",
                    old.attempts,
                    row.attempts
                );
                check!(
                    row.expired_leases >= old.expired_leases,
                    "expired leases of {id} went down from {} to {}",
                    old.expired_leases,
                    row.expired_leases
                );
                if old.dead_at.is_some() {
                    check!(row.dead_at == old.dead_at, "dead row {id} changed: {row:?}");
                }
            }
            if old.published_at.is_some() {
                check!(
                    row.stored() == old.stored(),
                    "published row {id} changed from {old:?} to {row:?}"
                );
            }
            if expect.unchanged {
                check!(
                    row.stored() == old.stored(),
                    "a fenced acknowledgement changed row {id} from {old:?} to {row:?}"
                );
            }
            if let Some(renewed) = expect.renewed {
                let expected = if id == renewed {
                    Row { available_at: row.available_at, ..old.stored() }
                } else {
                    old.stored()
                };
                check!(
                    row.stored() == expected,
                    "a renewal of {renewed} changed row {id} from {old:?} to {row:?}"
                );
                check!(
                    row.available_at >= old.available_at,
                    "a renewal moved the deadline of {id} back from {} to {}",
                    old.available_at,
                    row.available_at
                );
            }
        }

        // Per ordered aggregate, in seq order, leaving out the rows a lease skipped past: the
        // published rows form a prefix, published in order, and only the first unpublished row
        // may hold a live lease.
        let mut aggregates: BTreeMap<&str, Vec<&Row>> = BTreeMap::new();
        for (row, _) in after.iter().zip(&model.events).filter(|(r, e)| r.ordered && !e.skipped) {
            aggregates.entry(row.aggregate_id.as_str()).or_default().push(row);
        }
        for (aggregate, rows) in aggregates {
            let first_unpublished = rows.iter().position(|r| r.published_at.is_none());
            let prefix = first_unpublished.unwrap_or(rows.len());
            check!(
                rows[prefix..].iter().all(|r| r.published_at.is_none()),
                "aggregate {aggregate}: a row published past an unpublished one: {rows:#?}"
            );
            check!(
                rows[..prefix].windows(2).all(|w| w[0].published_at <= w[1].published_at),
                "aggregate {aggregate}: published out of emit order: {rows:#?}"
            );
            let live_lease = |r: &&Row| r.lease_token.is_some() && r.dead_at.is_none();
            check!(
                rows[prefix..]
                    .iter()
                    .skip(1)
                    .filter(|r| r.published_at.is_none())
                    .all(|r| { !live_lease(r) }),
                "aggregate {aggregate}: a row behind the first unpublished one holds a lease: \
                 {rows:#?}"
            );
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Running cases
// ---------------------------------------------------------------------------------------------

struct Server {
    admin: PgPool,
    options: PgConnectOptions,
}

impl Server {
    async fn connect() -> Server {
        let url = std::env::var("DATABASE_URL").expect("DATABASE_URL is set");
        let options: PgConnectOptions = url.parse().expect("DATABASE_URL parses");
        let admin = PgPoolOptions::new()
            .max_connections(1)
            .connect_with(options.clone())
            .await
            .expect("PostgreSQL is reachable at DATABASE_URL");
        Server { admin, options }
    }

    /// Runs `ops` against a fresh, migrated database, dropped afterwards whatever the outcome.
    async fn run(&self, settings: Settings, ops: &[Op]) -> Result<Coverage, Failure> {
        let name = format!("model_{}", Uuid::new_v4().simple());
        sqlx::query(sqlx::static_sql(format!("CREATE DATABASE {name}")))
            .execute(&self.admin)
            .await?;
        let outcome = async {
            let pool = PgPoolOptions::new()
                .max_connections(2)
                .connect_with(self.options.clone().database(&name))
                .await?;
            outbox_runtime::migrate(&pool).await?;
            let mut harness = Harness {
                pool: pool.clone(),
                settings,
                model: Model { skip_dead_ordered: settings.skip_dead_ordered, ..Model::default() },
                rows: vec![],
                coverage: Coverage::default(),
            };
            let outcome = harness.run(ops).await;
            pool.close().await;
            outcome.map(|()| harness.coverage)
        }
        .await;
        sqlx::query(sqlx::static_sql(format!("DROP DATABASE {name} WITH (FORCE)")))
            .execute(&self.admin)
            .await?;
        outcome
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// Runs one fixed sequence, panicking with the failure; returns what it exercised.
fn replay(settings: Settings, ops: &[Op]) -> Coverage {
    let rt = runtime();
    rt.block_on(async {
        let server = Server::connect().await;
        match server.run(settings, ops).await {
            Ok(coverage) => coverage,
            Err(Failure(why)) => panic!("{why}\nsettings: {settings:?}\nsequence: {ops:#?}"),
        }
    })
}

#[test]
fn random_sequences_keep_the_invariants() {
    let cases =
        std::env::var("MODEL_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(DEFAULT_CASES);
    let config = Config {
        cases,
        max_shrink_iters: 256,
        // Minimal failures become plain regression tests below, not files.
        failure_persistence: None,
        ..Config::default()
    };
    let rt = runtime();
    let server = rt.block_on(Server::connect());
    let mut runner = TestRunner::new(config);
    let total = std::cell::Cell::new(Coverage::default());
    let cases_strategy = (settings(), prop::collection::vec(op(), 4..=40));
    let result = runner.run(&cases_strategy, |(settings, ops)| {
        let coverage = rt
            .block_on(server.run(settings, &ops))
            .map_err(|Failure(why)| TestCaseError::fail(why))?;
        let mut sum = total.get();
        sum.add(coverage);
        total.set(sum);
        Ok(())
    });
    match result {
        Ok(()) => eprintln!("{cases} cases exercised {:?}", total.get()),
        Err(TestError::Fail(why, (settings, ops))) => {
            panic!("invariant broken: {why}\nminimal failing case: {settings:?}, ops {ops:#?}")
        }
        Err(TestError::Abort(why)) => panic!("proptest aborted: {why}"),
    }
}

/// The scenarios the invariants are about, spelled out so each runs on every test run.
#[test]
fn expired_leases_are_fenced_counted_apart_and_kill_at_their_limit() {
    use Op::*;
    let coverage = replay(
        SCRIPTED,
        &[
            Emit { aggregate: 0, ordered: false, count: 1 },
            Lease { limit: 1 }, // token 0
            Expire { which: 0 },
            Lease { limit: 1 }, // token 1, the expiry counted: expired leases 1, attempts 0
            StaleAck { which: 0, ack: Ack::Publish }, // token 0
            StaleAck { which: 0, ack: Ack::Fail },
            Fail { which: 0 },  // attempts 1, expired leases still 1
            Lease { limit: 1 }, // token 2, nothing expired: no count
            Expire { which: 0 },
            Renew { which: 0 }, // token 2 again holds a live lease
            Lease { limit: 1 }, // nothing to lease
            StaleAck { which: 1, ack: Ack::Renew }, // token 1
            Expire { which: 0 },
            Lease { limit: 1 }, // token 3, expired leases 2
            Expire { which: 0 },
            Lease { limit: 1 }, // token 4, expired leases 3: dies, attempts still 1
            StaleAck { which: 3, ack: Ack::Release }, // token 3
            AckDied { which: 0, ack: Ack::Renew }, // token 4, the dead lease's
            Requeue,            // attempts and expired leases 0
            Lease { limit: 1 }, // token 5, nothing expired
            StaleAck { which: 4, ack: Ack::Publish }, // token 4
            Succeed { which: 0 },
            StaleAck { which: 5, ack: Ack::Fail }, // token 5 again, after the publish
            StaleAck { which: 5, ack: Ack::Publish },
        ],
    );
    let expected = Coverage {
        leased: 6,
        published: 1,
        failed: 1,
        renewed: 1,
        expiry_counted: 3,
        died_on_lease: 1,
        fenced: 8,
        requeued: 1,
        ..Coverage::default()
    };
    assert_eq!(coverage, expected);
}

#[test]
fn ordered_aggregate_waits_for_failing_and_dead_rows() {
    use Op::*;
    let coverage = replay(
        SCRIPTED,
        &[
            Emit { aggregate: 1, ordered: true, count: 3 }, // a b c
            Emit { aggregate: 1, ordered: false, count: 1 }, // d
            Emit { aggregate: 2, ordered: true, count: 1 }, // e
            Lease { limit: 4 },                             // a d e
            Fail { which: 0 },                              // a: 1
            Lease { limit: 4 },                             // a
            Fail { which: 0 },                              // a: 2
            Lease { limit: 4 },                             // a
            Fail { which: 0 },                              // a: 3, dead
            Lease { limit: 4 },                             // nothing: b and c wait behind dead a
            Requeue,
            Lease { limit: 4 },   // a
            Release { which: 0 }, // a
            Lease { limit: 4 },   // a
            Succeed { which: 0 }, // a
            Lease { limit: 4 },   // b
            Succeed { which: 0 }, // b
            Lease { limit: 4 },   // c
            Succeed { which: 0 }, // c
            Succeed { which: 0 }, // d
            Succeed { which: 0 }, // e
        ],
    );
    let expected = Coverage {
        leased: 9,
        published: 5,
        failed: 3,
        released: 1,
        died_on_fail: 1,
        requeued: 1,
        ordered_blocked: 7,
        ordered_blocked_by_dead: 1,
        ..Coverage::default()
    };
    assert_eq!(coverage, expected);
}

/// `DeadOrderedEvents::SkipPast`: a dead row lets the later ones of its aggregate through, and
/// once requeued it holds back those not yet leased, though it now comes after the ones that
/// went ahead.
#[test]
fn ordered_aggregate_skips_past_dead_rows_when_told() {
    use Op::*;
    let coverage = replay(
        Settings { skip_dead_ordered: true, ..SCRIPTED },
        &[
            Emit { aggregate: 1, ordered: true, count: 3 }, // a b c
            Lease { limit: 4 },                             // a
            Fail { which: 0 },                              // a: 1
            Lease { limit: 4 },                             // a
            Fail { which: 0 },                              // a: 2
            Lease { limit: 4 },                             // a
            Fail { which: 0 },                              // a: 3, dead
            Lease { limit: 4 },                             // b, past dead a; c waits behind b
            Requeue,                                        // a
            Lease { limit: 4 },                             // a, while b holds its lease
            Succeed { which: 1 },                           // b
            Lease { limit: 4 },                             // nothing: c waits behind a again
            Succeed { which: 0 },                           // a, after b
            Lease { limit: 4 },                             // c
            Succeed { which: 0 },                           // c
        ],
    );
    let expected = Coverage {
        leased: 6,
        published: 3,
        failed: 3,
        died_on_fail: 1,
        requeued: 1,
        ordered_blocked: 6,
        skipped_dead: 1,
        ..Coverage::default()
    };
    assert_eq!(coverage, expected);
}

/// Found by this model: a lease that kills a row (its previous lease expired for the last time
/// allowed) writes its fresh token into the dead row; `publish` and `fail` once accepted it,
/// making the row published and dead at once, or failing it past `max_attempts`. They now
/// refuse dead rows, like `release` and `renew`.
#[test]
fn dead_row_keeps_a_token_that_acknowledges_it() {
    use Op::*;
    for ack in [Ack::Publish, Ack::Fail, Ack::Release, Ack::Renew] {
        replay(
            SCRIPTED,
            &[
                Emit { aggregate: 0, ordered: false, count: 1 },
                Lease { limit: 1 },
                Expire { which: 0 },
                Lease { limit: 1 },
                Expire { which: 0 },
                Lease { limit: 1 },
                Expire { which: 0 },
                // Third expiry counted: the row dies on this lease, which returns `died`.
                Lease { limit: 1 },
                AckDied { which: 0, ack },
            ],
        );
    }
}

/// Found by this model in a lease that read a bounded window of each type and then looked for
/// ordered aggregates' heads beyond it (tried on 2026-12-07, not kept): with the window full of
/// rows waiting behind `a` and `c`, it took the heads in aggregate id order, `c` (aggregate
/// "0", failed and available again) before `a` (aggregate "2", released earlier). A lease takes
/// them oldest first.
#[test]
fn heads_available_again_are_leased_oldest_first() {
    use Op::*;
    let coverage = replay(
        Settings { max_attempts: 2, max_expired_leases: 1, skip_dead_ordered: false },
        &[
            Emit { aggregate: 2, ordered: true, count: 2 }, // a b
            Emit { aggregate: 0, ordered: true, count: 1 }, // c
            Emit { aggregate: 0, ordered: true, count: 2 }, // d e
            Emit { aggregate: 2, ordered: true, count: 1 }, // f
            Lease { limit: 2 },                             // a c
            Release { which: 0 },                           // a
            Fail { which: 0 },                              // c: 1
            Lease { limit: 1 },                             // a, the older of a and c
        ],
    );
    let expected =
        Coverage { leased: 3, failed: 1, released: 1, ordered_blocked: 2, ..Coverage::default() };
    assert_eq!(coverage, expected);
}

/// Found by the same windowed lease: the ordered type's window of four rows held only rows
/// waiting behind their heads, so the type dropped out of the lease's shares, and a lease of one
/// took an unordered row though an ordered head (its lease expired) had waited longest.
#[test]
fn the_type_whose_head_waited_longest_gets_a_row_behind_waiting_ones() {
    use Op::*;
    replay(
        Settings { max_attempts: 1, max_expired_leases: 1, skip_dead_ordered: false },
        &[
            Emit { aggregate: 0, ordered: false, count: 3 },
            Emit { aggregate: 1, ordered: true, count: 3 },
            Emit { aggregate: 0, ordered: true, count: 3 },
            Lease { limit: 3 },
            Emit { aggregate: 2, ordered: true, count: 1 },
            Lease { limit: 1 },
            Lease { limit: 1 },
            Expire { which: 0 },
            Lease { limit: 1 },
        ],
    );
}
