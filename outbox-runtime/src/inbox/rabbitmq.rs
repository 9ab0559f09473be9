//! Consuming rabbitmq into an [`Inbox`](super::Inbox) (work in progress).
