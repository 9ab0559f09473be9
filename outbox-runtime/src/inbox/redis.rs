//! Consuming redis into an [`Inbox`](super::Inbox) (work in progress).
