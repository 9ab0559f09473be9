//! Kafka topics of a test's own, on the Kafka-protocol broker at 127.0.0.1:9092 (tansu, which
//! `scripts/services-up` installs and starts), or on a broker a test starts itself. Topics are
//! named under a prefix of the test's own and left behind (the broker keeps them in memory).

use std::time::{Duration, Instant};

use outbox_runtime::forward::kafka::rdkafka::admin::{
    AdminClient, AdminOptions, NewTopic, TopicReplication,
};
use outbox_runtime::forward::kafka::rdkafka::client::DefaultClientContext;
use outbox_runtime::forward::kafka::rdkafka::consumer::{BaseConsumer, Consumer};
use outbox_runtime::forward::kafka::rdkafka::message::{Headers, Message};
use outbox_runtime::forward::kafka::rdkafka::{ClientConfig, Offset, TopicPartitionList};
use outbox_runtime::forward::kafka::KafkaSink;
use uuid::Uuid;

/// Where the Kafka-protocol broker runs on every developer and CI machine.
pub const KAFKA: &str = "127.0.0.1:9092";

/// One record as a consumer reads it.
#[derive(Debug, Clone)]
pub struct Record {
    pub topic: String,
    pub partition: i32,
    pub key: String,
    pub headers: Vec<(String, String)>,
    pub payload: serde_json::Value,
}

impl Record {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// Topics under a prefix of the test's own, on one broker.
pub struct Topics {
    /// Every topic of the test starts with this and a dot.
    pub prefix: String,
    brokers: String,
}

impl Topics {
    /// The broker on 127.0.0.1:9092; panics saying how to start it if it does not answer.
    pub fn new() -> Self {
        let topics = Topics::at(KAFKA);
        let admin = topics.admin();
        if let Err(e) = admin.inner().fetch_metadata(None, Duration::from_secs(5)) {
            panic!("no Kafka broker answers on {KAFKA}: {e}; run scripts/services-up");
        }
        topics
    }

    /// A broker at `brokers` (`host:port`).
    pub fn at(brokers: &str) -> Self {
        let prefix = format!("outbox-test-{}", Uuid::new_v4().simple());
        Topics { prefix, brokers: brokers.to_owned() }
    }

    /// The client settings of the broker.
    pub fn config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.brokers);
        config
    }

    /// A sink on the broker that checks `topics` at start, creating them with 3 partitions.
    pub fn sink(&self, topics: &[String]) -> KafkaSink {
        KafkaSink::new(&self.config())
            .unwrap()
            .topics(topics.iter().cloned())
            .create_missing_topics(3, 1)
    }

    fn admin(&self) -> AdminClient<DefaultClientContext> {
        self.config().create().unwrap()
    }

    /// Creates `topic` with `partitions` partitions and `settings` (topic configuration).
    pub async fn create(&self, topic: &str, partitions: i32, settings: &[(&str, &str)]) {
        let mut new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
        for (key, value) in settings {
            new = new.set(key, value);
        }
        let created = self.admin().create_topics([&new], &AdminOptions::new()).await.unwrap();
        assert!(created.iter().all(Result::is_ok), "{topic} created: {created:?}");
    }

    /// Every record of `topic`, per partition in offset order (partitions one after the
    /// other): reads until `expected` records came, then a second more for any beyond them,
    /// or until 30 s without a new record.
    pub async fn records(&self, topic: &str, expected: usize) -> Vec<Record> {
        let config = self.config();
        let topic = topic.to_owned();
        tokio::task::spawn_blocking(move || read_records(config, &topic, expected)).await.unwrap()
    }
}

fn read_records(mut config: ClientConfig, topic: &str, expected: usize) -> Vec<Record> {
    // A group of its own that never joins (the partitions are assigned, not subscribed to):
    // librdkafka wants a group id to assign partitions.
    let group = format!("outbox-test-reader-{}", Uuid::new_v4().simple());
    let consumer: BaseConsumer =
        config.set("group.id", group).set("enable.auto.commit", "false").create().unwrap();
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10)).unwrap();
    let partitions = metadata.topics()[0].partitions().len() as i32;
    assert!(partitions > 0, "topic {topic} exists");
    let mut assignment = TopicPartitionList::new();
    for partition in 0..partitions {
        assignment.add_partition_offset(topic, partition, Offset::Beginning).unwrap();
    }
    consumer.assign(&assignment).unwrap();
    let mut records = Vec::new();
    let mut last_news = Instant::now();
    loop {
        let quiet = if records.len() >= expected {
            Duration::from_secs(1)
        } else {
            Duration::from_secs(30)
        };
        if last_news.elapsed() > quiet {
            break;
        }
        let Some(polled) = consumer.poll(Duration::from_millis(200)) else { continue };
        let message = polled.unwrap();
        last_news = Instant::now();
        let text = |bytes: &[u8]| String::from_utf8(bytes.to_vec()).unwrap();
        let headers = message.headers().map_or_else(Vec::new, |headers| {
            headers.iter().map(|h| (h.key.to_owned(), text(h.value.unwrap_or_default()))).collect()
        });
        records.push(Record {
            topic: message.topic().to_owned(),
            partition: message.partition(),
            key: text(message.key().unwrap_or_default()),
            headers,
            payload: serde_json::from_slice(message.payload().unwrap_or_default()).unwrap(),
        });
    }
    records.sort_by_key(|record| record.partition); // stable: offset order within each
    records
}

/// A broker of the test's own (tansu, in memory) on a free port, advertising `advertised`
/// (`host:port`: a proxy in front of it) to its clients; killed when dropped.
pub struct Broker {
    child: std::process::Child,
    /// Where it listens.
    pub addr: String,
}

impl Broker {
    /// Picks the port the broker will listen on (bound and released: free now).
    pub fn free_addr() -> String {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("127.0.0.1:{}", listener.local_addr().unwrap().port())
    }

    /// Starts tansu on `addr`, advertising `advertised`, and waits until it accepts connections.
    pub async fn start(addr: &str, advertised: &str) -> Broker {
        let child = std::process::Command::new("tansu")
            .args(["broker", "--listener-url", &format!("tcp://{addr}")])
            .args(["--advertised-listener-url", &format!("tcp://{advertised}")])
            .args(["--storage-engine", "memory://tansu/"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start tansu: {e}; run scripts/services-up"));
        let broker = Broker { child, addr: addr.to_owned() };
        let started = Instant::now();
        while tokio::net::TcpStream::connect(addr).await.is_err() {
            assert!(started.elapsed() < Duration::from_secs(30), "tansu listens on {addr}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        broker
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
