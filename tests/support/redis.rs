//! Redis stream keys of a test's own, on the real server.

use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::Client;
use outbox_runtime::forward::redis::RedisSink;
use uuid::Uuid;

/// Where Redis runs on every developer and CI machine (`scripts/services-up` starts it).
pub const REDIS: &str = "redis://127.0.0.1:6379/";

/// A connection to the real server; panics saying how to start it if it does not answer.
///
/// Replies may take 30 s, not the client's default 500 ms: the crash tests read thousands of
/// entries while both cores are busy, and a reply late by a second is no failure of the sink.
pub async fn connect() -> ConnectionManager {
    let client = Client::open(REDIS).unwrap();
    let config = ConnectionManagerConfig::new().set_response_timeout(Some(Duration::from_secs(30)));
    ConnectionManager::new_with_config(client, config).await.unwrap_or_else(|e| {
        panic!("Redis does not answer on 127.0.0.1:6379: {e}; run scripts/services-up")
    })
}

/// One stream entry: its id and its fields in order.
pub type Entry = (String, Vec<(String, String)>);

/// Stream keys under a prefix of the test's own; every key under it is deleted when dropped.
pub struct Streams {
    pub connection: ConnectionManager,
    /// Every key of the test starts with this and a dot.
    pub prefix: String,
}

impl Streams {
    pub async fn create() -> Self {
        let prefix = format!("outbox-test-{}", Uuid::new_v4().simple());
        Streams { connection: connect().await, prefix }
    }

    pub async fn sink(&self) -> RedisSink {
        RedisSink::new(connect().await)
    }

    /// Every entry of the stream `key`, oldest first (`XRANGE`, 500 at a time).
    pub async fn entries(&self, key: &str) -> Vec<Entry> {
        let mut connection = self.connection.clone();
        let mut entries: Vec<Entry> = Vec::new();
        loop {
            let start = entries.last().map_or("-".to_owned(), |(id, _)| format!("({id}"));
            let page: Vec<Entry> = ::redis::cmd("XRANGE")
                .arg(key)
                .arg(start)
                .arg("+")
                .arg("COUNT")
                .arg(500)
                .query_async(&mut connection)
                .await
                .unwrap();
            if page.is_empty() {
                return entries;
            }
            entries.extend(page);
        }
    }

    /// The test's keys.
    pub async fn keys(&self) -> Vec<String> {
        let mut connection = self.connection.clone();
        let pattern = format!("{}.*", self.prefix);
        ::redis::cmd("KEYS").arg(pattern).query_async(&mut connection).await.unwrap()
    }
}

impl Drop for Streams {
    fn drop(&mut self) {
        let mut connection = self.connection.clone();
        let pattern = format!("{}.*", self.prefix);
        // Best effort: the prefixes are unique, so a leftover harms no other test.
        tokio::spawn(async move {
            let keys: Vec<String> = ::redis::cmd("KEYS")
                .arg(pattern)
                .query_async(&mut connection)
                .await
                .unwrap_or_default();
            if !keys.is_empty() {
                let _: Result<i64, _> =
                    ::redis::cmd("DEL").arg(keys).query_async(&mut connection).await;
            }
        });
    }
}
