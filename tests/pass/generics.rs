use std::borrow::Cow;
use std::fmt::Debug;
use std::marker::PhantomData;

use outbox_runtime::OutboxEvent;
use serde::{Deserialize, Serialize};

/// A concrete id, a generic payload.
#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "wrapper", event_type = "wrapper.wrapped")]
struct Wrapped<T> {
    #[outbox(id)]
    id: u64,
    inner: T,
}

/// A generic id: the impl requires it to display.
#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "keyed", event_type = "keyed.changed")]
struct Keyed<K> {
    #[outbox(id)]
    key: K,
}

/// The user's bounds and where clauses are carried over.
#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "bounded", event_type = "bounded.seen")]
struct Bounded<K: Clone, T = ()>
where
    T: Debug,
{
    #[outbox(id)]
    key: K,
    extra: T,
}

/// A lifetime parameter, still `DeserializeOwned`.
#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "label", event_type = "label.set")]
struct Labelled<'a> {
    #[outbox(id)]
    name: Cow<'a, str>,
}

/// A const parameter.
#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "block", event_type = "block.written")]
struct Block<const N: usize> {
    #[outbox(id)]
    id: u32,
    width: PhantomData<[u8; N]>,
}

fn describe<E: OutboxEvent>(event: &E) -> String {
    format!(
        "{}/{}/{}",
        E::AGGREGATE_TYPE,
        E::EVENT_TYPES[0].name(),
        event.aggregate_id()
    )
}

fn main() {
    let wrapped = Wrapped {
        id: 9,
        inner: vec!["a".to_owned()],
    };
    assert_eq!(Wrapped::<Vec<String>>::AGGREGATE_TYPE, "wrapper");
    assert_eq!(Wrapped::<Vec<String>>::EVENT_TYPE, "wrapper.wrapped");
    assert_eq!(wrapped.aggregate_id(), "9");
    assert_eq!(wrapped.inner.len(), 1);

    assert_eq!(Keyed { key: 5_u64 }.aggregate_id(), "5");
    assert_eq!(
        Keyed {
            key: "k-1".to_owned()
        }
        .aggregate_id(),
        "k-1"
    );
    assert_eq!(describe(&Keyed { key: 'x' }), "keyed/keyed.changed/x");

    let bounded: Bounded<i64> = Bounded { key: -1, extra: () };
    assert_eq!(describe(&bounded), "bounded/bounded.seen/-1");
    assert_eq!(bounded.extra, ());

    let label = Labelled {
        name: Cow::Borrowed("blue"),
    };
    assert_eq!(describe(&label), "label/label.set/blue");

    let block = Block::<4> {
        id: 3,
        width: PhantomData,
    };
    assert_eq!(describe(&block), "block/block.written/3");
    assert_eq!(block.width, PhantomData::<[u8; 4]>);
}
