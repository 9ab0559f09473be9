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

    /// The first version of a ticket's closing.
    #[derive(Serialize, Deserialize, outbox_runtime::OutboxEvent)]
    #[outbox(aggregate = "ticket", event_type = "ticket.closed")]
    pub struct TicketClosedV1 {
        #[outbox(id)]
        ticket: u64,
    }

    /// A ticket's closing, with a reason: a chain of two versions.
    #[derive(Serialize, Deserialize, outbox_runtime::OutboxEvent)]
    #[outbox(
        aggregate = "ticket",
        event_type = "ticket.closed",
        version = 2,
        upcast_from = TicketClosedV1
    )]
    pub struct TicketClosed {
        #[outbox(id)]
        ticket: u64,
        /// Why it was closed.
        pub reason: String,
    }

    impl From<TicketClosedV1> for TicketClosed {
        fn from(v1: TicketClosedV1) -> Self {
            TicketClosed {
                ticket: v1.ticket,
                reason: String::new(),
            }
        }
    }

    /// Every event of a ticket.
    #[derive(Serialize, Deserialize, outbox_runtime::OutboxEvent)]
    #[outbox(aggregate = "ticket")]
    pub enum TicketEvent {
        /// Opened.
        #[outbox(event_type = "ticket.opened")]
        Opened(TicketOpened),
        /// Closed.
        #[outbox(event_type = "ticket.closed")]
        Closed(TicketClosed),
        /// Reopened: a struct variant, a raw identifier.
        #[outbox(event_type = "ticket.reopened")]
        Reopened {
            /// The ticket.
            #[outbox(id)]
            r#ticket: u64,
        },
    }

    /// Builds an event.
    pub fn opened(id: u64) -> TicketOpened {
        TicketOpened {
            r#ticket: Ticket(id),
            r#type: "bug".to_owned(),
        }
    }
}

/// A private event whose generated constants go unused: no dead-code warning.
#[derive(serde::Serialize, serde::Deserialize, OutboxEvent)]
#[outbox(aggregate = "note", event_type = "note.taken")]
struct NoteTakenV1 {
    #[outbox(id)]
    note: u64,
}

/// Its private successor.
#[derive(serde::Serialize, serde::Deserialize, OutboxEvent)]
#[outbox(aggregate = "note", event_type = "note.taken", version = 2, upcast_from = NoteTakenV1)]
struct NoteTaken {
    #[outbox(id)]
    note: u64,
}

impl From<NoteTakenV1> for NoteTaken {
    fn from(v1: NoteTakenV1) -> Self {
        NoteTaken { note: v1.note }
    }
}

/// A private family.
#[derive(serde::Serialize, serde::Deserialize, OutboxEvent)]
#[outbox(aggregate = "note")]
enum NoteEvent {
    #[outbox(event_type = "note.taken")]
    Taken(NoteTaken),
    #[outbox(event_type = "note.erased")]
    Erased {
        #[outbox(id)]
        note: u64,
    },
}

fn main() {
    let note = NoteTaken::from(NoteTakenV1 { note: 1 });
    assert_eq!(note.aggregate_id(), "1");
    let taken = NoteEvent::Taken(note);
    assert_eq!(taken.aggregate_id(), "1");
    assert_eq!(NoteEvent::Erased { note: 2 }.aggregate_id(), "2");
    let event = events::opened(7);
    assert_eq!(event.aggregate_id(), "T7");
    assert_eq!(event.r#type, "bug");
    assert_eq!(events::TicketOpened::EVENT_TYPE, "ticket.opened");
    assert_eq!(events::TicketClosed::VERSION, 2);
    let family = events::TicketEvent::Opened(events::opened(8));
    assert_eq!(family.event_type().name(), "ticket.opened");
    assert_eq!(events::TicketEvent::EVENT_TYPES.len(), 3);
    assert_eq!(
        serde_json::to_string(&event).unwrap(),
        r#"{"id":7,"type":"bug"}"#
    );
}
