// The generated code adds no warnings, even where users deny them.
#![deny(warnings, unused, rust_2018_idioms, unreachable_pub, missing_docs)]
#![forbid(unsafe_code)]
//! Lint-clean expansion.

use outbox_runtime::OutboxEvent;

/// Events of a public module with a private id type.
pub mod events {
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize)]
    struct Ticket(u64);

    impl std::fmt::Display for Ticket {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "T{}", self.0)
        }
    }

    /// A public event, serde-renamed fields, a raw identifier.
    #[derive(Serialize, Deserialize, outbox_runtime::OutboxEvent)]
    #[serde(rename_all = "camelCase")]
    #[outbox(aggregate = "ticket", event_type = "ticket.opened")]
    pub struct TicketOpened {
        #[outbox(id)]
        #[serde(rename = "id")]
        r#ticket: Ticket,
        /// The kind of ticket.
        pub r#type: String,
    }

    /// Builds an event.
    pub fn opened(id: u64) -> TicketOpened {
        TicketOpened {
            r#ticket: Ticket(id),
            r#type: "bug".to_owned(),
        }
    }
}

fn main() {
    let event = events::opened(7);
    assert_eq!(event.aggregate_id(), "T7");
    assert_eq!(event.r#type, "bug");
    assert_eq!(events::TicketOpened::EVENT_TYPE, "ticket.opened");
    assert_eq!(
        serde_json::to_string(&event).unwrap(),
        r#"{"id":7,"type":"bug"}"#
    );
}
