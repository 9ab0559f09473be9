// `Cargo.toml` renames cannot be modelled in a trybuild case; an `extern crate ... as` and a
// re-export through a module do the same to paths.
extern crate outbox_runtime as my_outbox;

use my_outbox::OutboxEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, my_outbox::OutboxEvent)]
#[outbox(crate = "my_outbox", aggregate = "order", event_type = "order.placed")]
struct OrderPlaced {
    #[outbox(id)]
    order_id: u64,
}

mod deps {
    pub mod outbox {
        pub use ::my_outbox::*;
    }
}

mod events {
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize, crate::deps::outbox::OutboxEvent)]
    #[outbox(
        crate = "crate::deps::outbox",
        aggregate = "invoice",
        event_type = "invoice.paid"
    )]
    pub struct InvoicePaid {
        #[outbox(id)]
        pub invoice_id: String,
    }
}

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(
    crate = "::outbox_runtime",
    aggregate = "user",
    event_type = "user.created"
)]
struct UserCreated {
    #[outbox(id)]
    user_id: i32,
}

fn main() {
    assert_eq!(OrderPlaced::AGGREGATE_TYPE, "order");
    assert_eq!(OrderPlaced::EVENT_TYPE, "order.placed");
    assert_eq!(OrderPlaced { order_id: 42 }.aggregate_id(), "42");

    let paid = events::InvoicePaid {
        invoice_id: "inv-7".to_owned(),
    };
    assert_eq!(events::InvoicePaid::AGGREGATE_TYPE, "invoice");
    assert_eq!(events::InvoicePaid::EVENT_TYPE, "invoice.paid");
    assert_eq!(paid.aggregate_id(), "inv-7");

    assert_eq!(UserCreated::EVENT_TYPE, "user.created");
    assert_eq!(UserCreated { user_id: -3 }.aggregate_id(), "-3");
}
