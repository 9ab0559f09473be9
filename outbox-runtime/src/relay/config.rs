//! The relay's tunables and their defaults.

use std::time::Duration;

use crate::store::OnPublish;

/// Retry delays: after the n-th failed delivery, `min(base * 2^(n-1), cap)`, jittered into its
/// upper half.
///
/// With the defaults (base 1 s, cap 10 minutes, as in
/// [the reference design](crate#the-reference-design)) the retry after the first failure comes
/// 1–2 s later, after the second 2–4 s, and so on up to 5–10 minutes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// Delay after the first failure, before jitter.
    pub base: Duration,
    /// Longest delay, before jitter.
    pub cap: Duration,
    /// Spread retries over `[delay / 2, delay]` so failures that happened together do not retry
    /// together.
    pub jitter: bool,
}

impl Default for Backoff {
    fn default() -> Self {
        Self { base: Duration::from_secs(1), cap: Duration::from_secs(600), jitter: true }
    }
}

impl Backoff {
    /// The delay before the next attempt, given the failed deliveries so far (the one just
    /// recorded included).
    pub fn delay(&self, failed_attempts: u32) -> Duration {
        let doublings = failed_attempts.saturating_sub(1);
        let factor = 2_u32.checked_pow(doublings).unwrap_or(u32::MAX);
        let delay = self.base.checked_mul(factor).unwrap_or(self.cap).min(self.cap);
        if self.jitter {
            delay.mul_f64(0.5 + fastrand::f64() / 2.0)
        } else {
            delay
        }
    }
}

/// Settings of one handler that differ from the relay's, for
/// [`RelayBuilder::handler_with`](crate::RelayBuilder::handler_with); each one left unset is the
/// relay's.
///
/// ```
/// # use std::time::Duration;
/// use outbox_runtime::{Backoff, HandlerOptions};
///
/// // A payment provider: slow, and retried for longer, further apart.
/// let charging = HandlerOptions::new()
///     .timeout(Some(Duration::from_secs(60)))
///     .max_attempts(20)
///     .backoff(Backoff { base: Duration::from_secs(10), ..Backoff::default() });
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HandlerOptions {
    timeout: Option<Option<Duration>>,
    max_attempts: Option<u32>,
    backoff: Option<Backoff>,
}

impl HandlerOptions {
    /// Every setting the relay's.
    pub fn new() -> Self {
        Self::default()
    }

    /// This handler's timeout (see [`RelayBuilder::handler_timeout`](crate::RelayBuilder::handler_timeout));
    /// `None` lets it run as long as it likes.
    pub fn timeout(mut self, timeout: Option<Duration>) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Failed deliveries after which this handler's events are dead (see
    /// [`RelayBuilder::max_attempts`](crate::RelayBuilder::max_attempts)).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = Some(attempts);
        self
    }

    /// Retry delays after this handler's failures (see
    /// [`RelayBuilder::backoff`](crate::RelayBuilder::backoff)).
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = Some(backoff);
        self
    }

    /// These options over the relay's settings.
    pub(crate) fn over(self, config: &RelayConfig) -> Policy {
        let relay = config.policy();
        Policy {
            timeout: self.timeout.unwrap_or(relay.timeout),
            max_attempts: self.max_attempts.unwrap_or(relay.max_attempts),
            backoff: self.backoff.unwrap_or(relay.backoff),
        }
    }
}

/// How the deliveries of one route are timed out and retried: its [`HandlerOptions`] over the
/// relay's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Policy {
    pub(crate) timeout: Option<Duration>,
    pub(crate) max_attempts: u32,
    pub(crate) backoff: Backoff,
}

/// What a relay does with a row whose `(aggregate_type, event_type)` has no handler.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum UnknownEvents {
    /// Do not lease it: it stays pending for a relay that has the handler (rolling deploys,
    /// relays split by event type). It shows in `pending` and in the lag until one does.
    #[default]
    LeaveForOthers,
    /// Lease it and record a failure naming the missing handler; after `max_attempts` such
    /// failures the row is dead and can be inspected and requeued.
    Fail,
}

/// What a relay does with a row written at a newer version than its handler's type reads (a new
/// producer deployed before this relay).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum NewerVersions {
    /// Do not lease it: it stays pending for a relay that reads its version, and shows per
    /// version in [`stats_by_type`](crate::stats_by_type) and `outbox status`.
    #[default]
    LeaveForOthers,
    /// Lease it and record a failure naming both versions; after `max_attempts` such failures
    /// the row is dead and can be requeued once a relay reads it.
    Fail,
}

/// What a dead ordered event does to the events after it in its aggregate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeadOrderedEvents {
    /// The aggregate stays blocked until an operator requeues or discards the dead event: order
    /// is never broken. The blocked events show as pending, and in the lag.
    #[default]
    BlockAggregate,
    /// Later events of the aggregate are delivered as if the dead event were published.
    SkipPast,
}

/// How a relay holds the rows it delivers; see [`RelayBuilder::lease_mode`](crate::RelayBuilder::lease_mode).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseMode {
    /// Each leased row records its lease (a token and a deadline, renewed while it is
    /// delivered), and each outcome is written under that token: the lease survives a lost
    /// connection, and a relay whose lease expired can write nothing.
    #[default]
    Written,
    /// The relay locks a batch in a transaction of its own, delivers it, and writes the
    /// outcomes in that transaction before it commits: the row locks are the lease, so a row
    /// is written once (its outcome) instead of twice.
    HeldTransaction,
}

/// Relay settings; every field has a documented default.
#[derive(Debug, Clone)]
pub(crate) struct RelayConfig {
    pub(crate) concurrency: usize,
    /// `None`: sized from the backlog (see `pace.rs`).
    pub(crate) batch_size: Option<u32>,
    pub(crate) max_attempts: u32,
    pub(crate) max_expired_leases: u32,
    pub(crate) lease_timeout: Duration,
    pub(crate) poll_interval: Duration,
    pub(crate) backoff: Backoff,
    pub(crate) shutdown_timeout: Duration,
    pub(crate) handler_timeout: Option<Duration>,
    pub(crate) unknown_events: UnknownEvents,
    pub(crate) newer_versions: NewerVersions,
    pub(crate) dead_ordered_events: DeadOrderedEvents,
    pub(crate) retention: Option<Duration>,
    pub(crate) on_publish: OnPublish,
    pub(crate) lease_mode: LeaseMode,
}

impl RelayConfig {
    /// The relay's own policy: that of a route whose handler set no options, of forwarding, and
    /// of rows no handler takes.
    pub(crate) fn policy(&self) -> Policy {
        Policy {
            timeout: self.handler_timeout,
            max_attempts: self.max_attempts,
            backoff: self.backoff,
        }
    }
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            concurrency: 16,
            batch_size: None,
            max_attempts: 10,
            max_expired_leases: 30,
            lease_timeout: Duration::from_secs(30),
            poll_interval: Duration::from_secs(1),
            backoff: Backoff::default(),
            shutdown_timeout: Duration::from_secs(30),
            handler_timeout: Some(Duration::from_secs(300)),
            unknown_events: UnknownEvents::default(),
            newer_versions: NewerVersions::default(),
            dead_ordered_events: DeadOrderedEvents::default(),
            retention: None,
            on_publish: OnPublish::Mark,
            lease_mode: LeaseMode::Written,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let backoff = Backoff { jitter: false, ..Backoff::default() };
        let secs: Vec<u64> = (1..12).map(|n| backoff.delay(n).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 600]);
        assert_eq!(backoff.delay(u32::MAX), Duration::from_secs(600));
    }

    #[test]
    fn jitter_stays_in_the_upper_half() {
        let backoff = Backoff::default();
        for _ in 0..1000 {
            let delay = backoff.delay(4);
            assert!(
                delay >= Duration::from_secs(4) && delay <= Duration::from_secs(8),
                "{delay:?}"
            );
        }
    }
}
