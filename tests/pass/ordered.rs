// `ordered` marks an event type for per-aggregate ordered delivery; it is off by default.
use outbox_runtime::OutboxEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "account", event_type = "account.posted", ordered)]
struct Posted {
    #[outbox(id)]
    account: u64,
}

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(ordered, aggregate = "account", event_type = "account.closed")]
struct Closed {
    #[outbox(id)]
    account: u64,
}

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "account", event_type = "account.viewed")]
struct Viewed {
    #[outbox(id)]
    account: u64,
}

fn main() {
    assert!(Posted::EVENT_TYPES[0].ordered());
    assert!(Closed::EVENT_TYPES[0].ordered());
    assert!(!Viewed::EVENT_TYPES[0].ordered());
}
