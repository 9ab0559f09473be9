//! Events of the `account` aggregate, keyed by a small number, and a log of what their handlers
//! saw: for the tests of ordering, delayed events, transactional handlers and idempotent emit,
//! which need aggregate ids they choose and a sequence number `n` in every payload.

use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use outbox_runtime::{EventContext, OutboxEvent};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{Delivery, HandlerError};

/// An ordered event: delivered one at a time per account, in emit order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "account", event_type = "account.posted", ordered)]
pub struct Posted {
    #[outbox(id)]
    pub account: u32,
    pub n: u32,
}

/// An unordered event of the same aggregate type.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "account", event_type = "account.noted")]
pub struct Noted {
    #[outbox(id)]
    pub account: u32,
    pub n: u32,
}

/// An unordered event of another aggregate type (idempotency scope, follow-up events).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "audit", event_type = "audit.recorded")]
pub struct Audited {
    #[outbox(id)]
    pub account: u32,
    pub n: u32,
}

pub fn posted(account: u32, n: u32) -> Posted {
    Posted { account, n }
}

pub fn noted(account: u32, n: u32) -> Noted {
    Noted { account, n }
}

/// One handler call.
#[derive(Debug, Clone)]
pub struct Seen {
    pub event_id: Uuid,
    pub account: u32,
    pub n: u32,
    pub attempt: u32,
    pub at: DateTime<Utc>,
}

/// Every handler call, in the order the handlers were entered.
#[derive(Clone, Default)]
pub struct Log(Arc<Mutex<Vec<Seen>>>);

impl Log {
    pub fn record<S>(&self, ctx: &EventContext<S>, account: u32, n: u32) {
        let seen =
            Seen { event_id: ctx.event_id(), account, n, attempt: ctx.delivery(), at: Utc::now() };
        self.0.lock().unwrap().push(seen);
    }

    pub fn all(&self) -> Vec<Seen> {
        self.0.lock().unwrap().clone()
    }

    pub fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    /// `(n, attempt)` of every call for `account`, in call order.
    pub fn of(&self, account: u32) -> Vec<(u32, u32)> {
        self.all().iter().filter(|s| s.account == account).map(|s| (s.n, s.attempt)).collect()
    }

    /// `n` of every call for `account`, in call order.
    pub fn numbers_of(&self, account: u32) -> Vec<u32> {
        self.of(account).into_iter().map(|(n, _)| n).collect()
    }

    pub fn ids_of(&self, account: u32) -> Vec<Uuid> {
        self.all().iter().filter(|s| s.account == account).map(|s| s.event_id).collect()
    }

    pub fn first_of(&self, account: u32, n: u32) -> Seen {
        self.all().into_iter().find(|s| s.account == account && s.n == n).unwrap()
    }
}

pub async fn log_posted(ctx: EventContext<Log>, event: Posted) -> Result<(), HandlerError> {
    ctx.state().record(&ctx, event.account, event.n);
    Ok(())
}

pub async fn log_noted(ctx: EventContext<Log>, event: Noted) -> Result<(), HandlerError> {
    ctx.state().record(&ctx, event.account, event.n);
    Ok(())
}
