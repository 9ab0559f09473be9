//! What a handler's error can say besides "failed, retry": [`Reject`] and [`Snooze`].
//!
//! Both are errors, so a handler keeps its `Result<(), Err>` signature and returns them with
//! `?` or `Err(...into())`, through `anyhow` or its own error enum alike: the relay looks for
//! them along the error's whole `source()` chain, as River looks for `JobCancel` and
//! `JobSnooze` with `errors.As`.

use std::error::Error as StdError;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::error::BoxError;

/// A handler's verdict that its event can never succeed: the event is dead now, with this
/// reason, however many attempts it has left (a payment for an account that was deleted, an
/// event that refers to nothing).
///
/// The rejection counts as a failed attempt; `last_error` reads
/// `rejected by its handler: <reason>`, the relay counts it in
/// [`RelayCounts::rejected`](crate::RelayCounts::rejected) and `outbox_rejected_total`, and the
/// event waits in the [dead letters](crate::dead_letters) like any other, to be requeued or
/// discarded. A transactional handler's writes roll back with it.
///
/// ```
/// # use outbox_runtime::{EventContext, OutboxEvent, Reject};
/// # use serde::{Deserialize, Serialize};
/// # #[derive(Serialize, Deserialize, OutboxEvent)]
/// # #[outbox(aggregate = "payment", event_type = "payment.requested")]
/// # struct PaymentRequested { #[outbox(id)] payment_id: i64, account_id: i64 }
/// # async fn account_exists(_: i64) -> bool { false }
/// async fn charge(_: EventContext, event: PaymentRequested) -> Result<(), outbox_runtime::BoxError> {
///     if !account_exists(event.account_id).await {
///         return Err(Reject::new(format!("account {} was deleted", event.account_id)).into());
///     }
///     Ok(())
/// }
/// ```
#[derive(Debug, thiserror::Error)]
#[error("rejected by its handler")]
pub struct Reject {
    #[source]
    reason: BoxError,
}

impl Reject {
    /// Rejects the event for `reason`: a message or an error, kept with its cause chain.
    pub fn new(reason: impl Into<BoxError>) -> Self {
        Self { reason: reason.into() }
    }
}

/// A handler's verdict "not yet": the event goes back to pending, to be delivered again after
/// a delay, and the attempt is not counted (a rate limit, an upstream that asked to wait).
///
/// Nothing is written to `last_error`. The relay counts it in
/// [`RelayCounts::snoozed`](crate::RelayCounts::snoozed) and `outbox_snoozed_total`. An
/// ordered event that snoozes holds back the later events of its aggregate until it is
/// delivered, as a retry does. A handler that snoozes every time keeps its event pending for
/// ever: bound it yourself if that can happen (by [`EventContext::created_at`](crate::EventContext::created_at),
/// say).
///
/// ```
/// # use std::time::Duration;
/// # use outbox_runtime::{EventContext, OutboxEvent, Snooze};
/// # use serde::{Deserialize, Serialize};
/// # #[derive(Serialize, Deserialize, OutboxEvent)]
/// # #[outbox(aggregate = "mail", event_type = "mail.requested")]
/// # struct MailRequested { #[outbox(id)] mail_id: i64 }
/// # enum Sent { Ok, RateLimited { retry_after: Duration } }
/// # async fn send(_: &MailRequested) -> Sent { Sent::Ok }
/// async fn send_mail(_: EventContext, event: MailRequested) -> Result<(), Snooze> {
///     match send(&event).await {
///         Sent::Ok => Ok(()),
///         Sent::RateLimited { retry_after } => Err(Snooze::after(retry_after)),
///     }
/// }
/// ```
#[derive(Debug, thiserror::Error)]
#[error("snoozed for {delay:?}")]
pub struct Snooze {
    delay: Duration,
}

impl Snooze {
    /// Delivers the event again `delay` from now.
    pub fn after(delay: Duration) -> Self {
        Self { delay }
    }

    /// Delivers the event again at `at` (at once if that has passed).
    pub fn until(at: DateTime<Utc>) -> Self {
        Self::after((at - Utc::now()).to_std().unwrap_or_default())
    }
}

/// What a handler's error asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// A failure, retried with backoff while attempts remain.
    Retry,
    /// Dead now.
    Reject,
    /// Pending again after the delay, no attempt counted.
    Snooze(Duration),
}

impl Verdict {
    /// The first [`Reject`] or [`Snooze`] along `error`'s source chain decides.
    pub(crate) fn of(error: &(dyn StdError + 'static)) -> Self {
        std::iter::successors(Some(error), |&error| error.source())
            .find_map(|error| {
                if error.is::<Reject>() {
                    Some(Verdict::Reject)
                } else {
                    error.downcast_ref::<Snooze>().map(|snooze| Verdict::Snooze(snooze.delay))
                }
            })
            .unwrap_or(Verdict::Retry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("charging failed")]
    struct Charging(#[source] BoxError);

    #[test]
    fn a_verdict_is_found_anywhere_along_the_chain() {
        let rejected: BoxError = Reject::new("account 7 was deleted").into();
        assert_eq!(Verdict::of(&*rejected), Verdict::Reject);
        let wrapped = Charging(Snooze::after(Duration::from_secs(3)).into());
        assert_eq!(Verdict::of(&wrapped), Verdict::Snooze(Duration::from_secs(3)));
        let plain: BoxError = "card declined".into();
        assert_eq!(Verdict::of(&*plain), Verdict::Retry);
    }

    #[test]
    fn a_rejection_reads_with_its_reason() {
        let rejected = Reject::new(Charging("account 7 was deleted".into()));
        let chain = crate::error::ErrorChain(&rejected).to_string();
        assert_eq!(chain, "rejected by its handler: charging failed: account 7 was deleted");
    }

    #[test]
    fn a_snooze_until_a_past_time_is_due_at_once() {
        let past = Utc::now() - chrono::Duration::seconds(5);
        assert_eq!(Snooze::until(past).delay, Duration::ZERO);
    }
}
