//! A `metrics` recorder that keeps every counter increment, for the tests of what the runtime
//! counts.

use std::sync::{Arc, Mutex};

/// One counter increment: `(name, labels as "k=v" sorted, value)`.
pub type Increment = (String, Vec<String>, u64);

/// Every counter increment.
#[derive(Clone, Default)]
pub struct Counted(Arc<Mutex<Vec<Increment>>>);

struct Increments(Counted, metrics::Key);

impl Counted {
    /// The increments so far.
    pub fn increments(&self) -> Vec<Increment> {
        self.0.lock().unwrap().clone()
    }
}

impl metrics::CounterFn for Increments {
    fn increment(&self, value: u64) {
        let mut labels: Vec<String> =
            self.1.labels().map(|l| format!("{}={}", l.key(), l.value())).collect();
        labels.sort();
        self.0 .0.lock().unwrap().push((self.1.name().to_owned(), labels, value));
    }

    fn absolute(&self, _: u64) {}
}

impl metrics::Recorder for Counted {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }

    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        metrics::Counter::from_arc(Arc::new(Increments(self.clone(), key.clone())))
    }

    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }

    fn register_histogram(
        &self,
        _: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        metrics::Histogram::noop()
    }
}
