//! `inbox-process-kafka` (work in progress).

fn main() {}
