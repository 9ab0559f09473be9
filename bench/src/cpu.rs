//! CPU time, from `/proc/stat`: what a workload cost every process on the machine (the relay,
//! PostgreSQL, the broker), and from `/proc/self/stat` what of it the bench's own process spent
//! (an in-process relay, the clients).

/// The machine's and this process's CPU counters at one instant, in clock ticks.
pub struct Cpu {
    busy: u64,
    total: u64,
    own: u64,
}

/// CPU spent between two readings.
pub struct Spent {
    /// CPU seconds spent busy (user, system, interrupts), every core added up.
    pub busy_secs: f64,
    /// The share of the machine's cores that was busy, 0 to 1.
    pub utilization: f64,
    /// CPU seconds this process spent, user and system, every thread added up.
    pub own_secs: f64,
}

/// Clock ticks this process has spent so far, user and system.
fn own_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat is readable");
    // The command name, field 2, is in parentheses and may hold spaces: count from after it.
    let after_name = &stat[stat.rfind(')').expect("a command name") + 2..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // utime and stime are fields 14 and 15, the 12th and 13th after the name.
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// Clock ticks per second in `/proc/stat` (`USER_HZ`, 100 on every Linux the bench runs on).
const TICKS_PER_SECOND: f64 = 100.0;

impl Cpu {
    pub fn now() -> Cpu {
        let stat = std::fs::read_to_string("/proc/stat").expect("/proc/stat is readable");
        // cpu  user nice system idle iowait irq softirq steal ...
        let ticks: Vec<u64> = stat
            .lines()
            .next()
            .unwrap()
            .split_whitespace()
            .skip(1)
            .take(8)
            .map(|field| field.parse().unwrap())
            .collect();
        let idle = ticks[3] + ticks[4];
        let total: u64 = ticks.iter().sum();
        Cpu { busy: total - idle, total, own: own_ticks() }
    }

    pub fn since(&self) -> Spent {
        let now = Cpu::now();
        let (busy, total) = (now.busy - self.busy, now.total - self.total);
        Spent {
            busy_secs: busy as f64 / TICKS_PER_SECOND,
            utilization: busy as f64 / total.max(1) as f64,
            own_secs: (now.own - self.own) as f64 / TICKS_PER_SECOND,
        }
    }
}
