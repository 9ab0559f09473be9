use outbox_runtime::OutboxEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "a", event_type = "order.placed-v2_x")]
struct Shortest {
    #[outbox(id)]
    id: u64,
}

// Raw strings and escapes are fine: the grammar applies to the value.
#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = r"billing-v2", event_type = "invoice\x2epaid")]
struct Spelled {
    #[outbox(id)]
    id: u64,
}

// Exactly 128 characters.
#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(
    aggregate = "z0",
    event_type = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
)]
struct Longest {
    #[outbox(id)]
    id: u64,
}

// Keys may be split over several attributes, in any order, with a trailing comma.
#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "split.event")]
#[outbox(aggregate = "split")]
struct Split {
    #[outbox(id)]
    id: u64,
}

fn main() {
    assert_eq!(Shortest::AGGREGATE_TYPE, "a");
    assert_eq!(Shortest::EVENT_TYPE, "order.placed-v2_x");
    assert_eq!(Spelled::AGGREGATE_TYPE, "billing-v2");
    assert_eq!(Spelled::EVENT_TYPE, "invoice.paid");
    assert_eq!(Longest::AGGREGATE_TYPE, "z0");
    assert_eq!(Longest::EVENT_TYPE.len(), 128);
    assert_eq!(Split::AGGREGATE_TYPE, "split");
    assert_eq!(Split::EVENT_TYPE, "split.event");
    assert_eq!(Split { id: 1 }.aggregate_id(), "1");
}
