//! `outbox forward`, run as a process against the real PostgreSQL and NATS JetStream.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use outbox_runtime::OutboxEvent;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use uuid::Uuid;

#[path = "../../tests/support/db.rs"]
mod db;
#[path = "../../tests/support/kafka.rs"]
#[allow(dead_code)]
mod kafka;
#[path = "../../tests/support/nats.rs"]
#[allow(dead_code)] // the workspace tests use the rest
mod nats;
#[path = "../../tests/support/rabbitmq.rs"]
#[allow(dead_code)]
mod rabbitmq;
#[path = "../../tests/support/redis.rs"]
#[allow(dead_code)]
mod redis_streams;
use db::*;
use nats::Stream;
/// `Certs`: a CA and a server certificate, made with `openssl`.
mod certs;

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "order.placed")]
struct OrderPlaced {
    #[outbox(id)]
    order_id: u32,
}

/// `outbox --database-url ... --json forward` with the flags given as environment variables.
fn forward(pool: &PgPool, env: &[(&str, &str)]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args(["--database-url", &database_url(pool), "--json", "forward"])
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the outbox binary runs")
}

/// A local address no one listens on right now.
fn free_address() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().to_string()
}

/// The whole response to `GET path` (the server closes the connection after it).
async fn get(address: &str, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(address).await.expect("the server listens");
    let request = format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response
}

async fn published(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM outbox.events WHERE published_at IS NOT NULL")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrations = false)]
async fn forward_publishes_until_sigterm_and_prints_what_it_did(pool: PgPool) {
    migrated(&pool).await;
    let stream = Stream::create(Duration::from_secs(120)).await;
    let events: Vec<OrderPlaced> = (0..20).map(|order_id| OrderPlaced { order_id }).collect();
    let ids = emit_committed(&pool, &events).await;
    let subject = format!("{}.{{aggregate_type}}.{{event_type}}", stream.prefix);
    let metrics_addr = free_address();
    let child = forward(
        &pool,
        &[
            ("OUTBOX_FORWARD_TO", "nats://127.0.0.1:4222"),
            ("OUTBOX_FORWARD_STREAM", &stream.name),
            ("OUTBOX_FORWARD_DESTINATION", &subject),
            ("OUTBOX_FORWARD_EVENT_TYPES", "order:order.placed"),
            ("OUTBOX_FORWARD_METRICS_ADDR", &metrics_addr),
        ],
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while published(&pool).await < 20 {
        assert!(tokio::time::Instant::now() < deadline, "the forwarder published everything");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let health = get(&metrics_addr, "/health").await;
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    let metrics = get(&metrics_addr, "/metrics").await;
    assert!(
        metrics.contains("outbox_delivered_total{event_type=\"order.placed\"} 20"),
        "{metrics}"
    );
    let pid = child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let output = child.wait_with_output().unwrap();
    let (stdout, stderr) =
        (String::from_utf8(output.stdout).unwrap(), String::from_utf8(output.stderr).unwrap());
    assert!(output.status.success(), "stdout: {stdout}\nstderr: {stderr}");
    let summary: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(summary["forwarded"], 20, "{stdout}");
    assert_eq!(summary["failed"], 0, "{stdout}");

    let mut forwarded: Vec<Uuid> = stream
        .messages()
        .await
        .iter()
        .map(|(subject, headers, _)| {
            assert_eq!(subject, &format!("{}.order.order.placed", stream.prefix));
            headers["Nats-Msg-Id"].parse().unwrap()
        })
        .collect();
    forwarded.sort();
    let mut expected = ids.clone();
    expected.sort();
    assert_eq!(forwarded, expected, "every event once");
}

#[sqlx::test(migrations = false)]
async fn forward_refuses_a_broker_it_cannot_use(pool: PgPool) {
    migrated(&pool).await;
    let fails = |env: &[(&str, &str)]| {
        let output = forward(&pool, env).wait_with_output().unwrap();
        assert_eq!(output.status.code(), Some(1));
        String::from_utf8(output.stderr).unwrap()
    };
    let ftp = fails(&[("OUTBOX_FORWARD_TO", "ftp://127.0.0.1")]);
    assert!(ftp.contains("cannot forward to `ftp://`"), "{ftp}");
    let no_exchange = fails(&[("OUTBOX_FORWARD_TO", "amqp://guest:guest@127.0.0.1:5672/%2f")]);
    assert!(no_exchange.contains("needs --exchange"), "{no_exchange}");
    let refused = fails(&[
        ("OUTBOX_FORWARD_TO", "amqp://guest:not-the-password@127.0.0.1:5672/%2f"),
        ("OUTBOX_FORWARD_EXCHANGE", "amq.topic"),
    ]);
    assert!(refused.contains("exchange `amq.topic`: cannot connect to the broker"), "{refused}");
    assert!(!refused.contains("not-the-password"), "the password is never printed: {refused}");
    let no_stream = fails(&[("OUTBOX_FORWARD_TO", "nats://127.0.0.1:4222")]);
    assert!(no_stream.contains("needs --stream"), "{no_stream}");
    let missing = fails(&[
        ("OUTBOX_FORWARD_TO", "nats://127.0.0.1:4222"),
        ("OUTBOX_FORWARD_STREAM", "NO_SUCH_STREAM"),
    ]);
    assert!(
        missing.contains("the forwarding sink is not ready: stream `NO_SUCH_STREAM`"),
        "{missing}"
    );
}

/// Runs the daemon until it published every pending row, then stops it with SIGTERM; returns
/// its JSON summary.
async fn forward_all(pool: &PgPool, env: &[(&str, &str)], events: i64) -> serde_json::Value {
    let child = forward(pool, env);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while published(pool).await < events {
        assert!(tokio::time::Instant::now() < deadline, "the forwarder published everything");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pid = child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let output = child.wait_with_output().unwrap();
    let (stdout, stderr) =
        (String::from_utf8(output.stdout).unwrap(), String::from_utf8(output.stderr).unwrap());
    assert!(output.status.success(), "stdout: {stdout}\nstderr: {stderr}");
    serde_json::from_str(&stdout).unwrap()
}

#[sqlx::test(migrations = false)]
async fn forward_publishes_to_a_rabbitmq_exchange(pool: PgPool) {
    migrated(&pool).await;
    let exchange = rabbitmq::Exchange::create().await;
    let events: Vec<OrderPlaced> = (0..5).map(|order_id| OrderPlaced { order_id }).collect();
    let mut ids = emit_committed(&pool, &events).await;
    let routing_key = format!("{}.{{aggregate_type}}.{{event_type}}", exchange.prefix);
    let summary = forward_all(
        &pool,
        &[
            ("OUTBOX_FORWARD_TO", rabbitmq::AMQP),
            ("OUTBOX_FORWARD_EXCHANGE", &exchange.name),
            ("OUTBOX_FORWARD_DESTINATION", &routing_key),
        ],
        5,
    )
    .await;
    assert_eq!(summary["forwarded"], 5);
    let mut received: Vec<Uuid> = exchange
        .messages()
        .await
        .iter()
        .map(|message| message.message_id.as_deref().unwrap().parse().unwrap())
        .collect();
    received.sort();
    ids.sort();
    assert_eq!(received, ids, "every event once, with its id as message_id");
}

#[sqlx::test(migrations = false)]
async fn forward_appends_to_redis_streams(pool: PgPool) {
    migrated(&pool).await;
    let streams = redis_streams::Streams::create().await;
    let events: Vec<OrderPlaced> = (0..5).map(|order_id| OrderPlaced { order_id }).collect();
    let ids = emit_committed(&pool, &events).await;
    let key = format!("{}.{{aggregate_type}}.{{event_type}}", streams.prefix);
    let summary = forward_all(
        &pool,
        &[("OUTBOX_FORWARD_TO", redis_streams::REDIS), ("OUTBOX_FORWARD_DESTINATION", &key)],
        5,
    )
    .await;
    assert_eq!(summary["forwarded"], 5);
    let entries = streams.entries(&format!("{}.order.order.placed", streams.prefix)).await;
    let mut received: Vec<Uuid> = entries
        .iter()
        .map(|(_, fields)| fields.iter().find(|(name, _)| name == "id").unwrap().1.parse().unwrap())
        .collect();
    received.sort();
    let mut ids = ids;
    ids.sort();
    assert_eq!(received, ids, "every event once, with its id field");
}

/// `--to kafka://`: the topic named by `--topic` is created at start (`--kafka-create-topics`),
/// and each event arrives once, keyed by its aggregate id.
#[sqlx::test(migrations = false)]
async fn forward_produces_to_kafka_and_creates_the_topic(pool: PgPool) {
    migrated(&pool).await;
    let topics = kafka::Topics::new();
    let topic = format!("{}.orders", topics.prefix);
    let events: Vec<OrderPlaced> = (0..5).map(|order_id| OrderPlaced { order_id }).collect();
    let mut ids = emit_committed(&pool, &events).await;
    let to = format!("kafka://{}", kafka::KAFKA);
    let summary = forward_all(
        &pool,
        &[
            ("OUTBOX_FORWARD_TO", &to),
            ("OUTBOX_FORWARD_DESTINATION", &topic),
            ("OUTBOX_FORWARD_KAFKA_CREATE_TOPICS", "2:1"),
            ("OUTBOX_FORWARD_KAFKA_OPTIONS", "linger.ms=1,client.id=outbox-cli-test"),
        ],
        5,
    )
    .await;
    assert_eq!(summary["forwarded"], 5);
    let records = topics.records(&topic, 5).await;
    let mut received: Vec<Uuid> =
        records.iter().map(|r| r.header("outbox-event-id").unwrap().parse().unwrap()).collect();
    received.sort();
    ids.sort();
    assert_eq!(received, ids, "every event once, with its id as outbox-event-id");
    for record in &records {
        assert_eq!(record.key, record.payload["order_id"].to_string(), "keyed by aggregate id");
    }
}

/// A topic that does not exist, without `--kafka-create-topics`, stops the daemon at start
/// naming it; a broker that does not answer names its address.
#[sqlx::test(migrations = false)]
async fn forward_refuses_a_missing_kafka_topic_and_an_unreachable_broker(pool: PgPool) {
    migrated(&pool).await;
    let topics = kafka::Topics::new();
    let topic = format!("{}.missing", topics.prefix);
    let to = format!("kafka://{}", kafka::KAFKA);
    let env = [("OUTBOX_FORWARD_TO", to.as_str()), ("OUTBOX_FORWARD_DESTINATION", &topic)];
    let output = forward(&pool, &env).wait_with_output().unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(!output.status.success());
    assert!(stderr.contains(&format!("{topic}: no such topic")), "{stderr}");

    let nobody = free_address();
    let to = format!("kafka://{nobody}");
    let env = [("OUTBOX_FORWARD_TO", to.as_str()), ("OUTBOX_FORWARD_DESTINATION", "orders")];
    let output = forward(&pool, &env).wait_with_output().unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(!output.status.success());
    assert!(stderr.contains(&format!("kafka brokers {nobody}")), "{stderr}");
}

/// Servers a test started for itself, killed when dropped.
struct Spawned(Vec<Child>);

impl Spawned {
    /// Starts `commands` (their output discarded) and waits until something listens on `addr`.
    async fn listening_on(addr: &str, commands: impl IntoIterator<Item = Command>) -> Spawned {
        let spawned = Spawned(
            commands
                .into_iter()
                .map(|mut command| {
                    let program = command.get_program().to_string_lossy().into_owned();
                    command.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap_or_else(
                        |e| panic!("cannot run {program}: {e} (scripts/services-up installs it)"),
                    )
                })
                .collect(),
        );
        for _ in 0..500 {
            if tokio::net::TcpStream::connect(addr).await.is_ok() {
                return spawned;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("nothing listens on {addr} 10 s after starting the test's server");
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        for process in &mut self.0 {
            let _ = process.kill();
            let _ = process.wait();
        }
    }
}

/// A redis-server of the test's own that speaks TLS only, on a free port, with a certificate
/// of `certs`; killed when dropped.
struct TlsRedis {
    port: u16,
    _server: Spawned,
}

impl TlsRedis {
    async fn start(certs: &certs::Certs) -> TlsRedis {
        let port = free_address().rsplit_once(':').unwrap().1.parse::<u16>().unwrap();
        let path = |p: std::path::PathBuf| p.display().to_string();
        let mut server = Command::new("redis-server");
        server
            .args(["--port", "0", "--tls-port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--tls-cert-file", &path(certs.server_cert())])
            .args(["--tls-key-file", &path(certs.server_key())])
            .args(["--tls-ca-cert-file", &path(certs.ca()), "--tls-auth-clients", "no"])
            .args(["--save", "", "--appendonly", "no", "--dir", &path(certs.dir().to_owned())]);
        let server = Spawned::listening_on(&format!("127.0.0.1:{port}"), [server]).await;
        TlsRedis { port, _server: server }
    }

    /// How many entries the stream `key` has, read over TLS trusting `ca`.
    async fn xlen(&self, ca: &std::path::Path, key: &str) -> i64 {
        let certificates = ::redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(std::fs::read(ca).unwrap()),
        };
        let url = format!("rediss://127.0.0.1:{}/", self.port);
        let client = ::redis::Client::build_with_tls(url, certificates).unwrap();
        let mut connection = client.get_multiplexed_async_connection().await.unwrap();
        ::redis::cmd("XLEN").arg(key).query_async(&mut connection).await.unwrap()
    }
}

#[sqlx::test(migrations = false)]
async fn forward_appends_to_redis_over_tls_and_checks_the_certificate(pool: PgPool) {
    // The test process reads the stream over TLS too.
    let _ = rustls::crypto::ring::default_provider().install_default();
    migrated(&pool).await;
    let certs = certs::Certs::generate();
    let redis = TlsRedis::start(&certs).await;
    let url = format!("rediss://127.0.0.1:{}/", redis.port);
    let key = format!("outbox-tls-{}", Uuid::new_v4().simple());
    emit_committed(&pool, &(0..3).map(|order_id| OrderPlaced { order_id }).collect::<Vec<_>>())
        .await;

    // The test's CA is not among the system's roots: refused, and nothing sent in the clear.
    let output =
        forward(&pool, &[("OUTBOX_FORWARD_TO", &url), ("OUTBOX_FORWARD_DESTINATION", &key)])
            .wait_with_output()
            .unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    let at = format!("cannot reach the broker at 127.0.0.1:{} over TLS: ", redis.port);
    assert!(stderr.contains(&at), "{stderr}");
    assert!(stderr.contains("invalid peer certificate: UnknownIssuer"), "{stderr}");
    assert_eq!(published(&pool).await, 0);

    // Trusted through SSL_CERT_FILE, as any system root would be.
    let ca = certs.ca().display().to_string();
    let env = [("OUTBOX_FORWARD_TO", url.as_str()), ("OUTBOX_FORWARD_DESTINATION", &key)];
    let summary = forward_all(&pool, &[&env[..], &[("SSL_CERT_FILE", &ca)]].concat(), 3).await;
    assert_eq!(summary["forwarded"], 3);
    assert_eq!(redis.xlen(&certs.ca(), &key).await, 3);
}

/// A nats-server of the test's own with JetStream that speaks TLS only, with a certificate of
/// `certs` (its streams stored in their directory), and takes the user `outbox` with the
/// password `s3cret`; killed when dropped.
struct TlsNats {
    addr: String,
    _server: Spawned,
}

impl TlsNats {
    const USER: &str = "outbox";
    const PASSWORD: &str = "s3cret";

    async fn start(certs: &certs::Certs) -> TlsNats {
        let addr = free_address();
        let (host, port) = addr.rsplit_once(':').unwrap();
        let path = |p: std::path::PathBuf| p.display().to_string();
        let mut server = Command::new("nats-server");
        server
            .args(["-a", host, "-p", port, "-js", "-sd", &path(certs.dir().join("jetstream"))])
            .args(["--tls", "--tlscert", &path(certs.server_cert())])
            .args(["--tlskey", &path(certs.server_key())])
            .args(["--user", TlsNats::USER, "--pass", TlsNats::PASSWORD]);
        let server = Spawned::listening_on(&addr, [server]).await;
        TlsNats { addr, _server: server }
    }

    /// A client over TLS trusting `certs`' CA, with the user and password.
    async fn client(&self, certs: &certs::Certs) -> async_nats::Client {
        async_nats::ConnectOptions::with_user_and_password(
            TlsNats::USER.into(),
            TlsNats::PASSWORD.into(),
        )
        .add_root_certificates(certs.ca())
        .require_tls(true)
        .connect(&self.addr)
        .await
        .unwrap()
    }
}

/// `tls://user:password@...` to JetStream: a certificate no trusted CA signed, or a wrong
/// password, stops the daemon at start without printing the password; trusted through
/// `SSL_CERT_FILE`, with the right password, every event reaches the stream.
#[sqlx::test(migrations = false)]
async fn forward_publishes_to_nats_over_tls_with_a_password(pool: PgPool) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    migrated(&pool).await;
    let certs = certs::Certs::generate();
    let nats = TlsNats::start(&certs).await;
    let jetstream = async_nats::jetstream::new(nats.client(&certs).await);
    let stream = async_nats::jetstream::stream::Config {
        name: "EVENTS".into(),
        subjects: vec!["events.>".into()],
        ..Default::default()
    };
    jetstream.create_stream(stream).await.unwrap();
    emit_committed(&pool, &(0..3).map(|order_id| OrderPlaced { order_id }).collect::<Vec<_>>())
        .await;
    let url = |password: &str| format!("tls://{}:{password}@{}", TlsNats::USER, nats.addr);
    let env = |url: &str| {
        [
            ("OUTBOX_FORWARD_TO", url.to_owned()),
            ("OUTBOX_FORWARD_STREAM", "EVENTS".to_owned()),
            ("OUTBOX_FORWARD_DESTINATION", "events.{event_type}".to_owned()),
        ]
    };
    let ca = certs.ca().display().to_string();
    let untrusted = env(&url(TlsNats::PASSWORD));
    let wrong_password = env(&url("not-it"));
    for (env, extra) in
        [(untrusted, vec![]), (wrong_password, vec![("SSL_CERT_FILE", ca.as_str())])]
    {
        let env: Vec<(&str, &str)> =
            env.iter().map(|(k, v)| (*k, v.as_str())).chain(extra).collect();
        let output = forward(&pool, &env).wait_with_output().unwrap();
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains(&format!("{} over TLS", nats.addr)), "{stderr}");
        assert!(!stderr.contains(TlsNats::PASSWORD) && !stderr.contains("not-it"), "{stderr}");
        assert_eq!(published(&pool).await, 0);
    }

    let trusted = env(&url(TlsNats::PASSWORD));
    let env: Vec<(&str, &str)> = trusted
        .iter()
        .map(|(k, v)| (*k, v.as_str()))
        .chain([("SSL_CERT_FILE", ca.as_str())])
        .collect();
    let summary = forward_all(&pool, &env, 3).await;
    assert_eq!(summary["forwarded"], 3);
    let mut events = jetstream.get_stream("EVENTS").await.unwrap();
    assert_eq!(events.info().await.unwrap().state.messages, 3);
}

/// A Kafka-protocol broker of the test's own that speaks TLS only, with a certificate of
/// `certs`: tansu (in memory; its own TLS does not start in 0.6.0) behind `socat` terminating
/// TLS, tansu advertising socat's address so that clients come back through it. Both killed
/// when dropped.
struct TlsKafka {
    addr: String,
    _servers: Spawned,
}

impl TlsKafka {
    async fn start(certs: &certs::Certs) -> TlsKafka {
        let (addr, plain) = (free_address(), free_address());
        let mut broker = Command::new("tansu");
        broker
            .args(["broker", "--listener-url", &format!("tcp://{plain}")])
            .args(["--advertised-listener-url", &format!("tcp://{addr}")])
            .args(["--storage-engine", "memory://tansu/"]);
        let servers =
            Spawned::listening_on(&addr, [broker, tls_terminator(certs, &addr, &plain)]).await;
        TlsKafka { addr, _servers: servers }
    }
}

/// `socat` listening on `addr` with TLS (a server certificate of `certs`) and passing each
/// connection on in plain text to `plain`.
fn tls_terminator(certs: &certs::Certs, addr: &str, plain: &str) -> Command {
    let port = addr.rsplit_once(':').unwrap().1;
    let listen = format!(
        "OPENSSL-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork,verify=0,cert={},key={}",
        certs.server_cert().display(),
        certs.server_key().display()
    );
    let mut terminator = Command::new("socat");
    terminator.args([listen, format!("TCP:{plain}")]);
    terminator
}

/// `kafka+ssl://` is TLS or no connection: a certificate that no trusted CA signed stops the
/// daemon at start naming the brokers; `--kafka-ca` trusts the test's CA and the events go out;
/// `kafka://` to the TLS port never gets through in plain text.
#[sqlx::test(migrations = false)]
async fn forward_produces_to_kafka_over_tls_and_checks_the_certificate(pool: PgPool) {
    migrated(&pool).await;
    let certs = certs::Certs::generate();
    let kafka = TlsKafka::start(&certs).await;
    emit_committed(&pool, &(0..3).map(|order_id| OrderPlaced { order_id }).collect::<Vec<_>>())
        .await;
    let topic = format!("outbox-tls-{}", Uuid::new_v4().simple());
    let over_tls = format!("kafka+ssl://{}", kafka.addr);
    let env = [
        ("OUTBOX_FORWARD_TO", over_tls.as_str()),
        ("OUTBOX_FORWARD_DESTINATION", &topic),
        ("OUTBOX_FORWARD_KAFKA_CREATE_TOPICS", "1:1"),
    ];

    let plain = format!("kafka://{}", kafka.addr);
    let plain_env = [("OUTBOX_FORWARD_TO", plain.as_str()), env[1], env[2]];
    for refused in [&env[..], &plain_env[..]] {
        let output = forward(&pool, refused).wait_with_output().unwrap();
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains(&format!("kafka brokers {}", kafka.addr)), "{stderr}");
        assert_eq!(published(&pool).await, 0);
    }

    let ca = certs.ca().display().to_string();
    let summary =
        forward_all(&pool, &[&env[..], &[("OUTBOX_FORWARD_KAFKA_CA", &ca)]].concat(), 3).await;
    assert_eq!(summary["forwarded"], 3);
}

#[sqlx::test(migrations = false)]
async fn forward_over_amqps_to_a_plain_port_fails_and_never_goes_plain(pool: PgPool) {
    migrated(&pool).await;
    emit_committed(&pool, &[OrderPlaced { order_id: 1 }]).await;
    let output = forward(
        &pool,
        &[
            ("OUTBOX_FORWARD_TO", "amqps://guest:a-secret@127.0.0.1:5672/%2f"),
            ("OUTBOX_FORWARD_EXCHANGE", "amq.topic"),
        ],
    )
    .wait_with_output()
    .unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("exchange `amq.topic`: cannot connect to the broker"), "{stderr}");
    assert!(!stderr.contains("a-secret"), "the password is never printed: {stderr}");
    assert_eq!(published(&pool).await, 0);
}

/// `amqps://` is TLS or no connection: through a TLS terminator in front of the tests' RabbitMQ,
/// a certificate no trusted CA signed stops the daemon at start without printing the password;
/// trusted through `SSL_CERT_FILE`, every event reaches the exchange's queue once.
#[sqlx::test(migrations = false)]
async fn forward_publishes_to_rabbitmq_over_amqps_and_checks_the_certificate(pool: PgPool) {
    migrated(&pool).await;
    let certs = certs::Certs::generate();
    let addr = free_address();
    let _terminator =
        Spawned::listening_on(&addr, [tls_terminator(&certs, &addr, "127.0.0.1:5672")]).await;
    let exchange = rabbitmq::Exchange::create().await;
    let events: Vec<OrderPlaced> = (0..3).map(|order_id| OrderPlaced { order_id }).collect();
    let mut ids = emit_committed(&pool, &events).await;
    // The broker's own user, under a password only the URL holds: `guest` would be found in
    // the user's name.
    let url = format!("amqps://guest:guest@{addr}/%2f");
    let routing_key = format!("{}.{{event_type}}", exchange.prefix);
    let env = [
        ("OUTBOX_FORWARD_TO", url.as_str()),
        ("OUTBOX_FORWARD_EXCHANGE", &exchange.name),
        ("OUTBOX_FORWARD_DESTINATION", &routing_key),
    ];

    let output = forward(&pool, &env).wait_with_output().unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    let cause = format!("exchange `{}`: cannot connect to the broker", exchange.name);
    assert!(stderr.contains(&cause), "{stderr}");
    assert!(stderr.contains("UnknownIssuer"), "says why the certificate is refused: {stderr}");
    assert!(!stderr.contains("guest:guest"), "the URL is never printed: {stderr}");
    assert_eq!(published(&pool).await, 0);

    let ca = certs.ca().display().to_string();
    let summary = forward_all(&pool, &[&env[..], &[("SSL_CERT_FILE", &ca)]].concat(), 3).await;
    assert_eq!(summary["forwarded"], 3);
    let mut received: Vec<Uuid> = exchange
        .messages()
        .await
        .iter()
        .map(|message| message.message_id.as_deref().unwrap().parse().unwrap())
        .collect();
    received.sort();
    ids.sort();
    assert_eq!(received, ids, "every event once, over TLS");
}

/// A nats-server of the test's own with JetStream, plain TCP, that takes only the clients its
/// configuration admits; killed, and its files removed, when dropped.
struct AuthNats {
    addr: String,
    _server: Spawned,
    /// Its configuration and streams; removed after the server is killed (fields drop in order).
    _dir: Scratch,
}

/// A directory of a test's own, removed when dropped.
struct Scratch(std::path::PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl AuthNats {
    /// A server admitting whom `authorization` (the block's contents) admits.
    async fn start(authorization: &str) -> AuthNats {
        AuthNats::start_with(&format!("authorization {{ {authorization} }}\n")).await
    }

    /// A server whose configuration ends with `auth` (an authorization block, an operator).
    async fn start_with(auth: &str) -> AuthNats {
        let addr = free_address();
        let dir = Scratch(std::env::temp_dir().join(format!("outbox-nats-{}", Uuid::new_v4())));
        std::fs::create_dir(&dir.0).unwrap();
        let (config, store) = (dir.0.join("nats.conf"), dir.0.join("jetstream"));
        let text = format!("listen: {addr}\njetstream {{ store_dir: {store:?} }}\n{auth}");
        std::fs::write(&config, text).unwrap();
        let mut server = Command::new("nats-server");
        server.arg("-c").arg(&config);
        let server = Spawned::listening_on(&addr, [server]).await;
        AuthNats { addr, _server: server, _dir: dir }
    }

    /// Creates the stream `EVENTS` on `events.>` through `client`.
    async fn stream(client: async_nats::Client) -> async_nats::jetstream::stream::Stream {
        let jetstream = async_nats::jetstream::new(client);
        let stream = async_nats::jetstream::stream::Config {
            name: "EVENTS".into(),
            subjects: vec!["events.>".into()],
            ..Default::default()
        };
        jetstream.create_stream(stream).await.unwrap()
    }
}

/// The daemon's flags for JetStream at `addr`, stream `EVENTS`, plus `extra`.
fn nats_env<'a>(to: &'a str, extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let base = [
        ("OUTBOX_FORWARD_TO", to),
        ("OUTBOX_FORWARD_STREAM", "EVENTS"),
        ("OUTBOX_FORWARD_DESTINATION", "events.{event_type}"),
    ];
    [&base[..], extra].concat()
}

/// Runs the daemon with `env`, which the server must refuse: it stops at start naming the server,
/// printing no `secret`, having published nothing.
async fn refused_at_start(pool: &PgPool, env: &[(&str, &str)], addr: &str, secret: &str) {
    let output = forward(pool, env).wait_with_output().unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&format!("cannot reach the broker at {addr}")), "{stderr}");
    assert!(!stderr.contains(secret), "no credential is printed: {stderr}");
    assert_eq!(published(pool).await, 0);
}

/// `--nats-nkey`: a server that admits one user by its public nkey refuses another seed at
/// start, without printing it, and takes every event from the user's seed.
#[sqlx::test(migrations = false)]
async fn forward_authenticates_to_nats_with_an_nkey(pool: PgPool) {
    migrated(&pool).await;
    let (user, stranger) = (nkeys::KeyPair::new_user(), nkeys::KeyPair::new_user());
    let users = format!("users = [ {{ nkey: {} }} ]", user.public_key());
    let nats = AuthNats::start(&users).await;
    let seed = user.seed().unwrap();
    let client = async_nats::ConnectOptions::with_nkey(seed.clone()).connect(&nats.addr).await;
    let mut stream = AuthNats::stream(client.unwrap()).await;
    emit_committed(&pool, &(0..3).map(|order_id| OrderPlaced { order_id }).collect::<Vec<_>>())
        .await;
    let to = format!("nats://{}", nats.addr);

    let wrong = stranger.seed().unwrap();
    let env = nats_env(&to, &[("OUTBOX_FORWARD_NATS_NKEY", &wrong)]);
    refused_at_start(&pool, &env, &nats.addr, &wrong).await;

    let summary =
        forward_all(&pool, &nats_env(&to, &[("OUTBOX_FORWARD_NATS_NKEY", &seed)]), 3).await;
    assert_eq!(summary["forwarded"], 3);
    assert_eq!(stream.info().await.unwrap().state.messages, 3);
}

/// `nats://token@host`: a server that admits one token refuses another at start, without
/// printing it, and takes every event with its own.
#[sqlx::test(migrations = false)]
async fn forward_authenticates_to_nats_with_a_token(pool: PgPool) {
    migrated(&pool).await;
    let token = format!("t{}", Uuid::new_v4().simple());
    let nats = AuthNats::start(&format!("token: {token}")).await;
    let client = async_nats::ConnectOptions::with_token(token.clone()).connect(&nats.addr).await;
    let mut stream = AuthNats::stream(client.unwrap()).await;
    emit_committed(&pool, &(0..3).map(|order_id| OrderPlaced { order_id }).collect::<Vec<_>>())
        .await;

    let wrong = format!("nats://not{token}@{}", nats.addr);
    refused_at_start(&pool, &nats_env(&wrong, &[]), &nats.addr, &format!("not{token}")).await;

    let to = format!("nats://{token}@{}", nats.addr);
    let summary = forward_all(&pool, &nats_env(&to, &[]), 3).await;
    assert_eq!(summary["forwarded"], 3);
    assert_eq!(stream.info().await.unwrap().state.messages, 3);
}

/// A JSON web token of the kind NATS decentralised auth reads: `claims` under NATS's header,
/// signed with `issuer`'s key (which the claims name as `iss`).
fn nats_jwt(issuer: &nkeys::KeyPair, subject: &str, nats: serde_json::Value) -> String {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine;
    let claims = serde_json::json!({
        "jti": Uuid::new_v4().simple().to_string(),
        "iat": 1_700_000_000,
        "iss": issuer.public_key(),
        "name": subject,
        "sub": subject,
        "nats": nats,
    });
    let header = URL_SAFE_NO_PAD.encode(r#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
    let signed = format!("{header}.{}", URL_SAFE_NO_PAD.encode(claims.to_string()));
    let signature = issuer.sign(signed.as_bytes()).unwrap();
    format!("{signed}.{}", URL_SAFE_NO_PAD.encode(signature))
}

/// `--nats-creds`: an operator of the test's own trusts one account (with JetStream), whose
/// user's credentials file, as `nsc` writes it, takes every event; a user the account never
/// signed is refused at start without its seed printed.
#[sqlx::test(migrations = false)]
async fn forward_authenticates_to_nats_with_a_credentials_file(pool: PgPool) {
    migrated(&pool).await;
    let operator = nkeys::KeyPair::new_operator();
    // JetStream needs the server's own system account beside the users'.
    let (account, system) = (nkeys::KeyPair::new_account(), nkeys::KeyPair::new_account());
    let operator_jwt = nats_jwt(
        &operator,
        &operator.public_key(),
        serde_json::json!({ "type": "operator", "version": 2 }),
    );
    let unlimited = serde_json::json!({
        "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
        "wildcards": true, "conn": -1, "leaf": -1,
        "mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1,
    });
    let account_jwt = |account: &nkeys::KeyPair, limits: &serde_json::Value| {
        let claims = serde_json::json!({ "type": "account", "version": 2, "limits": limits });
        nats_jwt(&operator, &account.public_key(), claims)
    };
    let system_limits = serde_json::json!({ "subs": -1, "data": -1, "payload": -1, "conn": -1 });
    let nats = AuthNats::start_with(&format!(
        "operator: \"{operator_jwt}\"\nsystem_account: {system}\nresolver: MEMORY\n\
         resolver_preload: {{ {account}: \"{}\", {system}: \"{}\" }}\n",
        account_jwt(&account, &unlimited),
        account_jwt(&system, &system_limits),
        account = account.public_key(),
        system = system.public_key(),
    ))
    .await;
    let dir = Scratch(std::env::temp_dir().join(format!("outbox-creds-{}", Uuid::new_v4())));
    std::fs::create_dir(&dir.0).unwrap();
    // A user signed by the account, and a user signed by a key the operator never trusted.
    let creds = |signer: &nkeys::KeyPair, name: &str| {
        let user = nkeys::KeyPair::new_user();
        let user_claims = serde_json::json!({
            "type": "user", "version": 2, "pub": {}, "sub": {},
            "subs": -1, "data": -1, "payload": -1,
        });
        let jwt = nats_jwt(signer, &user.public_key(), user_claims);
        let seed = user.seed().unwrap();
        let path = dir.0.join(name);
        std::fs::write(
            &path,
            format!(
                "-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n\
                 -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n"
            ),
        )
        .unwrap();
        (path, seed)
    };
    let (trusted, _) = creds(&account, "trusted.creds");
    let (stranger, stranger_seed) = creds(&nkeys::KeyPair::new_account(), "stranger.creds");
    let client = async_nats::ConnectOptions::with_credentials_file(&trusted).await.unwrap();
    let mut stream = AuthNats::stream(client.connect(&nats.addr).await.unwrap()).await;
    emit_committed(&pool, &(0..3).map(|order_id| OrderPlaced { order_id }).collect::<Vec<_>>())
        .await;
    let to = format!("nats://{}", nats.addr);

    let stranger = stranger.display().to_string();
    let env = nats_env(&to, &[("OUTBOX_FORWARD_NATS_CREDS", &stranger)]);
    refused_at_start(&pool, &env, &nats.addr, &stranger_seed).await;

    let trusted = trusted.display().to_string();
    let summary =
        forward_all(&pool, &nats_env(&to, &[("OUTBOX_FORWARD_NATS_CREDS", &trusted)]), 3).await;
    assert_eq!(summary["forwarded"], 3);
    assert_eq!(stream.info().await.unwrap().state.messages, 3);
}
