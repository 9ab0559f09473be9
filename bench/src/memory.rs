//! Peak memory of a relay process draining a large backlog, measured in a child process so
//! the figure is the relay's alone.

use std::process::Command;

use crate::relay::{drain, Setup};

/// The child: drains `events` events from `url` with one relay, then prints its peak RSS.
pub async fn child(url: &str, events: usize) {
    let pool = sqlx::PgPool::connect(url).await.unwrap();
    let setup = Setup::new(1, 16);
    let rate = drain(&pool, events, setup).await.events_per_second;
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let peak_kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    println!("{peak_kib} {rate}");
}

/// Runs the child against `url`; returns (peak RSS in MiB, events/s).
pub fn measure(url: &str, events: usize) -> (f64, f64) {
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(exe)
        .args(["--child-drain", url, &events.to_string()])
        .output()
        .expect("run the child relay");
    assert!(out.status.success(), "child failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let mut parts = text.split_whitespace().map(|p| p.parse::<f64>().unwrap());
    let (peak_kib, rate) = (parts.next().unwrap(), parts.next().unwrap());
    (peak_kib / 1024.0, rate)
}
