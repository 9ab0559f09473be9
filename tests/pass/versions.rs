// A chain of three versions: each struct names its predecessor, exactly one version lower, and
// converts from it with `From` or `TryFrom`. The newest reads every version of the chain.
use std::fmt;

use outbox_runtime::{EventType, OutboxEvent};
use serde::{Deserialize, Serialize};

/// Version 1: the total in whole units.
#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "order.placed")]
struct OrderPlacedV1 {
    #[outbox(id)]
    order_id: u64,
    total: i64,
}

/// Version 2: the total in cents. An explicit `u32` suffix is accepted.
#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(
    aggregate = "order",
    event_type = "order.placed",
    version = 2u32,
    upcast_from = OrderPlacedV1
)]
struct OrderPlacedV2 {
    #[outbox(id)]
    order_id: u64,
    total_cents: i64,
}

impl From<OrderPlacedV1> for OrderPlacedV2 {
    fn from(v1: OrderPlacedV1) -> Self {
        OrderPlacedV2 {
            order_id: v1.order_id,
            total_cents: v1.total * 100,
        }
    }
}

/// Version 3: an order cannot be negative; the predecessor named by a path, the flag carried.
#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "order.placed", ordered)]
#[outbox(version = 3, upcast_from = self::OrderPlacedV2)]
struct OrderPlaced {
    #[outbox(id)]
    order_id: u64,
    cents: u64,
}

#[derive(Debug)]
struct Negative(i64);

impl fmt::Display for Negative {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "negative total {}", self.0)
    }
}

impl std::error::Error for Negative {}

impl TryFrom<OrderPlacedV2> for OrderPlaced {
    type Error = Negative;

    fn try_from(v2: OrderPlacedV2) -> Result<Self, Negative> {
        let cents = u64::try_from(v2.total_cents).map_err(|_| Negative(v2.total_cents))?;
        Ok(OrderPlaced {
            order_id: v2.order_id,
            cents,
        })
    }
}

/// A chain in another module, its predecessor named through `super`.
mod billing {
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize, outbox_runtime::OutboxEvent)]
    #[outbox(aggregate = "invoice", event_type = "invoice.paid", version = 7)]
    pub struct InvoicePaidV7 {
        #[outbox(id)]
        pub invoice: String,
    }

    pub mod current {
        use serde::{Deserialize, Serialize};

        #[derive(Serialize, Deserialize, outbox_runtime::OutboxEvent)]
        #[outbox(
            aggregate = "invoice",
            event_type = "invoice.paid",
            version = 8,
            upcast_from = super::InvoicePaidV7
        )]
        pub struct InvoicePaid {
            #[outbox(id)]
            pub invoice: String,
            pub paid_at: Option<String>,
        }

        impl From<super::InvoicePaidV7> for InvoicePaid {
            fn from(v7: super::InvoicePaidV7) -> Self {
                InvoicePaid {
                    invoice: v7.invoice,
                    paid_at: None,
                }
            }
        }
    }
}

/// The one entry of a struct, through the trait only.
fn entry<E: OutboxEvent>() -> EventType {
    assert_eq!(E::EVENT_TYPES.len(), 1);
    E::EVENT_TYPES[0]
}

fn main() {
    let v1 = entry::<OrderPlacedV1>();
    assert_eq!(v1, EventType::new("order.placed", 1, 1, false));
    assert_eq!(OrderPlacedV1::VERSION, 1);

    let v2 = entry::<OrderPlacedV2>();
    assert_eq!(
        (v2.name(), v2.version(), v2.oldest_version()),
        ("order.placed", 2, 1)
    );
    assert!(!v2.ordered());
    assert_eq!(OrderPlacedV2::VERSION, 2);
    assert_eq!(OrderPlacedV2::EVENT_TYPE, "order.placed");

    // The newest reads back to the chain's first version.
    let v3 = entry::<OrderPlaced>();
    assert_eq!(v3, EventType::new("order.placed", 3, 1, true));
    assert_eq!(OrderPlaced::VERSION, 3);
    assert_eq!(OrderPlaced::EVENT_TYPE, "order.placed");
    assert_eq!(OrderPlaced::AGGREGATE_TYPE, "order");

    let event = OrderPlaced {
        order_id: 7,
        cents: 1250,
    };
    assert_eq!(event.aggregate_id(), "7");
    assert_eq!(event.event_type(), &OrderPlaced::EVENT_TYPES[0]);

    // The conversions the chain uses.
    let v2 = OrderPlacedV2::from(OrderPlacedV1 {
        order_id: 7,
        total: 12,
    });
    assert_eq!(v2.total_cents, 1200);
    let v3 = OrderPlaced::try_from(v2).unwrap();
    assert_eq!((v3.order_id, v3.cents), (7, 1200));
    let negative = OrderPlacedV2 {
        order_id: 8,
        total_cents: -1,
    };
    let failed = OrderPlaced::try_from(negative).map(|_| ()).unwrap_err();
    assert_eq!(failed.to_string(), "negative total -1");

    // A chain need not start at version 1: it starts where its oldest struct does.
    let paid = entry::<billing::current::InvoicePaid>();
    assert_eq!(paid, EventType::new("invoice.paid", 8, 7, false));
    assert_eq!(billing::InvoicePaidV7::VERSION, 7);
    let invoice = billing::current::InvoicePaid::from(billing::InvoicePaidV7 {
        invoice: "inv-1".to_owned(),
    });
    assert_eq!(invoice.aggregate_id(), "inv-1");
    assert_eq!(invoice.paid_at, None);
}
