//! A JetStream stream of a test's own, on the real NATS server.

use std::collections::HashMap;
use std::time::Duration;

use async_nats::jetstream::{self, stream};
use outbox_runtime::forward::nats::NatsSink;
use uuid::Uuid;

/// Where NATS runs on every developer and CI machine (`scripts/services-up` starts it).
pub const NATS: &str = "127.0.0.1:4222";

/// A client of the real server; panics saying how to start it if it does not answer.
pub async fn connect() -> async_nats::Client {
    async_nats::connect(NATS)
        .await
        .unwrap_or_else(|e| panic!("NATS does not answer on {NATS}: {e}; run scripts/services-up"))
}

/// A stream named after the test, on subjects under a prefix of its own; deleted when dropped.
pub struct Stream {
    pub jetstream: jetstream::Context,
    pub name: String,
    /// Every subject of the stream starts with this and a dot.
    pub prefix: String,
}

impl Stream {
    pub async fn create(duplicate_window: Duration) -> Self {
        let jetstream = jetstream::new(connect().await);
        let id = Uuid::new_v4().simple().to_string();
        let (name, prefix) = (format!("OUTBOX_{id}"), format!("t{id}"));
        jetstream
            .create_stream(stream::Config {
                name: name.clone(),
                subjects: vec![format!("{prefix}.>")],
                duplicate_window,
                ..Default::default()
            })
            .await
            .expect("the stream is created");
        Stream { jetstream, name, prefix }
    }

    pub fn sink(&self) -> NatsSink {
        NatsSink::new(self.jetstream.client(), &self.name)
    }

    /// Every message in the stream, in stream order: `(subject, headers, payload)`.
    pub async fn messages(&self) -> Vec<(String, HashMap<String, String>, serde_json::Value)> {
        let mut stream = self.jetstream.get_stream(&self.name).await.unwrap();
        let count = stream.info().await.unwrap().state.messages;
        let mut messages = Vec::new();
        for seq in 1..=count {
            let message = stream.get_raw_message(seq).await.unwrap();
            let headers = message
                .headers
                .iter()
                .flat_map(|(name, values)| {
                    values.iter().map(move |value| (name.to_string(), value.to_string()))
                })
                .collect();
            let payload = serde_json::from_slice(&message.payload).unwrap();
            messages.push((message.subject.to_string(), headers, payload));
        }
        messages
    }

    /// The `Nats-Msg-Id` (the event id) of every message in the stream, in stream order.
    pub async fn message_ids(&self) -> Vec<Uuid> {
        let messages = self.messages().await;
        messages.iter().map(|(_, headers, _)| headers["Nats-Msg-Id"].parse().unwrap()).collect()
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let (jetstream, name) = (self.jetstream.clone(), self.name.clone());
        // Best effort: the stream names are unique, so a leftover harms no other test.
        tokio::spawn(async move {
            let _ = jetstream.delete_stream(&name).await;
        });
    }
}
