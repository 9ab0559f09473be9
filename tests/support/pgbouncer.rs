//! A PgBouncer of the test's own, in front of the PostgreSQL behind a test pool, and a router
//! that sends one named kind of connection through it and every other one straight through.
//!
//! PgBouncer is installed by `scripts/services-up` (Debian's is 1.18). Each
//! instance listens on a free port of its own, with its configuration in a temporary directory
//! of its own, and forwards any database name (`* =`), so the per-test databases of
//! `#[sqlx::test]` need no entry. Dropping it kills the process, which closes its server
//! connections before the test database is dropped.

use std::collections::HashMap;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use tokio::io::{copy_bidirectional, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use uuid::Uuid;

/// How PgBouncer lends its server connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolMode {
    /// A server connection per transaction: session state, LISTEN and named prepared
    /// statements do not survive it.
    Transaction,
    /// A server connection per client connection, for the client's lifetime.
    Session,
}

impl PoolMode {
    fn name(self) -> &'static str {
        match self {
            PoolMode::Transaction => "transaction",
            PoolMode::Session => "session",
        }
    }

    /// Few server connections in transaction mode, so concurrent clients share them; enough in
    /// session mode for a relay's six connections, its start-up check and the test's own.
    fn default_servers(self) -> usize {
        match self {
            PoolMode::Transaction => 4,
            PoolMode::Session => 30,
        }
    }
}

/// A running PgBouncer; killed when dropped.
pub struct PgBouncer {
    pub port: u16,
    process: Child,
    dir: PathBuf,
}

impl PgBouncer {
    /// A PgBouncer in `mode` in front of the server behind `pool`, up and accepting connections.
    pub async fn start(pool: &PgPool, mode: PoolMode) -> PgBouncer {
        PgBouncer::start_with(pool, mode, mode.default_servers()).await
    }

    /// [`PgBouncer::start`] with at most `servers` server connections per database and user.
    pub async fn start_with(pool: &PgPool, mode: PoolMode, servers: usize) -> PgBouncer {
        require_installed();
        let options = pool.connect_options();
        let dir = std::env::temp_dir().join(format!("outbox-pgbouncer-{}", Uuid::new_v4()));
        // Readable by the user PgBouncer runs as (see `command`).
        std::fs::DirBuilder::new().mode(0o755).create(&dir).unwrap();
        std::fs::write(dir.join("users.txt"), format!("\"{}\" \"\"\n", options.get_username()))
            .unwrap();
        // The port is free when asked, but another process may take it before PgBouncer
        // binds it: then PgBouncer exits, and it is tried again on another.
        for _ in 0..5 {
            let port = free_port();
            let config = dir.join("pgbouncer.ini");
            std::fs::write(
                &config,
                format!(
                    "[databases]\n\
                     * = host={host} port={target}\n\
                     [pgbouncer]\n\
                     listen_addr = 127.0.0.1\n\
                     listen_port = {port}\n\
                     unix_socket_dir =\n\
                     auth_type = trust\n\
                     auth_file = {users}\n\
                     pool_mode = {mode}\n\
                     default_pool_size = {size}\n\
                     max_client_conn = 500\n",
                    host = options.get_host(),
                    target = options.get_port(),
                    users = dir.join("users.txt").display(),
                    mode = mode.name(),
                    size = servers,
                ),
            )
            .unwrap();
            let log = dir.join("pgbouncer.log");
            let process = command(&config)
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .expect("pgbouncer starts");
            let mut bouncer = PgBouncer { port, process, dir: dir.clone() };
            if bouncer.accepting().await {
                return bouncer;
            }
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            assert!(log.contains("in use"), "pgbouncer did not start:\n{log}");
        }
        panic!("pgbouncer found no free port in five tries");
    }

    /// Whether it accepts connections, within 10 s; false if it exited.
    async fn accepting(&mut self) -> bool {
        for _ in 0..500 {
            if self.process.try_wait().unwrap().is_some() {
                return false;
            }
            if TcpStream::connect(("127.0.0.1", self.port)).await.is_ok() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("pgbouncer does not accept connections on port {} after 10 s", self.port);
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `pool`'s connect options, through this PgBouncer. Without the startup parameter
    /// `extra_float_digits`, which sqlx sends by default and PgBouncer refuses
    /// (`unsupported startup parameter`) unless told to ignore it.
    pub fn options(&self, pool: &PgPool) -> PgConnectOptions {
        (*pool.connect_options()).clone().host("127.0.0.1").port(self.port).extra_float_digits(None)
    }

    /// A pool of up to `connections` through this PgBouncer, with [`PgBouncer::options`].
    pub fn pool(&self, pool: &PgPool, connections: u32) -> PgPool {
        PgPoolOptions::new()
            .max_connections(connections)
            .acquire_timeout(Duration::from_secs(10))
            .connect_lazy_with(self.options(pool))
    }

    /// What PgBouncer logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// PgBouncer refuses to run as root: as root, it is told to switch to the `postgres` user,
/// whom every machine running the tests has (the PostgreSQL packages create it).
fn command(config: &Path) -> Command {
    let mut command = Command::new(binary().expect("pgbouncer is installed"));
    let root = std::fs::metadata("/proc/self").map(|me| me.uid() == 0).unwrap_or(false);
    if root {
        command.args(["-u", "postgres"]);
    }
    command.arg(config);
    command
}

fn binary() -> Option<PathBuf> {
    let found = Command::new("which").arg("pgbouncer").output().ok()?;
    let path = String::from_utf8(found.stdout).ok()?;
    let path = path.trim();
    if found.status.success() && !path.is_empty() {
        return Some(PathBuf::from(path));
    }
    // Not on a non-root PATH.
    let sbin = PathBuf::from("/usr/sbin/pgbouncer");
    sbin.exists().then_some(sbin)
}

/// Panics saying how to install PgBouncer if it is missing: `scripts/services-up` installs it
/// (tests install nothing themselves).
fn require_installed() {
    if binary().is_none() {
        panic!("pgbouncer is not installed; run scripts/services-up");
    }
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// A TCP proxy that reads each PostgreSQL connection's startup message and sends the
/// connections whose `application_name` is `name` to one address, every other to another.
/// It declines TLS (the tests connect without).
pub struct Router {
    pub port: u16,
    /// How many connections went each way, by target address.
    routed: Arc<Mutex<HashMap<String, usize>>>,
}

/// The protocol's codes for the requests to encrypt.
const SSL_REQUEST: u32 = 80_877_103;
const GSS_REQUEST: u32 = 80_877_104;

impl Router {
    pub async fn start(name: &str, named: String, others: String) -> Router {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let routed = Arc::new(Mutex::new(HashMap::new()));
        let (name, counted) = (name.to_owned(), routed.clone());
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else { return };
                let (name, named, others) = (name.clone(), named.clone(), others.clone());
                let counted = counted.clone();
                tokio::spawn(async move {
                    let mut client = client;
                    let Some(startup) = read_startup(&mut client).await else { return };
                    let target = if application_name(&startup).as_deref() == Some(name.as_str()) {
                        named
                    } else {
                        others
                    };
                    *counted.lock().unwrap().entry(target.clone()).or_default() += 1;
                    let Ok(mut server) = TcpStream::connect(&target).await else { return };
                    if server.write_all(&startup).await.is_err() {
                        return;
                    }
                    let _ = copy_bidirectional(&mut client, &mut server).await;
                });
            }
        });
        Router { port, routed }
    }

    /// How many connections went to `target` so far.
    pub fn routed_to(&self, target: &str) -> usize {
        self.routed.lock().unwrap().get(target).copied().unwrap_or(0)
    }

    /// `pool`'s connect options, through this router (and without `extra_float_digits`, for a
    /// PgBouncer behind it).
    pub fn options(&self, pool: &PgPool) -> PgConnectOptions {
        (*pool.connect_options()).clone().host("127.0.0.1").port(self.port).extra_float_digits(None)
    }
}

/// The client's startup (or cancel) message, whole, after declining any encryption request.
async fn read_startup(client: &mut TcpStream) -> Option<Vec<u8>> {
    loop {
        let length = client.read_u32().await.ok()?;
        let mut message = length.to_be_bytes().to_vec();
        message.resize(usize::try_from(length).ok()?, 0);
        client.read_exact(&mut message[4..]).await.ok()?;
        let code = u32::from_be_bytes(message.get(4..8)?.try_into().ok()?);
        match code {
            SSL_REQUEST | GSS_REQUEST => client.write_all(b"N").await.ok()?,
            _ => return Some(message),
        }
    }
}

/// The `application_name` of a startup message: after the length and the protocol version,
/// NUL-terminated names and values, then a NUL.
fn application_name(startup: &[u8]) -> Option<String> {
    let mut fields = startup.get(8..)?.split(|&b| b == 0);
    while let (Some(name), Some(value)) = (fields.next(), fields.next()) {
        if name == b"application_name" {
            return String::from_utf8(value.to_vec()).ok();
        }
    }
    None
}
