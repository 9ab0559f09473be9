//! A RabbitMQ exchange and queue of a test's own, on the real broker.

use std::collections::HashMap;
use std::sync::Arc;

use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use outbox_runtime::forward::rabbitmq::RabbitSink;
use uuid::Uuid;

/// Where RabbitMQ runs on every developer and CI machine (vhost `/`; `scripts/services-up`
/// starts it).
pub const AMQP: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// A connection to the real broker; panics saying how to start it if it does not answer.
pub async fn connect() -> Connection {
    Connection::connect(AMQP, ConnectionProperties::default()).await.unwrap_or_else(|e| {
        panic!("RabbitMQ does not answer on 127.0.0.1:5672: {e}; run scripts/services-up")
    })
}

/// A message as a consumer of the queue reads it.
#[derive(Debug)]
pub struct Received {
    pub routing_key: String,
    pub message_id: Option<String>,
    pub content_type: Option<String>,
    pub delivery_mode: Option<u8>,
    pub headers: HashMap<String, String>,
    pub payload: serde_json::Value,
}

/// A topic exchange named after the test and a queue bound to it for every routing key under
/// `prefix`. The queue is exclusive and the exchange auto-deleted, so the broker removes both
/// when the test's connection closes, even after a panic; dropping also deletes them at once.
pub struct Exchange {
    connection: Arc<Connection>,
    channel: Channel,
    pub name: String,
    pub queue: String,
    /// Every routing key the queue takes starts with this and a dot.
    pub prefix: String,
}

impl Exchange {
    pub async fn create() -> Self {
        let connection = connect().await;
        let channel = connection.create_channel().await.unwrap();
        let id = Uuid::new_v4().simple().to_string();
        let (name, queue, prefix) =
            (format!("outbox-{id}"), format!("outbox-{id}"), format!("t{id}"));
        let exclusive = QueueDeclareOptions { exclusive: true, ..Default::default() };
        channel
            .queue_declare(queue.as_str().into(), exclusive, FieldTable::default())
            .await
            .unwrap();
        let exchange = Exchange { connection: Arc::new(connection), channel, name, queue, prefix };
        exchange.declare().await;
        exchange
    }

    /// Declares the exchange and binds the queue to it (again, after `delete_exchange`).
    pub async fn declare(&self) {
        let options = ExchangeDeclareOptions { auto_delete: true, ..Default::default() };
        let (name, queue) = (self.name.as_str(), self.queue.as_str());
        self.channel
            .exchange_declare(name.into(), ExchangeKind::Topic, options, FieldTable::default())
            .await
            .expect("the exchange is declared");
        let keys = format!("{}.#", self.prefix);
        let bind = QueueBindOptions::default();
        self.channel
            .queue_bind(queue.into(), name.into(), keys.into(), bind, FieldTable::default())
            .await
            .unwrap();
    }

    /// Deletes the exchange (and so its binding); the queue and its messages stay.
    pub async fn delete_exchange(&self) {
        let options = ExchangeDeleteOptions::default();
        self.channel.exchange_delete(self.name.as_str().into(), options).await.unwrap();
    }

    /// A sink on a connection of its own, as an application's relay would have.
    pub async fn sink(&self) -> RabbitSink {
        RabbitSink::new(connect().await, &self.name)
    }

    /// Every message in the queue, in queue order, taken off it.
    pub async fn messages(&self) -> Vec<Received> {
        let mut messages = Vec::new();
        let no_ack = BasicGetOptions { no_ack: true };
        while let Some(got) =
            self.channel.basic_get(self.queue.as_str().into(), no_ack).await.unwrap()
        {
            let delivery = got.delivery;
            let properties = &delivery.properties;
            let headers = properties
                .headers()
                .iter()
                .flatten()
                .map(|(name, value)| {
                    let value = match value {
                        AMQPValue::LongString(text) => text.to_string(),
                        other => panic!("header {name} is not a string: {other:?}"),
                    };
                    (name.to_string(), value)
                })
                .collect();
            messages.push(Received {
                routing_key: delivery.routing_key.to_string(),
                message_id: properties.message_id().as_ref().map(ToString::to_string),
                content_type: properties.content_type().as_ref().map(ToString::to_string),
                delivery_mode: *properties.delivery_mode(),
                headers,
                payload: serde_json::from_slice(&delivery.data).unwrap(),
            });
        }
        messages
    }
}

impl Drop for Exchange {
    fn drop(&mut self) {
        let (connection, channel) = (self.connection.clone(), self.channel.clone());
        let (name, queue) = (self.name.clone(), self.queue.clone());
        // Best effort: the broker removes both anyway when the connection closes.
        tokio::spawn(async move {
            let _ =
                channel.queue_delete(queue.as_str().into(), QueueDeleteOptions::default()).await;
            let _ = channel
                .exchange_delete(name.as_str().into(), ExchangeDeleteOptions::default())
                .await;
            drop(connection);
        });
    }
}
