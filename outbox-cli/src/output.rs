//! Rendering a [`Report`]: aligned plain-text tables for people, one JSON document for scripts.
//! The JSON field names are a stable interface, documented in each command's `--help`.

use std::time::Duration;

use outbox_runtime::dead_letters::DeadEvent;
use outbox_runtime::events::{EventRecord, EventState};
use outbox_runtime::inbox::dead_letters::DeadMessage;
use outbox_runtime::pauses::PausedType;
use outbox_runtime::relays::RelayStatus;
use outbox_runtime::subscribers::SubscriberStatus;
use outbox_runtime::{OutboxStats, TypeStats};
use serde_json::{json, Value};
use sqlx::types::chrono::{DateTime, Utc};

use crate::commands::Report;

/// Characters of `last_error` shown in the `dead list` table.
const ERROR_WIDTH: usize = 60;

/// The report as one JSON document: the runtime's types serialize to the documented shapes.
pub fn json(report: &Report) -> Value {
    match report {
        Report::Migrated => json!({ "migrated": true }),
        Report::Status { stats, by_type, relays, paused, subscribers } => json!({
            "pending": stats.pending,
            "dead": stats.dead,
            "oldest_pending_age_secs": stats.oldest_pending_age.map(|age| age.as_secs_f64()),
            "by_type": by_type,
            "relays": relays,
            "paused": paused,
            "subscribers": subscribers,
        }),
        Report::Subscribers(subscribers) => json!({ "subscribers": subscribers }),
        Report::SubscriberRemoved(removed) => json!(removed),
        Report::Paused(newly) => json!({ "paused": newly }),
        Report::Resumed(was_paused) => json!({ "resumed": was_paused }),
        Report::Replayed { count, dry_run: false } => json!({ "replayed": count }),
        Report::Replayed { count, dry_run: true } => json!({ "would_replay": count }),
        Report::DeadList { events, next_after } => json!({
            "events": events,
            "next_after": next_after,
        }),
        Report::DeadShow(event) => json!(event),
        Report::EventShow(event) => json!(event),
        Report::Requeued(count) => json!({ "requeued": count }),
        Report::Discarded(count) => json!({ "discarded": count }),
        Report::DeadCount(count) => json!({ "dead": count }),
        Report::InboxDead { count, messages } => json!({ "dead": count, "messages": messages }),
        Report::InboxDiscarded => json!({ "discarded": 1 }),
        Report::Purged { count, older_than } | Report::InboxPurged { count, older_than } => {
            json!({ "purged": count, "older_than_secs": older_than.as_secs_f64() })
        }
        Report::Served => json!({ "served": true }),
        Report::Forwarded(counts) => json!({
            "forwarded": counts.delivered,
            "failed": counts.failed,
            "dead": counts.dead,
            "handed_back": counts.handed_back,
        }),
    }
}

fn state(state: EventState) -> &'static str {
    match state {
        EventState::Pending => "pending",
        EventState::Leased => "leased",
        EventState::Waiting => "waiting",
        EventState::Published => "published",
        EventState::Dead => "dead",
        _ => "unknown",
    }
}

/// The report as text for a terminal, ending in a newline.
pub fn human(report: &Report) -> String {
    match report {
        Report::Migrated => "the outbox schema is up to date\n".into(),
        Report::Status { stats, by_type, relays, paused, subscribers } => {
            let mut text = status(stats, by_type, relays, paused);
            if !subscribers.is_empty() {
                text.push('\n');
                text.push_str(&subscriber_table(subscribers));
            }
            text
        }
        Report::Subscribers(subscribers) if subscribers.is_empty() => {
            "no subscribers registered\n".into()
        }
        Report::Subscribers(subscribers) => subscriber_table(subscribers),
        Report::SubscriberRemoved(removed) => format!(
            "removed {} and the subscriber's copies of events: {} pending, {} dead\n",
            plural(removed.registrations, "registration"),
            removed.pending,
            removed.dead,
        ),
        Report::Paused(true) => {
            "paused: relays lease none of its events until it is resumed\n".into()
        }
        Report::Paused(false) => "already paused\n".into(),
        Report::Resumed(true) => "resumed: relays lease its events again\n".into(),
        Report::Resumed(false) => "not paused\n".into(),
        Report::Replayed { count, dry_run: false } => {
            format!("replayed {}: pending again\n", plural(*count, "event"))
        }
        Report::Replayed { count, dry_run: true } => {
            format!("would replay {} (dry run)\n", plural(*count, "event"))
        }
        Report::DeadList { events, next_after } => dead_list(events, *next_after),
        Report::InboxDead { count, messages } => inbox_dead(*count, messages),
        Report::InboxDiscarded => "discarded 1 dead message\n".into(),
        Report::InboxPurged { count, older_than } => format!(
            "purged {} handled more than {} ago\n",
            plural(*count, "inbox record"),
            duration(*older_than)
        ),
        Report::DeadShow(event) => dead_show(event),
        Report::EventShow(event) => event_show(event),
        Report::Requeued(count) => format!("requeued {}\n", plural(*count, "dead event")),
        Report::Discarded(count) => format!("discarded {}\n", plural(*count, "dead event")),
        Report::DeadCount(count) => format!("{}\n", plural(*count, "dead event")),
        Report::Purged { count, older_than } => format!(
            "purged {} published more than {} ago\n",
            plural(*count, "event"),
            duration(*older_than)
        ),
        Report::Served => "console stopped\n".into(),
        Report::Forwarded(counts) => format!(
            "forwarded {}; {} failed, {} dead, {} handed back at shutdown\n",
            plural(counts.delivered, "event"),
            counts.failed,
            counts.dead,
            counts.handed_back
        ),
    }
}

fn status(
    stats: &OutboxStats,
    by_type: &[TypeStats],
    relays: &[RelayStatus],
    paused: &[PausedType],
) -> String {
    let mut out = Table::new(&[], &[false, true]);
    out.row(["pending".into(), stats.pending.to_string()]);
    out.row(["dead".into(), stats.dead.to_string()]);
    out.row(["lag".into(), lag(stats.oldest_pending_age)]);
    let silent = relays.iter().filter(|relay| relay.silent).count();
    out.row(["relays".into(), format!("{} running, {silent} silent", relays.len() - silent)]);
    let mut text = out.render();
    if !by_type.is_empty() {
        let headers = ["AGGREGATE TYPE", "EVENT TYPE", "VERSION", "PENDING", "DEAD", "LAG"];
        let mut table = Table::new(&headers, &[false, false, true, true, true, true]);
        for stats in by_type {
            table.row([
                stats.aggregate_type.clone(),
                stats.event_type.clone(),
                stats.version.to_string(),
                stats.pending.to_string(),
                stats.dead.to_string(),
                lag(stats.oldest_pending_age),
            ]);
        }
        text.push('\n');
        text.push_str(&table.render());
    }
    if !relays.is_empty() {
        text.push('\n');
        text.push_str(&relay_table(relays));
    }
    if !paused.is_empty() {
        let mut table =
            Table::new(&["PAUSED AGGREGATE TYPE", "EVENT TYPE", "SINCE", "REASON"], &[]);
        for pause in paused {
            table.row([
                pause.aggregate_type.clone(),
                pause.event_type.clone(),
                rfc3339(&pause.paused_at),
                pause.reason.clone().unwrap_or_default(),
            ]);
        }
        text.push('\n');
        text.push_str(&table.render());
    }
    text
}

fn subscriber_table(subscribers: &[SubscriberStatus]) -> String {
    let headers = ["SUBSCRIBER", "AGGREGATE TYPE", "EVENT TYPE", "PENDING", "DEAD", "LAG"];
    let mut table = Table::new(&headers, &[false, false, false, true, true, true]);
    for s in subscribers {
        let age = s.oldest_pending.map(|at| (Utc::now() - at).to_std().unwrap_or_default());
        table.row([
            s.subscriber.clone(),
            s.aggregate_type.clone(),
            s.event_type.clone(),
            s.pending.to_string(),
            s.dead.to_string(),
            lag(age),
        ]);
    }
    table.render()
}

fn relay_table(relays: &[RelayStatus]) -> String {
    let headers =
        ["RELAY", "HOST", "PID", "VERSION", "MODE", "HELD", "DELIVERED", "HEARTBEAT", "TYPES"];
    let right = [false, false, true, false, false, true, true, false, false];
    let mut table = Table::new(&headers, &right);
    for relay in relays {
        let heartbeat = duration(relay.since_heartbeat);
        let mut types = relay.handles.join(",");
        if let Some(forwards) = &relay.forwards {
            if !types.is_empty() {
                types.push(' ');
            }
            types.push_str(&format!("forwards {}", forwards.join(",")));
        }
        table.row([
            relay.relay_id.to_string(),
            relay.host.clone(),
            relay.pid.to_string(),
            relay.version.clone(),
            relay.lease_mode.clone(),
            relay.held.to_string(),
            relay.delivered.to_string(),
            if relay.silent { format!("SILENT {heartbeat}") } else { format!("{heartbeat} ago") },
            types,
        ]);
    }
    table.render()
}

fn inbox_dead(count: i64, messages: &[DeadMessage]) -> String {
    if messages.is_empty() {
        return "no dead messages\n".into();
    }
    let mut text = dead_table(messages.iter().map(|message| DeadRow {
        event_id: message.event_id,
        aggregate_type: &message.aggregate_type,
        aggregate_id: &message.aggregate_id,
        event_type: &message.event_type,
        attempts: message.attempts,
        dead_at: &message.dead_at,
        last_error: message.last_error.as_deref(),
        subscriber: None,
    }));
    let shown = messages.len() as i64;
    if count > shown {
        text.push_str(&format!("{shown} of {count} dead messages shown: raise --limit for more\n"));
    }
    text
}

fn dead_list(events: &[DeadEvent], next_after: Option<uuid::Uuid>) -> String {
    if events.is_empty() {
        return "no dead events\n".into();
    }
    let mut text = dead_table(events.iter().map(|event| DeadRow {
        event_id: event.event_id,
        aggregate_type: &event.aggregate_type,
        aggregate_id: &event.aggregate_id,
        event_type: &event.event_type,
        attempts: event.attempts,
        dead_at: &event.dead_at,
        last_error: event.last_error.as_deref(),
        subscriber: event.subscriber.as_deref(),
    }));
    if let Some(after) = next_after {
        text.push_str(&format!("more may follow: add --after {after}\n"));
    }
    text
}

/// One line of a dead-letter table: an outbox's dead event or an inbox's dead message.
struct DeadRow<'a> {
    event_id: uuid::Uuid,
    aggregate_type: &'a str,
    aggregate_id: &'a str,
    event_type: &'a str,
    attempts: u32,
    dead_at: &'a DateTime<Utc>,
    last_error: Option<&'a str>,
    /// A subscriber's copy's subscriber.
    subscriber: Option<&'a str>,
}

/// The dead letters as a table; with a SUBSCRIBER column when a subscriber's copy is among them.
fn dead_table<'a>(rows: impl Iterator<Item = DeadRow<'a>>) -> String {
    let rows: Vec<DeadRow> = rows.collect();
    let copies = rows.iter().any(|row| row.subscriber.is_some());
    let mut headers = vec!["EVENT ID", "AGGREGATE TYPE", "AGGREGATE ID", "EVENT TYPE"];
    headers.extend(copies.then_some("SUBSCRIBER"));
    headers.extend(["ATTEMPTS", "DEAD AT", "LAST ERROR"]);
    let mut numeric = vec![false; headers.len() - 3];
    numeric.push(true);
    let mut table = Table::new(&headers, &numeric);
    for row in rows {
        let mut cells = vec![
            row.event_id.to_string(),
            row.aggregate_type.to_owned(),
            row.aggregate_id.to_owned(),
            row.event_type.to_owned(),
        ];
        if copies {
            cells.push(row.subscriber.unwrap_or("-").to_owned());
        }
        cells.extend([
            row.attempts.to_string(),
            timestamp(row.dead_at),
            truncate(row.last_error.unwrap_or("-"), ERROR_WIDTH),
        ]);
        table.row(cells);
    }
    table.render()
}

fn dead_show(event: &DeadEvent) -> String {
    let mut fields = Table::new(&[], &[]);
    fields.row(["event id".into(), event.event_id.to_string()]);
    fields.row(["aggregate type".into(), event.aggregate_type.clone()]);
    fields.row(["aggregate id".into(), event.aggregate_id.clone()]);
    fields.row(["event type".into(), event.event_type.clone()]);
    fields.row(["version".into(), event.version.to_string()]);
    fields.row(["attempts".into(), event.attempts.to_string()]);
    fields.row(["expired leases".into(), event.expired_leases.to_string()]);
    fields.row(["created at".into(), timestamp(&event.created_at)]);
    fields.row(["dead at".into(), timestamp(&event.dead_at)]);
    if let (Some(subscriber), Some(copy_of)) = (&event.subscriber, event.copy_of) {
        fields.row(["subscriber".into(), subscriber.clone()]);
        fields.row(["copy of event".into(), copy_of.to_string()]);
    }
    let mut text = fields.render();
    text.push_str(&sections(&event.last_error, &event.headers, &event.payload));
    text
}

fn event_show(event: &EventRecord) -> String {
    let mut fields = Table::new(&[], &[]);
    fields.row(["event id".into(), event.event_id.to_string()]);
    fields.row(["state".into(), state(event.state).into()]);
    fields.row(["aggregate type".into(), event.aggregate_type.clone()]);
    fields.row(["aggregate id".into(), event.aggregate_id.clone()]);
    fields.row(["event type".into(), event.event_type.clone()]);
    fields.row(["version".into(), event.version.to_string()]);
    fields.row(["ordered".into(), event.ordered.to_string()]);
    if let Some(key) = &event.idempotency_key {
        fields.row(["idempotency key".into(), key.clone()]);
    }
    fields.row(["attempts".into(), event.attempts.to_string()]);
    fields.row(["expired leases".into(), event.expired_leases.to_string()]);
    fields.row(["created at".into(), timestamp(&event.created_at)]);
    fields.row(["available at".into(), timestamp(&event.available_at)]);
    if let Some(at) = &event.published_at {
        fields.row(["published at".into(), timestamp(at)]);
    }
    if let Some(at) = &event.dead_at {
        fields.row(["dead at".into(), timestamp(at)]);
    }
    let mut text = fields.render();
    text.push_str(&sections(&event.last_error, &event.headers, &event.payload));
    text
}

/// The last error, headers and payload, each under its title and indented.
fn sections(last_error: &Option<String>, headers: &Value, payload: &Value) -> String {
    let mut text = String::new();
    let error = last_error.as_deref().unwrap_or("(none recorded)");
    for (title, body) in [
        ("last error", error.to_owned()),
        ("headers", format!("{headers:#}")),
        ("payload", format!("{payload:#}")),
    ] {
        text.push_str(&format!("\n{title}:\n"));
        for line in body.lines() {
            text.push_str(&format!("  {line}\n"));
        }
    }
    text
}

/// `n things`, with the plural `s` only when needed.
fn plural(n: u64, thing: &str) -> String {
    format!("{n} {thing}{}", if n == 1 { "" } else { "s" })
}

fn lag(age: Option<Duration>) -> String {
    age.map_or_else(|| "-".into(), duration)
}

/// RFC 3339 in UTC with microseconds, PostgreSQL's precision: `2025-01-02T03:04:05.123456Z`.
fn rfc3339(at: &DateTime<Utc>) -> String {
    at.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

fn timestamp(at: &DateTime<Utc>) -> String {
    at.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// A duration in its two largest units, as people read it: `850ms`, `42s`, `5m 12s`, `3h 25m`,
/// `2d 4h`.
pub fn duration(d: Duration) -> String {
    let secs = d.as_secs();
    if secs == 0 {
        return format!("{}ms", d.as_millis());
    }
    let units = [(86_400, "d"), (3_600, "h"), (60, "m"), (1, "s")];
    let Some(first) = units.iter().position(|&(size, _)| secs >= size) else {
        return "0s".into();
    };
    let (size, unit) = units[first];
    let mut text = format!("{}{unit}", secs / size);
    if let Some(&(next, next_unit)) = units.get(first + 1) {
        let rest = secs % size / next;
        if rest > 0 {
            text.push_str(&format!(" {rest}{next_unit}"));
        }
    }
    text
}

/// Up to `max` characters of the first line of `text`, ending in `…` when cut.
fn truncate(text: &str, max: usize) -> String {
    let line = text.lines().next().unwrap_or("");
    let cut = line.chars().count() > max || line.len() < text.trim_end().len();
    if !cut {
        return line.to_owned();
    }
    let kept: String = line.chars().take(max.saturating_sub(1)).collect();
    format!("{}…", kept.trim_end())
}

/// A plain-text table: columns padded to their widest cell, two spaces apart.
struct Table {
    headers: Vec<String>,
    /// Right-aligned columns (numbers); missing entries mean left.
    right: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl Table {
    fn new(headers: &[&str], right: &[bool]) -> Self {
        Table {
            headers: headers.iter().map(|h| h.to_string()).collect(),
            right: right.to_vec(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; control characters (newlines, tabs) become spaces so they cannot break the
    /// layout.
    fn row(&mut self, cells: impl IntoIterator<Item = String>) {
        let clean = |cell: String| cell.replace(|c: char| c.is_control(), " ");
        self.rows.push(cells.into_iter().map(clean).collect());
    }

    fn render(&self) -> String {
        let header = (!self.headers.is_empty()).then_some(&self.headers);
        let lines: Vec<&Vec<String>> = header.into_iter().chain(&self.rows).collect();
        let columns = lines.iter().map(|cells| cells.len()).max().unwrap_or(0);
        let widths: Vec<usize> = (0..columns)
            .map(|c| {
                lines
                    .iter()
                    .filter_map(|cells| cells.get(c))
                    .map(|cell| width(cell))
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut out = String::new();
        for cells in lines {
            let mut line = String::new();
            for (c, cell) in cells.iter().enumerate() {
                if c > 0 {
                    line.push_str("  ");
                }
                let pad = " ".repeat(widths[c] - width(cell));
                if self.right.get(c).copied().unwrap_or(false) {
                    line.push_str(&pad);
                    line.push_str(cell);
                } else {
                    line.push_str(cell);
                    line.push_str(&pad);
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// Characters, not bytes: close enough to terminal columns for ids, types and messages.
fn width(cell: &str) -> usize {
    cell.chars().count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_like_people_write_them() {
        let cases = [
            (Duration::from_millis(850), "850ms"),
            (Duration::from_secs(42), "42s"),
            (Duration::from_secs(312), "5m 12s"),
            (Duration::from_secs(3 * 3600 + 25 * 60 + 9), "3h 25m"),
            (Duration::from_secs(7 * 86_400), "7d"),
            (Duration::from_secs(2 * 86_400 + 4 * 3600), "2d 4h"),
        ];
        for (d, text) in cases {
            assert_eq!(duration(d), text);
        }
    }

    #[test]
    fn tables_align_and_right_align_numbers() {
        let mut table = Table::new(&["NAME", "N"], &[false, true]);
        table.row(["a".into(), "100".into()]);
        table.row(["long name".into(), "7".into()]);
        assert_eq!(table.render(), "NAME         N\na          100\nlong name    7\n");
    }

    #[test]
    fn truncation_counts_characters_and_keeps_one_line() {
        assert_eq!(truncate("short", 10), "short");
        assert_eq!(truncate("ééééééééééé", 5), "éééé…");
        assert_eq!(truncate("first\nsecond", 60), "first…");
    }
}
