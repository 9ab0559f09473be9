//! `inbox-process-rabbitmq` (work in progress).

fn main() {}
