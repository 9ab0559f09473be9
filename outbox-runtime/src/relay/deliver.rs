//! One delivery: decode, call the handler, catch what goes wrong, report the outcome.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use futures_util::FutureExt;
use tokio::sync::mpsc::UnboundedSender;
use tracing::Instrument;
use uuid::Uuid;

use crate::decode::JsonUpcasters;
use crate::error::ErrorChain;
use crate::otel;
use crate::relay::acker::{Ack, Failed, Outcome};
use crate::relay::config::{Policy, RelayConfig};
use crate::relay::context::RowMeta;
use crate::relay::fan_out::FanOut;
use crate::relay::handler::{DeliveryLease, Payload, Route, Settled};
use crate::relay::held::HeldLease;
use crate::relay::metrics::RelayMetrics;
use crate::relay::outcome::Verdict;
use crate::relay::pace::Pace;
use crate::relay::Subscribed;
use crate::store::{Db, LeasedEvent};

/// Longest error text kept in `last_error`.
const MAX_ERROR_LEN: usize = 4_096;

pub(crate) struct Delivery<S> {
    /// Whom the row goes to.
    pub(crate) target: Target<S>,
    /// The relay's JSON upcasters, for rows older than their handler's type reads.
    pub(crate) upcasters: Arc<JsonUpcasters>,
    pub(crate) state: S,
    pub(crate) row: LeasedEvent,
    pub(crate) lease: HeldLease,
    /// The builder's pool, for transactional handlers.
    pub(crate) pool: Db,
    /// For how a transactional handler's acknowledgement treats the row.
    pub(crate) config: Arc<RelayConfig>,
    pub(crate) acks: UnboundedSender<Ack>,
    pub(crate) metrics: RelayMetrics,
    pub(crate) pace: Pace,
}

/// Whom a leased row goes to.
pub(crate) enum Target<S> {
    /// One route with its timeout and retries; `None` when no handler takes the event type (the
    /// `UnknownEvents::Fail` policy).
    One { route: Option<Arc<dyn Route<S>>>, policy: Policy },
    /// The relay's subscribers of the event's type (`fan_out.rs`).
    Subscribers(Arc<[Subscribed<S>]>),
}

impl<S: Clone + Send + Sync + 'static> Delivery<S> {
    /// Hands the row back unstarted (at shutdown).
    pub(crate) fn hand_back(self) {
        let _ = self.acks.send(ack(&self.row, Outcome::HandedBack));
    }

    pub(crate) async fn run(self) {
        let Delivery {
            target,
            upcasters,
            state,
            row,
            mut lease,
            pool,
            config,
            acks,
            metrics,
            pace,
        } = self;
        let earlier_failures = u32::try_from(row.attempts).unwrap_or(0);
        let policy = match &target {
            Target::One { policy, .. } => *policy,
            Target::Subscribers(_) => config.policy(),
        };
        let retries = Retries { policy, earlier_failures };
        // If this task is cancelled (shutdown timeout), the guard hands the row back.
        let mut guard = AckGuard { acks, ack: Some(ack(&row, Outcome::HandedBack)), retries };
        if !lease.is_valid() {
            // The lease ran out while the row waited (renewals were held up): hand it back.
            tracing::debug!(event_id = %row.event_id, "outbox lease ran out before its delivery");
            return;
        }
        let expired_leases = u32::try_from(row.expired_leases).unwrap_or(0);
        // Which delivery this is: failed deliveries and expired leases before it, plus one.
        let span = otel::delivery_span(&row, earlier_failures + expired_leases + 1);
        let (event_id, event_type) = (row.delivered_event_id(), row.event_type.clone());
        let subscriber = (!row.subscriber.is_empty()).then(|| row.subscriber.clone());
        let started = std::time::Instant::now();
        let delivery_lease = DeliveryLease {
            pool: pool.clone(),
            lease: lease.clone(),
            on_publish: config.on_publish,
        };
        let fan_out_lease = lease.clone();
        let handling = async {
            let route = match target {
                Target::One { route: Some(route), .. } => route,
                Target::One { route: None, .. } => {
                    return Handled::One(Err(Failure::from(format!(
                        "no handler registered for aggregate `{}`, event type `{}`",
                        row.aggregate_type, row.event_type
                    ))));
                }
                Target::Subscribers(subscribers) => {
                    let lease = &fan_out_lease;
                    let fan_out = FanOut { row: &row, upcasters: &upcasters, pool: &pool, lease };
                    return Handled::FanOut(fan_out.deliver(&subscribers, &state, &config).await);
                }
            };
            let meta = RowMeta {
                event_id,
                aggregate_type: row.aggregate_type,
                aggregate_id: row.aggregate_id,
                event_type: row.event_type,
                // The column's check keeps it positive.
                version: u32::try_from(row.event_version).unwrap_or(1),
                headers: row.headers,
                attempts: earlier_failures,
                expired_leases,
                created_at: row.created_at,
            };
            let payload = Payload { json: &row.payload, upcasters: &upcasters };
            Handled::One(call(&*route, policy, state, meta, payload, delivery_lease).await)
        }
        .instrument(span.clone());
        // A lease that can no longer be vouched for cancels its delivery: past its deadline
        // another relay may take the row.
        // A handler that finished as the deadline passed counts as finished: its outcome is
        // acknowledged rather than its row handed back and delivered again.
        let handled = tokio::select! {
            biased;
            handled = handling => handled,
            () = lease.expired() => {
                let _entered = span.enter();
                tracing::warn!(
                    %event_id,
                    %event_type,
                    "outbox lease not renewed in time; delivery cancelled and the row handed back"
                );
                return;
            }
        };
        lease.finish();
        let took = started.elapsed();
        metrics.handler_finished(&event_type, took);
        pace.record(took);

        let _entered = span.enter();
        let result = match handled {
            Handled::One(result) => result,
            Handled::FanOut(outcome) => return guard.send(outcome),
        };
        let outcome = match result {
            Ok(Settled::Handled) => {
                tracing::debug!("outbox event delivered");
                Outcome::Delivered
            }
            Ok(Settled::Published) => {
                tracing::debug!(
                    "outbox event delivered and published in the handler's transaction"
                );
                Outcome::Published
            }
            Ok(Settled::LeaseLost) => Outcome::LeaseLost,
            Ok(Settled::Unavailable(why)) => {
                tracing::debug!(%why, "outbox event not delivered: handed back, no attempt counted");
                Outcome::HandedBack
            }
            Err(Failure { verdict: Verdict::Snooze(delay), .. }) => {
                tracing::debug!(
                    ?delay,
                    "outbox event snoozed by its handler: handed back, no attempt counted"
                );
                Outcome::Snoozed { delay }
            }
            Err(Failure { error, logged, verdict }) => {
                let rejected = verdict == Verdict::Reject;
                log_failure(event_id, &event_type, subscriber.as_deref(), &logged, rejected);
                Outcome::Failed(retries.failed(clean_error(error), rejected))
            }
        };
        guard.send(outcome);
    }
}

/// What a delivery's handling came to: one route's result, or a fan-out's outcome.
enum Handled {
    One(Result<Settled, Failure>),
    FanOut(Outcome),
}

/// Calls `route` with an event: how it ended, or why it failed (a panic, a payload that does not
/// decode, the policy's timeout, the handler's error and what it asked for).
pub(super) async fn call<S>(
    route: &dyn Route<S>,
    policy: Policy,
    state: S,
    meta: RowMeta,
    payload: Payload<'_>,
    lease: DeliveryLease,
) -> Result<Settled, Failure> {
    let call = || route.call(state, meta, payload, lease);
    let handling =
        catch_unwind(AssertUnwindSafe(call)).map_err(panic_message)?.map_err(|decode| Failure {
            error: ErrorChain(&decode).to_string(),
            logged: decode.without_payload(),
            verdict: Verdict::Retry,
        })?;
    let handling = AssertUnwindSafe(handling).catch_unwind();
    let finished = match policy.timeout {
        Some(limit) => tokio::time::timeout(limit, handling)
            .await
            .map_err(|_| format!("handler timed out after {limit:?}"))?,
        None => handling.await,
    };
    let handled = finished.map_err(panic_message)?;
    handled.map_err(|error| {
        let verdict = Verdict::of(&*error);
        Failure { verdict, ..Failure::from(ErrorChain(&*error).to_string()) }
    })
}

/// Logs a failed delivery (with the id and type again, for tracing subscribers that leave the
/// info-level span out).
pub(super) fn log_failure(
    event_id: Uuid,
    event_type: &str,
    subscriber: Option<&str>,
    logged: &str,
    rejected: bool,
) {
    if rejected {
        tracing::warn!(
            %event_id,
            event_type,
            subscriber,
            error = logged,
            "outbox event rejected by its handler: dead now, whatever its attempts; \
             requeue it (`outbox dead requeue`) once it can succeed"
        );
    } else {
        tracing::warn!(
            %event_id,
            event_type,
            subscriber,
            error = logged,
            "outbox event delivery failed; retried with backoff until its attempts \
             run out (the whole error is kept in last_error)"
        );
    }
}

fn ack(row: &LeasedEvent, outcome: Outcome) -> Ack {
    Ack {
        event_id: row.event_id,
        event_type: row.event_type.clone(),
        subscriber: row.subscriber.clone(),
        created_at: row.created_at,
        outcome,
    }
}

/// Sends the outcome exactly once; if dropped unsent, hands the row back, or, if the delivery
/// panicked outside the handler's own guard, records a failed attempt: handed back, a panic
/// that comes back every time would deliver the row again forever.
struct AckGuard {
    acks: UnboundedSender<Ack>,
    /// The acknowledgement to send, `HandedBack` until the delivery ends.
    ack: Option<Ack>,
    retries: Retries,
}

impl AckGuard {
    fn send(&mut self, outcome: Outcome) {
        if let Some(mut ack) = self.ack.take() {
            ack.outcome = outcome;
            // The acker outlives every delivery task; a send can only fail if it panicked,
            // and then the lease expires and the row is delivered again.
            let _ = self.acks.send(ack);
        }
    }
}

impl Drop for AckGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let error = "the relay panicked while delivering this event, outside its handler; \
                         the panic is in the relay's log";
            self.send(Outcome::Failed(self.retries.failed(error.to_owned(), false)));
        }
        if let Some(ack) = self.ack.take() {
            let _ = self.acks.send(ack);
        }
    }
}

fn panic_message(panic: Box<dyn Any + Send>) -> String {
    format!("handler panicked: {}", panic_text(&*panic))
}

/// What a panic said, if it said it in text.
pub(crate) fn panic_text(panic: &(dyn Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("non-string panic payload")
}

/// Why a delivery failed: the whole text, kept in `last_error`, what its log line says (the
/// same, but for a payload that does not decode, whose details can quote the payload), and what
/// the handler's error asked for.
pub(super) struct Failure {
    pub(super) error: String,
    pub(super) logged: String,
    pub(super) verdict: Verdict,
}

impl From<String> for Failure {
    fn from(error: String) -> Self {
        Failure { logged: error.clone(), error, verdict: Verdict::Retry }
    }
}

/// What a failure of this delivery does to its row: the retry's delay, the most attempts.
#[derive(Clone, Copy)]
struct Retries {
    policy: Policy,
    earlier_failures: u32,
}

impl Retries {
    fn failed(self, error: String, rejected: bool) -> Failed {
        Failed {
            error,
            retry_in: self.policy.backoff.delay(self.earlier_failures + 1),
            max_attempts: self.policy.max_attempts,
            rejected,
        }
    }
}

/// Makes an error text storable: PostgreSQL `text` refuses NUL, and a huge text bloats rows.
pub(super) fn clean_error(mut error: String) -> String {
    if error.contains('\0') {
        error = error.replace('\0', "\u{FFFD}");
    }
    if error.len() > MAX_ERROR_LEN {
        let mut end = MAX_ERROR_LEN;
        while !error.is_char_boundary(end) {
            end -= 1;
        }
        error.truncate(end);
        error.push('…');
    }
    error
}
