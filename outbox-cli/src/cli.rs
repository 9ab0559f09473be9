//! The command line: clap definitions only. Each command's long help documents its `--json`
//! fields, which are stable.

use std::time::Duration;

use clap::builder::NonEmptyStringValueParser;
use clap::{Args, Parser, Subcommand};
use uuid::Uuid;

/// Operate a transactional outbox: migrate, status, dead letters, purge, forward.
#[derive(Debug, Parser)]
#[command(name = "outbox", version, propagate_version = true)]
#[command(after_long_help = "\
Exit status: 0 on success, 1 when the command failed (database unreachable, schema missing, no \
such dead event, ...), 2 on a usage error. Errors go to stderr, as text even with --json.

With --json, every command prints one JSON document on stdout; its fields are listed in the \
command's --help. Timestamps are RFC 3339 strings in UTC, durations are seconds (numbers).")]
pub struct Cli {
    /// Database URL: postgres://user@host:port/db (sqlite://file.db and mysql://user@host/db:
    /// migrate only, so far)
    #[arg(long, global = true, env = "DATABASE_URL", hide_env_values = true, value_name = "URL")]
    pub database_url: Option<String>,

    /// Print one JSON document on stdout instead of text
    #[arg(long, global = true)]
    pub json: bool,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The top-level commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create or upgrade the outbox schema (safe to run again)
    ///
    /// JSON: {"migrated": true}
    Migrate,

    /// Pending and dead events, the relay's lag, the same per event type and version, the
    /// relays, and the paused types
    ///
    /// The lag is the age of the oldest pending event. Rows of a version newer than the
    /// relays read wait under their own version. Each running relay is listed from its
    /// heartbeat (every 5 s): a relay silent for over 15 s died, hangs or cannot reach the
    /// database; a relay that stopped gracefully is not listed.
    ///
    /// JSON: {"pending": int, "dead": int, "oldest_pending_age_secs": number|null,
    ///        "by_type": [{"aggregate_type": str, "event_type": str, "version": int,
    ///                     "pending": int, "dead": int,
    ///                     "oldest_pending_age_secs": number|null}],
    ///        "relays": [{"relay_id": str, "host": str, "pid": int, "version": str,
    ///                    "lease_mode": str, "handles": [str], "forwards": [str]|null,
    ///                    "started_at": str, "heartbeat_at": str,
    ///                    "since_heartbeat_secs": number, "silent": bool, "held": int,
    ///                    "delivered": int}],
    ///        "paused": [{"aggregate_type": str, "event_type": str, "paused_at": str,
    ///                    "reason": str|null}],
    ///        "subscribers": [as in `outbox subscribers list --help`]}
    #[command(verbatim_doc_comment)]
    Status,

    /// Any event by its id, whatever its state
    #[command(subcommand)]
    Event(EventCommand),

    /// Dead letters: events that exhausted their attempts
    #[command(subcommand)]
    Dead(DeadCommand),

    /// Subscribers of event types: what each has pending and dead, and removing one for good
    #[command(subcommand)]
    Subscribers(SubscribersCommand),

    /// Stop every relay from leasing an event type's rows until it is resumed
    ///
    /// Relays stop with their next lease (within a second); rows they leased before are
    /// delivered. The type's events wait pending; `outbox status` lists the pause.
    ///
    /// JSON: {"paused": bool} (false: it was paused already, and keeps its time and reason)
    Pause(PauseArgs),

    /// Let relays lease an event type's rows again, and wake them
    ///
    /// JSON: {"resumed": bool} (false: it was not paused)
    Resume {
        /// The type, as AGGREGATE_TYPE:EVENT_TYPE
        #[arg(value_name = "AGGREGATE:EVENT", value_parser = parse_event_type)]
        event_type: (String, String),
    },

    /// Deliver a type's events published in a time range again: their rows become pending
    ///
    /// Same event ids (consumers that deduplicate by id skip them), idempotency keys, payloads
    /// and headers; attempts start from zero. An aggregate's replayed ordered events go out in
    /// their order, before its later events still pending. Only rows still kept can be replayed
    /// (not those purged or deleted on publish).
    ///
    /// JSON: {"replayed": int}, or with --dry-run {"would_replay": int}
    #[command(verbatim_doc_comment)]
    Replay(ReplayArgs),

    /// Delete published events older than a given age (pending and dead events are kept)
    ///
    /// JSON: {"purged": int, "older_than_secs": number}
    Purge(PurgeArgs),

    /// A consumer's inbox: its dead messages, and the purge of its handled records
    ///
    /// The inbox (`outbox_runtime::inbox`) records each message a consumer handled from a
    /// broker, so redeliveries are skipped, and keeps the messages whose handler rejected them
    /// or ran out of attempts. Run one of those again from the service that has its handler
    /// (`Inbox::requeue_dead`).
    #[command(subcommand)]
    Inbox(InboxCommand),

    /// Serve the operations console (pages and a JSON API) until SIGINT or SIGTERM
    ///
    /// Overview, relays, events by id, dead letters (filter, requeue, discard), pauses and
    /// replays, in the browser at http://BIND/. Binds loopback by default; any other address
    /// needs a token in OUTBOX_CONSOLE_TOKEN (read from the environment only, never from the
    /// command line where `ps` shows it): people log in with it, scripts send it as
    /// `Authorization: Bearer TOKEN` to /api/... Without a token, only requests over loopback
    /// are answered. --read-only serves no action. Prints the address it serves on stderr.
    ///
    /// JSON (on exit): {"served": true}
    #[command(verbatim_doc_comment)]
    Console(ConsoleArgs),

    /// Forward events to a broker until SIGINT or SIGTERM: a relay with no Rust code of yours
    ///
    /// Every committed event (or those of --event-type) is published to the broker and marked
    /// published once the broker confirmed it; refusals are retried with backoff and end as
    /// dead letters after --max-attempts. Stops gracefully (leases handed back) on SIGINT or
    /// SIGTERM. Logs one line per failure to stderr (no payloads), a progress line every
    /// --progress, and a summary on exit. Every flag can be set from the environment instead.
    ///
    /// JSON (on exit): {"forwarded": int, "failed": int, "dead": int, "handed_back": int}
    #[command(verbatim_doc_comment)]
    Forward(Box<ForwardArgs>),
}

/// Arguments of `outbox forward`.
#[derive(Debug, Args)]
pub struct ForwardArgs {
    /// The broker: nats://host:port (JetStream; needs --stream), amqp://user:password@host:port/vhost
    /// (RabbitMQ; needs --exchange), redis://host:port (Redis Streams), or
    /// kafka://host:port,host:port (Kafka, one broker or more). TLS with tls://, amqps://,
    /// rediss:// or kafka+ssl://: TLS or no connection, the broker's certificate checked against the
    /// system's roots (SSL_CERT_FILE or SSL_CERT_DIR to trust others; --kafka-ca for Kafka).
    /// NATS credentials: nats://user:password@host:port, nats://token@host:port, --nats-creds
    /// or --nats-nkey. Kafka SASL: kafka://user:password@host:port (or kafka+ssl://) with
    /// --kafka-sasl-mechanism
    #[arg(long, env = "OUTBOX_FORWARD_TO", value_name = "URL", hide_env_values = true)]
    pub to: String,

    /// A NATS credentials file (a user JWT and its nkey seed, as `nsc` writes it)
    #[arg(long, env = "OUTBOX_FORWARD_NATS_CREDS", value_name = "FILE")]
    pub nats_creds: Option<std::path::PathBuf>,

    /// A NATS nkey seed (SU...) to sign the server's challenge with; better from the environment
    #[arg(long, env = "OUTBOX_FORWARD_NATS_NKEY", value_name = "SEED", hide_env_values = true)]
    pub nats_nkey: Option<String>,

    /// The JetStream stream the subjects go into (NATS)
    #[arg(long, env = "OUTBOX_FORWARD_STREAM", value_name = "NAME")]
    pub stream: Option<String>,

    /// The exchange messages are published to, with the destination as routing key (RabbitMQ)
    #[arg(long, env = "OUTBOX_FORWARD_EXCHANGE", value_name = "NAME")]
    pub exchange: Option<String>,

    /// Trim each Redis stream to about this many entries as it is appended to (MAXLEN ~)
    #[arg(
        long,
        env = "OUTBOX_FORWARD_REDIS_MAXLEN",
        value_name = "N",
        conflicts_with = "redis_max_age"
    )]
    pub redis_maxlen: Option<u64>,

    /// Trim each Redis stream to about the entries of this last while, e.g. 7d (MINID ~)
    #[arg(
        long,
        env = "OUTBOX_FORWARD_REDIS_MAX_AGE",
        value_name = "DURATION",
        value_parser = humantime::parse_duration
    )]
    pub redis_max_age: Option<Duration>,

    /// A Kafka SASL mechanism for the URL's user and password: PLAIN, SCRAM-SHA-256 or
    /// SCRAM-SHA-512
    #[arg(
        long,
        env = "OUTBOX_FORWARD_KAFKA_SASL_MECHANISM",
        value_name = "MECHANISM",
        default_value = "SCRAM-SHA-512"
    )]
    pub kafka_sasl_mechanism: String,

    /// The CA certificates (PEM) a Kafka broker's certificate is checked against
    #[arg(long, env = "OUTBOX_FORWARD_KAFKA_CA", value_name = "FILE")]
    pub kafka_ca: Option<std::path::PathBuf>,

    /// A client certificate (PEM) for Kafka, with --kafka-key
    #[arg(long, env = "OUTBOX_FORWARD_KAFKA_CERT", value_name = "FILE", requires = "kafka_key")]
    pub kafka_cert: Option<std::path::PathBuf>,

    /// The client certificate's private key (PEM) for Kafka
    #[arg(long, env = "OUTBOX_FORWARD_KAFKA_KEY", value_name = "FILE", requires = "kafka_cert")]
    pub kafka_key: Option<std::path::PathBuf>,

    /// Create the Kafka topics that do not exist, with PARTITIONS:REPLICAS (checked at start: a
    /// fixed topic, or the topics of --event-type)
    #[arg(
        long,
        env = "OUTBOX_FORWARD_KAFKA_CREATE_TOPICS",
        value_name = "PARTITIONS:REPLICAS",
        value_parser = parse_topic_layout
    )]
    pub kafka_create_topics: Option<(i32, i32)>,

    /// Any other librdkafka producer property, as KEY=VALUE (repeat, or comma-separate in the
    /// environment); the sink's own (idempotence, acks) win
    #[arg(
        long,
        env = "OUTBOX_FORWARD_KAFKA_OPTIONS",
        value_name = "KEY=VALUE",
        value_delimiter = ',',
        value_parser = parse_property
    )]
    pub kafka_option: Vec<(String, String)>,

    /// Where each event goes: the NATS subject, RabbitMQ routing key, Redis stream key or Kafka
    /// topic (--subject, --routing-key, --stream-key and --topic say the same), from
    /// {aggregate_type}, {event_type} and {aggregate_id}
    #[arg(
        long,
        visible_aliases = ["subject", "routing-key", "stream-key", "topic"],
        env = "OUTBOX_FORWARD_DESTINATION",
        value_name = "TEMPLATE",
        default_value = outbox_runtime::forward::DEFAULT_DESTINATION
    )]
    pub destination: String,

    /// Forward only this type, as AGGREGATE_TYPE:EVENT_TYPE (repeat, or comma-separate in the
    /// environment); default every type
    #[arg(
        long,
        env = "OUTBOX_FORWARD_EVENT_TYPES",
        value_name = "AGGREGATE:EVENT",
        value_delimiter = ',',
        value_parser = parse_event_type
    )]
    pub event_type: Vec<(String, String)>,

    /// Rows leased per statement (default: sized from the backlog, 100 to 1,000)
    #[arg(long, env = "OUTBOX_FORWARD_BATCH_SIZE", value_name = "N")]
    pub batch_size: Option<u32>,

    /// Messages in flight at once (default: the relay's for forwarding, 256)
    #[arg(long, env = "OUTBOX_FORWARD_CONCURRENCY", value_name = "N")]
    pub concurrency: Option<usize>,

    /// Refusals after which an event is dead
    #[arg(long, env = "OUTBOX_FORWARD_MAX_ATTEMPTS", value_name = "N", default_value_t = 10)]
    pub max_attempts: u32,

    /// Name the event's own headers as CloudEvents binary mode does (ce-id, ce-type, ...)
    #[arg(long, env = "OUTBOX_FORWARD_CLOUDEVENTS")]
    pub cloudevents: bool,

    /// Serve Prometheus metrics at /metrics and a health check at /health on this address
    #[arg(long, env = "OUTBOX_FORWARD_METRICS_ADDR", value_name = "HOST:PORT")]
    pub metrics_addr: Option<std::net::SocketAddr>,

    /// How often to print a progress line, e.g. 10s, 1m
    #[arg(
        long,
        env = "OUTBOX_FORWARD_PROGRESS",
        value_name = "DURATION",
        default_value = "10s",
        value_parser = humantime::parse_duration
    )]
    pub progress: Duration,
}

/// `order:order.placed` -> `("order", "order.placed")`.
fn parse_event_type(value: &str) -> Result<(String, String), String> {
    match value.split_once(':') {
        Some((aggregate, event)) if !aggregate.is_empty() && !event.is_empty() => {
            Ok((aggregate.to_owned(), event.to_owned()))
        }
        _ => Err(format!("expected AGGREGATE_TYPE:EVENT_TYPE, got `{value}`")),
    }
}

/// `6:3` -> `(6, 3)`: partitions and replicas of a topic to create.
fn parse_topic_layout(value: &str) -> Result<(i32, i32), String> {
    let parsed = value.split_once(':').and_then(|(partitions, replicas)| {
        Some((partitions.parse::<i32>().ok()?, replicas.parse::<i32>().ok()?))
    });
    match parsed {
        Some((partitions, replicas)) if partitions > 0 && replicas > 0 => {
            Ok((partitions, replicas))
        }
        _ => Err(format!("expected PARTITIONS:REPLICAS, two positive numbers, got `{value}`")),
    }
}

/// `linger.ms=5` -> `("linger.ms", "5")`.
fn parse_property(value: &str) -> Result<(String, String), String> {
    match value.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!("expected KEY=VALUE, got `{value}`")),
    }
}

/// `outbox event ...`.
#[derive(Debug, Subcommand)]
pub enum EventCommand {
    /// Everything about one event: its state, attempts, last error, payload and headers
    ///
    /// state: pending (deliverable now), leased (being delivered), waiting (delayed, backing
    /// off or snoozed until available_at), published, or dead.
    ///
    /// JSON: {"event_id": uuid, "aggregate_type": str, "aggregate_id": str, "event_type": str,
    ///        "event_version": int, "ordered": bool, "idempotency_key": str|null,
    ///        "state": str, "attempts": int, "expired_leases": int, "created_at": time,
    ///        "available_at": time, "published_at": time|null, "dead_at": time|null,
    ///        "last_error": str|null, "headers": object, "payload": any}
    #[command(verbatim_doc_comment)]
    Show {
        /// The event's id
        #[arg(value_name = "EVENT_ID")]
        event_id: Uuid,
    },
}

/// `outbox dead ...`.
#[derive(Debug, Subcommand)]
pub enum DeadCommand {
    /// List dead events, oldest id first, one page at a time
    ///
    /// JSON: {"events": [EVENT, ...], "next_after": uuid|null}
    /// where EVENT is as in `outbox dead show --help`, and next_after, set when the page is
    /// full, is the value for --after that reads the next page.
    #[command(verbatim_doc_comment)]
    List(ListArgs),

    /// Everything about one dead event: payload, headers, the full last error
    ///
    /// JSON: {"event_id": uuid, "aggregate_type": str, "aggregate_id": str, "event_type": str,
    ///        "event_version": int, "attempts": int, "expired_leases": int,
    ///        "created_at": time, "dead_at": time,
    ///        "last_error": str|null, "headers": object, "payload": any}
    #[command(verbatim_doc_comment)]
    Show {
        /// The dead event's id
        #[arg(value_name = "EVENT_ID")]
        event_id: Uuid,
    },

    /// Make dead events pending again: attempts reset to 0, deliverable now, last error kept
    ///
    /// Name one event, narrow by type, error text or age, or pass --all explicitly; `outbox
    /// dead count` with the same arguments says how many first.
    ///
    /// JSON: {"requeued": int}
    Requeue(Selector),

    /// Delete dead events for good (list them first if you want a record)
    ///
    /// Name one event, narrow by type, error text or age, or pass --all explicitly; `outbox
    /// dead count` with the same arguments says how many first.
    ///
    /// JSON: {"discarded": int}
    Discard(Selector),

    /// Count dead events: what `requeue` or `discard` with the same arguments would act on now
    ///
    /// JSON: {"dead": int}
    Count(Selector),
}

/// `outbox subscribers ...`.
#[derive(Debug, Subcommand)]
pub enum SubscribersCommand {
    /// Every registered subscriber per event type, with its pending and dead copies
    ///
    /// A subscriber is registered when a relay that runs it starts. Its pending copies are the
    /// events it still has to take: those it failed or snoozed, those waiting behind an earlier
    /// event of their aggregate, and those other relays leased while none of its relays ran.
    ///
    /// JSON: {"subscribers": [{"subscriber": str, "aggregate_type": str, "event_type": str,
    ///                         "registered_at": time, "pending": int,
    ///                         "oldest_pending": time|null, "dead": int}]}
    #[command(verbatim_doc_comment)]
    List,

    /// Forget a subscriber for good: its registrations and its pending and dead copies
    ///
    /// Remove its code from every relay first: a relay that still runs it registers it again
    /// when it starts. Published copies stay as history, for `purge`.
    ///
    /// JSON: {"registrations": int, "pending": int, "dead": int}
    Remove {
        /// The subscriber's name
        #[arg(value_name = "NAME", value_parser = NonEmptyStringValueParser::new())]
        name: String,
    },
}

/// `outbox inbox ...`.
#[derive(Debug, Subcommand)]
pub enum InboxCommand {
    /// A consumer's dead messages, the longest dead first, with how many there are
    ///
    /// JSON: {"dead": int, "messages": [{"event_id": uuid, "aggregate_type": str,
    ///        "aggregate_id": str, "event_type": str, "event_version": int, "payload": str,
    ///        "headers": object, "received_at": time, "dead_at": time, "attempts": int,
    ///        "last_error": str|null}]}
    #[command(verbatim_doc_comment)]
    Dead {
        /// The consumer (the name its `Inbox` was built with)
        #[arg(long, value_name = "NAME", value_parser = NonEmptyStringValueParser::new())]
        consumer: String,

        /// At most this many messages
        #[arg(long, value_name = "N", default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
        limit: u32,
    },

    /// Delete one of a consumer's dead messages for good (a later delivery of it is new)
    ///
    /// JSON: {"discarded": 1}
    Discard {
        /// The consumer (the name its `Inbox` was built with)
        #[arg(long, value_name = "NAME", value_parser = NonEmptyStringValueParser::new())]
        consumer: String,

        /// The dead message's event id (fails if the consumer has no such dead message)
        #[arg(value_name = "EVENT_ID")]
        event_id: Uuid,
    },

    /// Delete a consumer's handled records older than an age (dead and failing ones are kept)
    ///
    /// Keep records longer than the broker may redeliver a message: a redelivery after its
    /// record is gone is handled again.
    ///
    /// JSON: {"purged": int, "older_than_secs": number}
    Purge {
        /// The consumer (the name its `Inbox` was built with)
        #[arg(long, value_name = "NAME", value_parser = NonEmptyStringValueParser::new())]
        consumer: String,

        /// Age of the handled records to delete, e.g. 7d, 36h
        #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
        older_than: Duration,
    },
}

/// Filters and paging of `outbox dead list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only events of this aggregate type
    #[arg(long, value_name = "TYPE", value_parser = NonEmptyStringValueParser::new())]
    pub aggregate_type: Option<String>,

    /// Only events of this event type
    #[arg(long, value_name = "TYPE", value_parser = NonEmptyStringValueParser::new())]
    pub event_type: Option<String>,

    /// Only events whose last error contains this text, ignoring case
    #[arg(long, value_name = "TEXT", value_parser = NonEmptyStringValueParser::new())]
    pub error: Option<String>,

    /// Only events that died less than this long ago, e.g. 2h
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub newer_than: Option<Duration>,

    /// Only events that died more than this long ago, e.g. 7d
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub older_than: Option<Duration>,

    /// Only this subscriber's copies of events (dead for it alone)
    #[arg(long, value_name = "NAME", value_parser = NonEmptyStringValueParser::new())]
    pub subscriber: Option<String>,

    /// At most this many events
    #[arg(long, value_name = "N", default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
    pub limit: u32,

    /// Start after this event id (the previous page's last, or its `next_after`)
    #[arg(long, value_name = "EVENT_ID")]
    pub after: Option<Uuid>,
}

/// Which dead events `requeue` or `discard` act on; one of them must be given.
#[derive(Debug, Args)]
#[group(id = "selector", required = true, multiple = true)]
pub struct Selector {
    /// Only this dead event (fails if there is no dead event with this id)
    #[arg(value_name = "EVENT_ID", conflicts_with = "all", conflicts_with_all = NARROWING)]
    pub event_id: Option<Uuid>,

    /// Every dead event
    #[arg(long, conflicts_with_all = NARROWING)]
    pub all: bool,

    /// Every dead event of this aggregate type
    #[arg(long, value_name = "TYPE", value_parser = NonEmptyStringValueParser::new())]
    pub aggregate_type: Option<String>,

    /// Every dead event of this event type
    #[arg(long, value_name = "TYPE", value_parser = NonEmptyStringValueParser::new())]
    pub event_type: Option<String>,

    /// Every dead event whose last error contains this text, ignoring case
    #[arg(long, value_name = "TEXT", value_parser = NonEmptyStringValueParser::new())]
    pub error: Option<String>,

    /// Every dead event that died less than this long ago, e.g. 2h
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub newer_than: Option<Duration>,

    /// Every dead event that died more than this long ago, e.g. 7d
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub older_than: Option<Duration>,

    /// Every dead copy of this subscriber (requeued, it goes to this subscriber alone)
    #[arg(long, value_name = "NAME", value_parser = NonEmptyStringValueParser::new())]
    pub subscriber: Option<String>,
}

/// The [`Selector`] arguments that narrow the dead events down, which an event id or `--all`
/// cannot be combined with.
const NARROWING: [&str; 6] =
    ["aggregate_type", "event_type", "error", "newer_than", "older_than", "subscriber"];

/// Arguments of `outbox pause`.
#[derive(Debug, Args)]
pub struct PauseArgs {
    /// The type, as AGGREGATE_TYPE:EVENT_TYPE
    #[arg(value_name = "AGGREGATE:EVENT", value_parser = parse_event_type)]
    pub event_type: (String, String),

    /// Why, for whoever looks next (shown by `outbox status`)
    #[arg(long, value_name = "TEXT")]
    pub reason: Option<String>,
}

/// Arguments of `outbox replay`.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The type, as AGGREGATE_TYPE:EVENT_TYPE
    #[arg(value_name = "AGGREGATE:EVENT", value_parser = parse_event_type)]
    pub event_type: (String, String),

    /// Events published less than this long ago, e.g. 2h
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub newer_than: Duration,

    /// And more than this long ago (default: up to now)
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub older_than: Option<Duration>,

    /// Deliver them to this subscriber alone, not to every subscriber of the type
    #[arg(long, value_name = "NAME")]
    pub subscriber: Option<String>,

    /// Count them, replay nothing
    #[arg(long)]
    pub dry_run: bool,
}

/// Arguments of `outbox purge`.
#[derive(Debug, Args)]
pub struct PurgeArgs {
    /// Age of the published events to delete, e.g. 7d, 36h, 90m
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub older_than: Duration,
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn definitions_are_consistent() {
        super::Cli::command().debug_assert();
    }
}

/// `outbox console`.
#[derive(Debug, Args)]
pub struct ConsoleArgs {
    /// Address to serve on (port 0: any free port)
    #[arg(
        long,
        env = "OUTBOX_CONSOLE_BIND",
        default_value = "127.0.0.1:8080",
        value_name = "ADDR"
    )]
    pub bind: std::net::SocketAddr,

    /// Serve the pages and the API's reads only: no requeue, discard, pause, resume or replay
    #[arg(long, env = "OUTBOX_CONSOLE_READ_ONLY")]
    pub read_only: bool,
}
