//! `inbox-process-redis` (work in progress).

fn main() {}
