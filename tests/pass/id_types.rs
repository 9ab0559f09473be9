use std::fmt;

use outbox_runtime::OutboxEvent;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "a", event_type = "a.uuid")]
struct ByUuid {
    #[outbox(id)]
    id: Uuid,
}

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "a", event_type = "a.u64")]
struct ByU64 {
    #[outbox(id)]
    id: u64,
}

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "a", event_type = "a.i32")]
struct ByI32 {
    #[outbox(id)]
    id: i32,
}

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "a", event_type = "a.string")]
struct ByString {
    #[outbox(id)]
    id: String,
}

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "a", event_type = "a.boxed")]
struct ByBoxedStr {
    #[outbox(id)]
    id: Box<str>,
}

/// A newtype id that displays with a prefix.
#[derive(Serialize, Deserialize)]
struct CustomerId(u32);

impl fmt::Display for CustomerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cus_{:06}", self.0)
    }
}

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "customer", event_type = "customer.created")]
struct ByNewtype {
    name: String,
    // The id need not be the first field.
    #[outbox(id)]
    customer: CustomerId,
}

fn main() {
    let uuid = Uuid::from_u128(1);
    assert_eq!(
        ByUuid { id: uuid }.aggregate_id(),
        "00000000-0000-0000-0000-000000000001"
    );
    assert_eq!(
        ByU64 { id: u64::MAX }.aggregate_id(),
        "18446744073709551615"
    );
    assert_eq!(ByI32 { id: -42 }.aggregate_id(), "-42");
    assert_eq!(
        ByString {
            id: "ord-1".to_owned()
        }
        .aggregate_id(),
        "ord-1"
    );
    assert_eq!(ByBoxedStr { id: "b".into() }.aggregate_id(), "b");

    let event = ByNewtype {
        name: "Ada".to_owned(),
        customer: CustomerId(42),
    };
    assert_eq!(event.aggregate_id(), "cus_000042");
    assert_eq!(event.name, "Ada");
    assert_eq!(ByNewtype::AGGREGATE_TYPE, "customer");
    assert_eq!(ByNewtype::EVENT_TYPE, "customer.created");
}
