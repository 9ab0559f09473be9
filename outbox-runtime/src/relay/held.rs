//! The leases a relay holds, from the lease statement to the acknowledgement.
//!
//! Every leased row has one entry here, from the moment the lease returns it until the
//! acknowledger has written its outcome (or given up writing it). While the entry lives,
//! `renewals.rs` renews the row's lease, and the entry's deadline says until when the lease is
//! certainly valid: the send time of the last statement that confirmed it, plus the lease
//! timeout (the database counts from that statement's start, which is later).
//!
//! A row is always in exactly one of three places: queued to start, being delivered, or
//! waiting for its acknowledgement. A queued row whose deadline passed is not started but
//! handed back; a delivery whose deadline passes is cancelled and its row handed back: so no
//! other relay ever delivers a row while this one still does, and no row stays held without
//! being delivered.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use uuid::Uuid;

/// Every lease this relay holds; cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Held(Arc<Shared>);

/// How many rows every [`Held`] of one relay holds together (the held-transaction mode has one
/// per batch), for the relay's heartbeat; kept by the `Held`s, read here.
#[derive(Debug, Clone, Default)]
pub(crate) struct HeldRows(Arc<AtomicUsize>);

impl HeldRows {
    pub(crate) fn get(&self) -> usize {
        self.0.load(SeqCst)
    }
}

#[derive(Debug)]
struct Shared {
    leases: Mutex<HashMap<Uuid, Entry>>,
    /// Signalled whenever entries leave, so a relay holding its limit can lease again.
    settled: Notify,
    /// Lease statements under way whose rows are not recorded yet (see [`Held::leasing`]).
    leasing: AtomicUsize,
    /// Counts the entries of `leases`, with those of the relay's other `Held`s.
    rows: HeldRows,
}

impl Drop for Shared {
    fn drop(&mut self) {
        let left =
            self.leases.get_mut().map_or_else(|poisoned| poisoned.into_inner().len(), |l| l.len());
        self.rows.0.fetch_sub(left, SeqCst);
    }
}

#[derive(Debug)]
struct Entry {
    /// The row's current lease token. It changes only if this relay leased the row again
    /// after its previous lease expired (renewals held up): the delivery or acknowledgement
    /// under way then goes on under the new lease.
    token: Uuid,
    /// Until when the lease is certainly valid; deliveries watch it.
    deadline: watch::Sender<Instant>,
    /// A transactional handler's transaction has published the row and holds its lock until it
    /// commits: no other relay can lease it meanwhile, so the deadline no longer matters.
    committing: bool,
    finished: bool,
}

impl Entry {
    /// Moves the deadline to `deadline`, if that is later.
    fn extend(&self, deadline: Instant) {
        self.deadline.send_if_modified(|current| {
            let later = deadline > *current;
            if later {
                *current = deadline;
            }
            later
        });
    }
}

impl Held {
    /// An empty `Held` whose rows count in `rows`.
    pub(crate) fn new(rows: &HeldRows) -> Self {
        Held(Arc::new(Shared {
            leases: Mutex::default(),
            settled: Notify::new(),
            leasing: AtomicUsize::new(0),
            rows: rows.clone(),
        }))
    }

    /// Marks a lease statement under way until the guard drops, after its rows are recorded.
    /// Between the statement's commit and that, a held row this relay leased again has a new
    /// token in the database but not here yet: an acknowledgement refused meanwhile must not
    /// be taken for a lost lease (the row would be settled, then delivered a second time).
    pub(crate) fn leasing(&self) -> Leasing {
        self.0.leasing.fetch_add(1, SeqCst);
        Leasing(self.clone())
    }

    /// Whether a lease statement is under way (see [`Held::leasing`]).
    pub(crate) fn is_leasing(&self) -> bool {
        self.0.leasing.load(SeqCst) > 0
    }

    /// Records a lease valid until `deadline` (its statement's send time plus the lease
    /// timeout). Returns the lease to deliver under, or `None` if the row is already held here
    /// (its delivery or acknowledgement is under way, and goes on under the new token).
    pub(crate) fn lease(
        &self,
        event_id: Uuid,
        token: Uuid,
        deadline: Instant,
    ) -> Option<HeldLease> {
        let mut leases = self.lock();
        if let Some(entry) = leases.get_mut(&event_id) {
            entry.token = token;
            entry.deadline.send_replace(deadline);
            return None;
        }
        let (sender, receiver) = watch::channel(deadline);
        let entry = Entry { token, deadline: sender, committing: false, finished: false };
        leases.insert(event_id, entry);
        self.0.rows.0.fetch_add(1, SeqCst);
        Some(HeldLease { held: self.clone(), event_id, deadline: receiver })
    }

    /// How many rows are held, and how many of them wait for their acknowledgement.
    pub(crate) fn counts(&self) -> (usize, usize) {
        let leases = self.lock();
        (leases.len(), leases.values().filter(|entry| entry.finished).count())
    }

    /// Waits until some entry leaves.
    pub(crate) async fn settled(&self) {
        self.0.settled.notified().await;
    }

    /// The current token of a held row, if it is still held.
    pub(crate) fn token(&self, event_id: Uuid) -> Option<Uuid> {
        self.lock().get(&event_id).map(|entry| entry.token)
    }

    /// Stops holding rows whose outcome was written (or will never be).
    pub(crate) fn settle(&self, event_ids: impl IntoIterator<Item = Uuid>) {
        self.remove(event_ids);
    }

    /// Settles rows whose acknowledgement was written under the given tokens. Returns those this
    /// relay leased again while the statement ran, with their new tokens: the entry took the new
    /// token so that an acknowledgement still to be written would carry it, but this one was
    /// written under the old token, so the new lease has no delivery here and must be handed
    /// back (else the row waits out the lease). One lock, so a lease recorded later finds no
    /// entry and delivers the row anew.
    pub(crate) fn settle_written(
        &self,
        written: impl IntoIterator<Item = (Uuid, Uuid)>,
    ) -> Vec<(Uuid, Uuid)> {
        let written: HashMap<Uuid, Uuid> = written.into_iter().collect();
        let removed = self.remove(written.keys().copied());
        removed
            .into_iter()
            .filter(|(event_id, entry)| entry.token != written[event_id])
            .map(|(event_id, entry)| (event_id, entry.token))
            .collect()
    }

    /// Removes the entries of `event_ids` under one lock, and wakes whoever waits for one to
    /// leave; returns the entries removed.
    fn remove(&self, event_ids: impl IntoIterator<Item = Uuid>) -> Vec<(Uuid, Entry)> {
        let mut leases = self.lock();
        let removed: Vec<(Uuid, Entry)> = event_ids
            .into_iter()
            .filter_map(|event_id| leases.remove(&event_id).map(|entry| (event_id, entry)))
            .collect();
        self.0.rows.0.fetch_sub(removed.len(), SeqCst);
        drop(leases);
        self.0.settled.notify_waiters();
        removed
    }

    /// Every held row: the lease counts no expiry when it leases one of them again.
    pub(crate) fn ids(&self) -> Vec<Uuid> {
        self.lock().keys().copied().collect()
    }

    /// Every held row with its current token, for a renewal.
    pub(crate) fn tokens(&self) -> (Vec<Uuid>, Vec<Uuid>) {
        self.lock().iter().map(|(id, entry)| (*id, entry.token)).unzip()
    }

    /// Moves the deadlines of the `renewed` rows, renewed under `tokens`, to `deadline`, unless
    /// they were settled or leased again meanwhile.
    pub(crate) fn renewed(
        &self,
        renewed: &[Uuid],
        tokens: &HashMap<Uuid, Uuid>,
        deadline: Instant,
    ) {
        let leases = self.lock();
        for id in renewed {
            match leases.get(id) {
                Some(entry) if Some(&entry.token) == tokens.get(id) => entry.extend(deadline),
                _ => {} // settled or leased again meanwhile
            }
        }
    }

    /// Moves every deadline to `deadline`, if later (a held transaction answered: its locks
    /// hold until then).
    pub(crate) fn extend_all(&self, deadline: Instant) {
        for entry in self.lock().values() {
            entry.extend(deadline);
        }
    }

    /// Ends every lease now (a held transaction was lost, and its locks with it): deliveries
    /// under way are cancelled, queued ones do not start.
    pub(crate) fn expire_all(&self) {
        let now = Instant::now();
        for entry in self.lock().values() {
            entry.deadline.send_replace(now);
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Uuid, Entry>> {
        // Every operation leaves the map consistent, so a panic elsewhere cannot corrupt it.
        self.0.leases.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A lease statement under way; see [`Held::leasing`].
pub(crate) struct Leasing(Held);

impl Drop for Leasing {
    fn drop(&mut self) {
        self.0 .0.leasing.fetch_sub(1, SeqCst);
    }
}

/// The lease of one held row, owned by its delivery: whether it may start, when it runs out,
/// and the token to acknowledge under.
#[derive(Debug, Clone)]
pub(crate) struct HeldLease {
    held: Held,
    event_id: Uuid,
    deadline: watch::Receiver<Instant>,
}

impl HeldLease {
    pub(crate) fn event_id(&self) -> Uuid {
        self.event_id
    }

    /// Whether the lease is still certainly valid, so a delivery may start under it.
    pub(crate) fn is_valid(&self) -> bool {
        Instant::now() < *self.deadline.borrow()
    }

    /// Completes when the lease can no longer be vouched for: its deadline passed without a
    /// renewal moving it.
    pub(crate) async fn expired(&mut self) {
        loop {
            let deadline = *self.deadline.borrow_and_update();
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => {
                    if self.committing() {
                        return std::future::pending().await;
                    }
                    if Instant::now() >= *self.deadline.borrow() {
                        return;
                    }
                }
                changed = self.deadline.changed() => {
                    if changed.is_err() {
                        return; // settled: nothing left to vouch for
                    }
                }
            }
        }
    }

    /// The token to acknowledge under (the row's current one).
    pub(crate) fn token(&self) -> Option<Uuid> {
        self.held.token(self.event_id)
    }

    /// Whether the row is published in a transaction that holds its lock until it commits:
    /// then the delivery is no longer cancelled at the deadline (the commit decides).
    fn committing(&self) -> bool {
        self.held.lock().get(&self.event_id).is_some_and(|entry| entry.committing)
    }

    /// Marks the row published in the delivery's own transaction, not yet committed.
    pub(crate) fn commit_started(&self) {
        if let Some(entry) = self.held.lock().get_mut(&self.event_id) {
            entry.committing = true;
        }
    }

    /// The delivery ended: the row now only waits for its acknowledgement, and is still renewed
    /// until then.
    pub(crate) fn finish(&self) {
        if let Some(entry) = self.held.lock().get_mut(&self.event_id) {
            entry.finished = true;
        }
    }
}
