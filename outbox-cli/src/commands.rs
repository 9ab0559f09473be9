//! Each command's database work, through the runtime's public API. Rendering is `output`'s job.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use outbox_runtime::dead_letters::{self, DeadEvent, DeadFilter};
use outbox_runtime::events::EventRecord;
use outbox_runtime::inbox::{self, dead_letters::DeadMessage};
use outbox_runtime::pauses::{self, PausedType};
use outbox_runtime::relays::RelayStatus;
use outbox_runtime::replay;
use outbox_runtime::subscribers::{self, SubscriberStatus};
use outbox_runtime::{OutboxStats, TypeStats};
use sqlx::PgPool;

use crate::cli::{
    Command, DeadCommand, EventCommand, InboxCommand, ListArgs, Selector, SubscribersCommand,
};
use crate::connect::Database;
use crate::error::Failure;

/// Handled inbox records `outbox inbox purge` deletes per statement.
const PURGE_BATCH: i64 = 10_000;

/// What a command found or did, for `output` to render.
#[derive(Debug)]
pub enum Report {
    /// `migrate` applied the schema.
    Migrated,
    /// `status`.
    Status {
        /// The totals.
        stats: OutboxStats,
        /// Per `(aggregate_type, event_type)`.
        by_type: Vec<TypeStats>,
        /// The relays' entries, silent ones included.
        relays: Vec<RelayStatus>,
        /// The paused types.
        paused: Vec<PausedType>,
        /// The registered subscribers.
        subscribers: Vec<SubscriberStatus>,
    },
    /// `subscribers list`.
    Subscribers(Vec<SubscriberStatus>),
    /// `subscribers remove`: what it deleted.
    SubscriberRemoved(subscribers::Removed),
    /// `pause`: whether the type was running.
    Paused(bool),
    /// `resume`: whether the type was paused.
    Resumed(bool),
    /// `replay`: how many, and whether only counted (`--dry-run`).
    Replayed {
        /// Events made pending, or that would be.
        count: u64,
        /// `--dry-run`.
        dry_run: bool,
    },
    /// `dead list`.
    DeadList {
        /// The page.
        events: Vec<DeadEvent>,
        /// The id to pass as `--after` for the next page, when this one is full.
        next_after: Option<uuid::Uuid>,
    },
    /// `dead show`.
    DeadShow(Box<DeadEvent>),
    /// `event show`.
    EventShow(Box<EventRecord>),
    /// `dead requeue`: how many.
    Requeued(u64),
    /// `dead discard`: how many.
    Discarded(u64),
    /// `dead count`: how many.
    DeadCount(u64),
    /// `inbox dead`: how many, and the page.
    InboxDead {
        /// All of the consumer's dead messages.
        count: i64,
        /// The longest dead of them.
        messages: Vec<DeadMessage>,
    },
    /// `inbox discard`: done.
    InboxDiscarded,
    /// `inbox purge`: how many, and the age given.
    InboxPurged {
        /// Records deleted.
        count: u64,
        /// `--older-than`.
        older_than: Duration,
    },
    /// `console`: served until stopped.
    Served,
    /// `forward`: what the forwarding relay did before it stopped.
    Forwarded(outbox_runtime::RelayCounts),
    /// `purge`: how many, and the age given.
    Purged {
        /// Rows deleted.
        count: u64,
        /// `--older-than`.
        older_than: Duration,
    },
}

/// Runs `command` against the database: every command on PostgreSQL, `migrate` alone on SQLite
/// and MySQL so far.
pub async fn run(database: &Database, command: &Command) -> Result<Report, Failure> {
    let backend = match (database, command) {
        (Database::Postgres(pool), _) => return run_on_postgres(pool, command).await,
        (Database::Sqlite(pool), Command::Migrate) => {
            outbox_runtime::migrate(pool).await?;
            return Ok(Report::Migrated);
        }
        (Database::MySql(pool), Command::Migrate) => {
            outbox_runtime::migrate(pool).await?;
            return Ok(Report::Migrated);
        }
        (Database::Sqlite(_), _) => "SQLite",
        (Database::MySql(_), _) => "MySQL",
    };
    Err(Failure::PostgresOnly { backend })
}

/// Runs `command` against `pool`. Every command but `migrate` first checks that the schema has
/// the migrations this version needs: against an outdated one it says to migrate, instead of
/// failing on a missing column (or, for `forward`, retrying one).
async fn run_on_postgres(pool: &PgPool, command: &Command) -> Result<Report, Failure> {
    if !matches!(command, Command::Migrate) {
        outbox_runtime::check_schema(pool).await?;
    }
    match command {
        Command::Migrate => {
            outbox_runtime::migrate(pool).await?;
            Ok(Report::Migrated)
        }
        Command::Status => {
            // One reading: the totals and the table cannot disagree.
            let by_type = outbox_runtime::stats_by_type(pool).await?;
            let stats = OutboxStats::total(&by_type);
            let relays = outbox_runtime::relays::relays(pool).await?;
            let paused = pauses::paused(pool).await?;
            let subscribers = subscribers::list(pool).await?;
            Ok(Report::Status { stats, by_type, relays, paused, subscribers })
        }
        Command::Subscribers(SubscribersCommand::List) => {
            Ok(Report::Subscribers(subscribers::list(pool).await?))
        }
        Command::Subscribers(SubscribersCommand::Remove { name }) => {
            Ok(Report::SubscriberRemoved(subscribers::remove(pool, name).await?))
        }
        Command::Pause(args) => {
            let (aggregate_type, event_type) = &args.event_type;
            let reason = args.reason.as_deref();
            Ok(Report::Paused(pauses::pause(pool, aggregate_type, event_type, reason).await?))
        }
        Command::Replay(args) => {
            let (aggregate_type, event_type) = &args.event_type;
            check_range(Some(args.newer_than), args.older_than)?;
            let (from, until) = (ago(args.newer_than), args.older_than.map_or_else(Utc::now, ago));
            let count = match (&args.subscriber, args.dry_run) {
                (_, true) => replay::count(pool, aggregate_type, event_type, from, until).await?,
                (None, false) => {
                    replay::replay(pool, aggregate_type, event_type, from, until).await?
                }
                (Some(subscriber), false) => {
                    let (a, e) = (aggregate_type, event_type);
                    replay::replay_to(pool, subscriber, a, e, from, until).await?
                }
            };
            Ok(Report::Replayed { count, dry_run: args.dry_run })
        }
        Command::Resume { event_type: (aggregate_type, event_type) } => {
            Ok(Report::Resumed(pauses::resume(pool, aggregate_type, event_type).await?))
        }
        Command::Event(EventCommand::Show { event_id }) => {
            match outbox_runtime::events::get(pool, *event_id).await? {
                Some(event) => Ok(Report::EventShow(Box::new(event))),
                None => Err(Failure::NoSuchEvent(*event_id)),
            }
        }
        Command::Dead(DeadCommand::List(args)) => list(pool, args).await,
        Command::Dead(DeadCommand::Show { event_id }) => {
            match dead_letters::get(pool, *event_id).await? {
                Some(event) => Ok(Report::DeadShow(Box::new(event))),
                None => Err(Failure::NoSuchDeadEvent(*event_id)),
            }
        }
        Command::Dead(DeadCommand::Requeue(selector)) => {
            let count = dead_letters::requeue(pool, &filter(selector)?).await?;
            found(selector, count).map(Report::Requeued)
        }
        Command::Dead(DeadCommand::Discard(selector)) => {
            let count = dead_letters::discard(pool, &filter(selector)?).await?;
            found(selector, count).map(Report::Discarded)
        }
        Command::Dead(DeadCommand::Count(selector)) => {
            Ok(Report::DeadCount(dead_letters::count(pool, &filter(selector)?).await?))
        }
        Command::Inbox(InboxCommand::Dead { consumer, limit }) => {
            let count = inbox::dead_letters::count(pool, consumer).await?;
            let messages = inbox::dead_letters::list(pool, consumer, i64::from(*limit)).await?;
            Ok(Report::InboxDead { count, messages })
        }
        Command::Inbox(InboxCommand::Discard { consumer, event_id }) => {
            match inbox::dead_letters::discard(pool, consumer, *event_id).await? {
                true => Ok(Report::InboxDiscarded),
                false => Err(Failure::NoSuchDeadMessage {
                    consumer: consumer.clone(),
                    event_id: *event_id,
                }),
            }
        }
        Command::Inbox(InboxCommand::Purge { consumer, older_than }) => {
            let count = inbox::purge_handled(pool, consumer, *older_than, PURGE_BATCH).await?;
            Ok(Report::InboxPurged { count, older_than: *older_than })
        }
        Command::Console(args) => crate::console::run(pool, args).await.map(|()| Report::Served),
        Command::Forward(args) => Ok(Report::Forwarded(crate::forward::run(pool, args).await?)),
        Command::Purge(args) => {
            let count = outbox_runtime::purge_published(pool, args.older_than).await?;
            Ok(Report::Purged { count, older_than: args.older_than })
        }
    }
}

async fn list(pool: &PgPool, args: &ListArgs) -> Result<Report, Failure> {
    check_range(args.newer_than, args.older_than)?;
    let narrowing = Narrowing {
        aggregate_type: &args.aggregate_type,
        event_type: &args.event_type,
        error: &args.error,
        newer_than: args.newer_than,
        older_than: args.older_than,
        subscriber: &args.subscriber,
    };
    let filter = narrowing.filter();
    let events = dead_letters::list(pool, &filter, args.after, args.limit).await?;
    let full = events.len() >= args.limit as usize;
    let next_after = events.last().filter(|_| full).map(|event| event.event_id);
    Ok(Report::DeadList { events, next_after })
}

/// The runtime's filter for a selector; clap guarantees one of its parts is set, and that an
/// event id or `--all` comes alone.
fn filter(selector: &Selector) -> Result<DeadFilter, Failure> {
    if let Some(event_id) = selector.event_id {
        return Ok(DeadFilter::event(event_id));
    }
    check_range(selector.newer_than, selector.older_than)?;
    let narrowing = Narrowing {
        aggregate_type: &selector.aggregate_type,
        event_type: &selector.event_type,
        error: &selector.error,
        newer_than: selector.newer_than,
        older_than: selector.older_than,
        subscriber: &selector.subscriber,
    };
    Ok(narrowing.filter())
}

/// The arguments that narrow dead events down, shared by `list` and the selector.
struct Narrowing<'a> {
    aggregate_type: &'a Option<String>,
    event_type: &'a Option<String>,
    error: &'a Option<String>,
    newer_than: Option<Duration>,
    older_than: Option<Duration>,
    subscriber: &'a Option<String>,
}

impl Narrowing<'_> {
    fn filter(&self) -> DeadFilter {
        let mut filter = DeadFilter::all();
        if let Some(aggregate_type) = self.aggregate_type {
            filter = filter.aggregate_type(aggregate_type);
        }
        if let Some(event_type) = self.event_type {
            filter = filter.event_type(event_type);
        }
        if let Some(error) = self.error {
            filter = filter.error_contains(error);
        }
        if let Some(age) = self.newer_than {
            filter = filter.dead_after(ago(age));
        }
        if let Some(age) = self.older_than {
            filter = filter.dead_before(ago(age));
        }
        if let Some(subscriber) = self.subscriber {
            filter = filter.subscriber(subscriber);
        }
        filter
    }
}

/// A named event that matched nothing is an error (a typo, or it is not dead); a filter that
/// matched nothing is not.
fn found(selector: &Selector, count: u64) -> Result<u64, Failure> {
    match selector.event_id {
        Some(event_id) if count == 0 => Err(Failure::NoSuchDeadEvent(event_id)),
        _ => Ok(count),
    }
}

/// Refuses `--newer-than` and `--older-than` that leave no instant between them.
fn check_range(newer_than: Option<Duration>, older_than: Option<Duration>) -> Result<(), Failure> {
    match (newer_than, older_than) {
        (Some(newer_than), Some(older_than)) if older_than >= newer_than => {
            Err(Failure::EmptyRange { newer_than, older_than })
        }
        _ => Ok(()),
    }
}

/// The instant `age` ago; an age past chrono's range reaches back to its earliest instant.
fn ago(age: Duration) -> DateTime<Utc> {
    TimeDelta::from_std(age)
        .ok()
        .and_then(|age| Utc::now().checked_sub_signed(age))
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}
