//! The `relay-process` binary (`tests/bin/relay_process.rs`) run as a child process, for the
//! tests that stop, kill or signal a relay, and the event it handles.

use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use outbox_runtime::OutboxEvent;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use tokio::time::Instant;
use uuid::Uuid;

use super::database_url;

/// The event `relay-process` handles, declared the same there.
#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "job", event_type = "job.run")]
pub struct JobRun {
    #[outbox(id)]
    pub job: u64,
    pub n: u64,
}

/// A running `relay-process`, killed when dropped so a failing test leaves no relay behind.
/// Its stderr (warnings, and its counts at a graceful exit) goes to a file of its own.
pub struct RelayProcess {
    child: Child,
    log: PathBuf,
}

impl RelayProcess {
    pub fn spawn(pool: &PgPool, settings: &[(&str, &str)]) -> Self {
        Self::spawn_at(&database_url(pool), settings)
    }

    /// A relay on the database at `url`: PostgreSQL, SQLite or MySQL.
    pub fn spawn_at(url: &str, settings: &[(&str, &str)]) -> Self {
        let log = std::env::temp_dir().join(format!("relay-process-{}.log", Uuid::new_v4()));
        let child = Command::new(env!("CARGO_BIN_EXE_relay-process"))
            .arg(url)
            .envs(settings.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&log).expect("the relay's log file is created"))
            .spawn()
            .expect("relay-process starts");
        RelayProcess { child, log }
    }

    /// What the relay wrote to stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Resident memory in KiB (`VmRSS` in `/proc/<pid>/status`).
    pub fn rss_kib(&self) -> u64 {
        let pid = self.pid();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_else(|error| panic!("relay-process {pid} is gone: {error}"));
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|value| value.trim().strip_suffix("kB"))
            .and_then(|kib| kib.trim().parse().ok())
            .unwrap_or_else(|| panic!("no VmRSS for relay-process {pid}"))
    }

    /// Sends `signal` (`-STOP`, `-CONT`, ...) with `kill`.
    pub fn signal(&self, signal: &str) {
        let pid = self.pid().to_string();
        let sent = Command::new("kill").args([signal, &pid]).status().unwrap();
        assert!(sent.success(), "kill {signal} {pid}");
    }

    /// SIGKILL, then reap; returns the relay's log.
    pub fn kill(mut self) -> String {
        self.child.kill().expect("SIGKILL is delivered");
        self.child.wait().expect("the killed relay is reaped");
        self.log()
    }

    /// SIGTERM; waits for a graceful exit and returns what the relay reported, and its log.
    pub async fn terminate(mut self) -> (Counts, String) {
        let pid = self.pid();
        let sent = Command::new("kill").args(["-TERM", &pid.to_string()]).status().unwrap();
        assert!(sent.success(), "kill -TERM {pid}");
        let deadline = Instant::now() + Duration::from_secs(30);
        let exit = loop {
            if let Some(exit) = self.child.try_wait().unwrap() {
                break exit;
            }
            assert!(Instant::now() < deadline, "relay-process {pid} ignored SIGTERM for 30 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let log = self.log();
        assert!(exit.success(), "relay-process {pid} exited with {exit}: {log}");
        (Counts::parse(&log), log)
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_file(&self.log);
    }
}

/// The counts a relay prints when it stops gracefully.
#[derive(Debug, Default)]
pub struct Counts {
    pub delivered: u64,
    pub failed: u64,
    pub lost_leases: u64,
}

impl Counts {
    pub fn parse(stderr: &str) -> Self {
        let line = stderr
            .lines()
            .find(|line| line.contains(" stopped: "))
            .unwrap_or_else(|| panic!("no counts from relay-process: {stderr}"));
        let mut counts = Counts::default();
        for pair in line.split_whitespace() {
            let Some((key, value)) = pair.split_once('=') else { continue };
            let value = value.parse().unwrap();
            match key {
                "delivered" => counts.delivered = value,
                "failed" => counts.failed = value,
                "lost_leases" => counts.lost_leases = value,
                _ => {}
            }
        }
        counts
    }
}
