//! A TCP proxy the tests cut and restore, to take a server away from a client and give it
//! back while the shared server itself stays up.
//!
//! While cut, the proxy drops every connection it carries (both ends) and closes each new one
//! as soon as it is accepted, so a client sees its connection end and its reconnection
//! attempts fail at once. A connection is cut even if the proxy is restored before its task
//! noticed: each connection remembers the cut count it started under.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tokio::io::copy_bidirectional;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Whether the proxy carries connections, and how many times it was cut so far.
#[derive(Debug, Clone, Copy)]
struct State {
    up: bool,
    cuts: u64,
}

/// A TCP proxy on `127.0.0.1` to one target address.
pub struct Proxy {
    port: u16,
    state: watch::Sender<State>,
    carried: Arc<AtomicUsize>,
}

impl Proxy {
    /// A proxy to `target` (`host:port`), up.
    pub async fn start(target: impl Into<String>) -> Proxy {
        let target = target.into();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (state, _) = watch::channel(State { up: true, cuts: 0 });
        let carried = Arc::new(AtomicUsize::new(0));
        let (watched, counted) = (state.subscribe(), carried.clone());
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else { return };
                let mut state = watched.clone();
                let started = *state.borrow_and_update();
                if !started.up {
                    drop(client); // refused while cut
                    continue;
                }
                let (target, counted) = (target.clone(), counted.clone());
                tokio::spawn(async move {
                    let cut = |now: &State| now.cuts != started.cuts;
                    let Ok(mut server) = TcpStream::connect(&target).await else { return };
                    if cut(&state.borrow()) {
                        return; // cut while connecting: drop both ends
                    }
                    counted.fetch_add(1, Ordering::Relaxed);
                    let mut client = client;
                    tokio::select! {
                        _ = copy_bidirectional(&mut client, &mut server) => {}
                        _ = state.wait_for(cut) => {} // cut: drop both ends
                    }
                });
            }
        });
        Proxy { port, state, carried }
    }

    /// A proxy to the PostgreSQL server behind `pool`.
    pub async fn to_database(pool: &PgPool) -> Proxy {
        let options = pool.connect_options();
        Proxy::start(format!("{}:{}", options.get_host(), options.get_port())).await
    }

    /// The port the proxy listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:<port>`: the address a client connects to instead of the target's.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// How many connections the proxy carried to the target so far: more than one for a client
    /// that reconnected.
    pub fn carried(&self) -> usize {
        self.carried.load(Ordering::Relaxed)
    }

    /// Drops every connection and refuses new ones until `restore`.
    pub fn cut(&self) {
        self.state.send_modify(|state| {
            state.up = false;
            state.cuts += 1;
        });
    }

    /// Carries new connections again.
    pub fn restore(&self) {
        self.state.send_modify(|state| state.up = true);
    }

    /// A pool on the database behind `pool` whose connections go through the proxy.
    pub fn pool(&self, pool: &PgPool) -> PgPool {
        let options = (*pool.connect_options()).clone().port(self.port);
        PgPoolOptions::new().acquire_timeout(Duration::from_secs(2)).connect_lazy_with(options)
    }
}
