//! Faults injected into a handler: failures, panics and delays, with its calls counted.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::future::BoxFuture;
use uuid::Uuid;

use crate::error::BoxError;
use crate::relay::{EventContext, TransactionContext};

/// Injects failures, panics and delays into the handlers it [wraps](Faults::wrap), and counts
/// their calls.
///
/// The faults are a script that every event goes through on its own, so the outcome of each
/// event does not depend on the order the relay happens to deliver them in: with
/// `fail_first(2)` each event's first two calls fail and its third reaches the handler.
/// Scripted faults apply in the order they were added: `panic_first(1).fail_first(2)` panics on
/// an event's first call and fails its second and third.
///
/// ```
/// use std::time::Duration;
/// use outbox_runtime::testing::Faults;
///
/// // Each event: a panic, then two failures, then the handler; every call 50 ms late.
/// let faults = Faults::new().panic_first(1).fail_first(2).delay(Duration::from_millis(50));
/// ```
///
/// Clones share their counts: keep one to assert on after the relay ran.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    script: Script,
    calls: Arc<Mutex<Calls>>,
}

/// What to do on each call of an event.
#[derive(Debug, Clone, Default)]
struct Script {
    /// Runs of faults for an event's first calls, in order.
    first: Vec<(Fault, u32)>,
    /// The fault of every call after those, if any.
    then: Option<Fault>,
    delay: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    Fail,
    Panic,
}

impl Script {
    /// The fault of an event's `call`-th call (from 1).
    fn fault(&self, call: u32) -> Option<Fault> {
        let mut before = 0_u32;
        for &(fault, calls) in &self.first {
            before = before.saturating_add(calls);
            if call <= before {
                return Some(fault);
            }
        }
        self.then
    }
}

#[derive(Debug, Default)]
struct Calls {
    by_event: HashMap<Uuid, u32>,
    total: u32,
    handled: u32,
}

impl Faults {
    /// No faults: every call goes to the handler, and is counted.
    pub fn new() -> Self {
        Self::default()
    }

    /// Each event's next `calls` calls (after those already scripted) fail with an
    /// [`InjectedFailure`], without calling the handler.
    pub fn fail_first(mut self, calls: u32) -> Self {
        self.script.first.push((Fault::Fail, calls));
        self
    }

    /// Each event's next `calls` calls (after those already scripted) panic, without calling
    /// the handler. The relay records a panic as a failed delivery,
    /// `handler panicked: injected panic (call N)`.
    pub fn panic_first(mut self, calls: u32) -> Self {
        self.script.first.push((Fault::Panic, calls));
        self
    }

    /// Every call after the scripted ones fails with an [`InjectedFailure`]: the handler is
    /// never called, and the event ends dead after the relay's `max_attempts`.
    pub fn fail_always(mut self) -> Self {
        self.script.then = Some(Fault::Fail);
        self
    }

    /// Every call waits `delay` first, inside the delivery: the relay's `handler_timeout`
    /// counts it, and shutdown waits for it.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.script.delay = delay;
        self
    }

    /// Calls so far, of every event, faulted or not.
    pub fn calls(&self) -> u32 {
        self.lock().total
    }

    /// Calls so far of the event with this id.
    pub fn calls_for(&self, event_id: Uuid) -> u32 {
        self.lock().by_event.get(&event_id).copied().unwrap_or(0)
    }

    /// Calls that reached the handler (no fault injected), of every event.
    pub fn handler_calls(&self) -> u32 {
        self.lock().handled
    }

    /// `handler` with these faults injected, as a handler of the same context and event types:
    /// it registers with [`RelayBuilder::handler`](crate::RelayBuilder::handler) just like
    /// `handler`, plain or transactional.
    ///
    /// The script is taken as it is now: changing this `Faults` afterwards changes handlers
    /// wrapped afterwards. The counts are shared by every handler it wraps.
    pub fn wrap<H, C, E, Fut, Err>(
        &self,
        handler: H,
    ) -> impl Fn(C, E) -> BoxFuture<'static, Result<(), BoxError>> + Clone + Send + Sync + 'static
    where
        H: Fn(C, E) -> Fut + Clone + Send + Sync + 'static,
        C: DeliveryContext,
        E: Send + 'static,
        Fut: Future<Output = Result<(), Err>> + Send + 'static,
        Err: Into<BoxError>,
    {
        let Faults { script, calls } = self.clone();
        move |ctx: C, event: E| {
            let call = start(&calls, ctx.event_id());
            let (fault, delay) = (script.fault(call), script.delay);
            let (handler, calls) = (handler.clone(), calls.clone());
            Box::pin(async move {
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                match fault {
                    Some(Fault::Fail) => Err(Box::new(InjectedFailure { call }) as BoxError),
                    Some(Fault::Panic) => panic!("injected panic (call {call})"),
                    None => {
                        lock(&calls).handled += 1;
                        handler(ctx, event).await.map_err(Into::into)
                    }
                }
            })
        }
    }

    fn lock(&self) -> MutexGuard<'_, Calls> {
        lock(&self.calls)
    }
}

/// Counts a call of `event_id`; returns its number among that event's calls, from 1.
fn start(calls: &Mutex<Calls>, event_id: Uuid) -> u32 {
    let mut calls = lock(calls);
    calls.total += 1;
    let call = calls.by_event.entry(event_id).or_default();
    *call += 1;
    *call
}

fn lock(calls: &Mutex<Calls>) -> MutexGuard<'_, Calls> {
    // Nothing panics while holding the lock; were it to, the counts would still be whole.
    calls.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The error of a call that [`Faults`] made fail.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("injected failure (call {call})")]
pub struct InjectedFailure {
    call: u32,
}

impl InjectedFailure {
    /// Which call of its event failed, from 1.
    pub fn call(&self) -> u32 {
        self.call
    }
}

/// A handler's context, as [`Faults`] reads it: which event is being delivered.
/// Implemented for [`EventContext`] and [`TransactionContext`], the two a handler takes.
pub trait DeliveryContext: Send + 'static + sealed::Sealed {
    /// The id of the event being delivered.
    fn event_id(&self) -> Uuid;
}

impl<S: Send + 'static> DeliveryContext for EventContext<S> {
    fn event_id(&self) -> Uuid {
        EventContext::event_id(self)
    }
}

impl<S: Send + 'static> DeliveryContext for TransactionContext<S> {
    fn event_id(&self) -> Uuid {
        EventContext::event_id(self)
    }
}

mod sealed {
    pub trait Sealed {}
    impl<S> Sealed for crate::EventContext<S> {}
    impl<S> Sealed for crate::TransactionContext<S> {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripted_faults_apply_in_the_order_added_then_the_rest() {
        let faults = Faults::new().panic_first(1).fail_first(2);
        let calls: Vec<_> = (1..=5).map(|call| faults.script.fault(call)).collect();
        let (p, f) = (Some(Fault::Panic), Some(Fault::Fail));
        assert_eq!(calls, [p, f, f, None, None]);

        let always = Faults::new().fail_first(1).panic_first(u32::MAX).fail_always();
        assert_eq!(always.script.fault(1), f);
        assert_eq!(always.script.fault(u32::MAX), p, "runs add up without overflowing");
        assert_eq!(Faults::new().fail_always().script.fault(7), f);
    }
}
