//! Consuming kafka into an [`Inbox`](super::Inbox) (work in progress).
