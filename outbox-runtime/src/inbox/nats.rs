//! Consuming a NATS JetStream pull consumer into an [`Inbox`] (feature `nats`).
//!
//! [`consume`] takes the consumer's messages one at a time, in stream order: each is handled
//! through [`Inbox::receive`], then acknowledged after the commit, or negatively acknowledged
//! with the retry's delay, or terminated if it is not an outbox message. A database that fails
//! leaves the message unacknowledged (redelivered after the delay, no attempt counted) and pauses
//! consuming with a backoff until it answers again.
//!
//! Configure the consumer for it:
//! - `ack_policy: Explicit` (the default), and `ack_wait` longer than a handler takes: past it the
//!   server delivers the message again, and that delivery waits for the first one's outcome
//!   (then finds it handled).
//! - `max_deliver: -1` (the default): the inbox counts attempts and sends the message to its
//!   dead letters after `max_attempts`; a smaller `max_deliver` would drop messages the
//!   database's outages held back.
//! - For per-aggregate order across failures, `max_ack_pending: 1`: a message waiting for its
//!   retry then holds back the ones behind it. Otherwise later messages pass a failing one.

use std::future::Future;
use std::time::Duration;

use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::{AckKind, Message};
use futures_util::StreamExt;

use super::{InboundMessage, Inbox, InboxError, Received};
use crate::error::ErrorChain;

/// The first pause after the database or the server failed; it doubles up to a limit.
const FIRST_RETRY: Duration = Duration::from_millis(200);
const MOST_RETRY: Duration = Duration::from_secs(30);

/// Receives `consumer`'s messages through `inbox` until `shutdown` completes; a message under
/// way when it does is finished first. Returns early only if the consumer's messages cannot be
/// requested (the consumer deleted, say), with why.
pub async fn consume<S: Clone + Send + Sync + 'static>(
    inbox: &Inbox<S>,
    consumer: &PullConsumer,
    shutdown: impl Future<Output = ()>,
) -> Result<(), async_nats::Error> {
    let mut shutdown = std::pin::pin!(shutdown);
    let mut retry = FIRST_RETRY;
    loop {
        let mut messages = tokio::select! {
            biased;
            () = &mut shutdown => return Ok(()),
            messages = consumer.messages() => messages?,
        };
        loop {
            let next = tokio::select! {
                biased;
                () = &mut shutdown => return Ok(()),
                next = messages.next() => next,
            };
            let message = match next {
                Some(Ok(message)) => message,
                Some(Err(error)) => {
                    tracing::warn!(
                        error = %ErrorChain(&error),
                        consumer = inbox.consumer(),
                        "cannot read the NATS consumer's messages; asking again"
                    );
                    break;
                }
                None => break,
            };
            match handle(inbox, &message).await {
                Ok(()) => retry = FIRST_RETRY,
                Err(error) => {
                    tracing::warn!(
                        error = %ErrorChain(&error),
                        consumer = inbox.consumer(),
                        retry_in = ?retry,
                        "inbox database failed; the message is delivered again and consuming \
                         pauses until the database answers"
                    );
                    let _ = message.ack_with(AckKind::Nak(Some(retry))).await;
                    tokio::select! {
                        biased;
                        () = &mut shutdown => return Ok(()),
                        () = tokio::time::sleep(retry) => {}
                    }
                    retry = (retry * 2).min(MOST_RETRY);
                }
            }
        }
        tokio::select! {
            biased;
            () = &mut shutdown => return Ok(()),
            () = tokio::time::sleep(FIRST_RETRY) => {}
        }
    }
}

/// Handles one message and tells the server; `Err` only when the database failed.
async fn handle<S: Clone + Send + Sync + 'static>(
    inbox: &Inbox<S>,
    message: &Message,
) -> Result<(), InboxError> {
    let headers = message.headers.iter().flat_map(|headers| {
        headers.iter().flat_map(|(name, values)| {
            values.iter().map(move |value| (name.as_ref(), value.as_str()))
        })
    });
    let inbound = match InboundMessage::from_headers(headers, &message.payload) {
        Ok(inbound) => inbound,
        Err(invalid) => {
            tracing::error!(
                error = %invalid,
                consumer = inbox.consumer(),
                subject = %message.subject,
                "NATS message terminated: it is not an outbox message and can never be handled"
            );
            tell(message, AckKind::Term).await;
            return Ok(());
        }
    };
    let kind = match inbox.receive(&inbound).await? {
        Received::Failed { retry_in: delay, .. } | Received::Snoozed { delay } => {
            AckKind::Nak(Some(delay))
        }
        _ => AckKind::Ack,
    };
    tell(message, kind).await;
    Ok(())
}

/// Acknowledges (or not) a message; a lost acknowledgement only means a redelivery, which the
/// inbox finds handled.
async fn tell(message: &Message, kind: AckKind) {
    if let Err(error) = message.ack_with(kind).await {
        tracing::warn!(
            error = %ErrorChain(&*error),
            subject = %message.subject,
            "cannot acknowledge a NATS message; it will be delivered again and found handled"
        );
    }
}
