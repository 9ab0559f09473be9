//! The benchmark's event types.

use outbox_runtime::OutboxEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "account", event_type = "account.credited")]
pub struct Credited {
    #[outbox(id)]
    pub account: u32,
    pub cents: i64,
}

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "ledger", event_type = "ledger.posted", ordered)]
pub struct Posted {
    #[outbox(id)]
    pub account: u32,
    pub cents: i64,
}

pub fn credited(i: usize) -> Credited {
    Credited { account: (i % 1_000) as u32, cents: i as i64 }
}

pub fn posted(i: usize) -> Posted {
    posted_to(1_000)(i)
}

/// Events posted round robin to `aggregates` aggregates.
pub fn posted_to(aggregates: usize) -> impl Fn(usize) -> Posted {
    move |i| Posted { account: (i % aggregates) as u32, cents: i as i64 }
}
