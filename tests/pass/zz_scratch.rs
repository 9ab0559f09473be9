use outbox_runtime::OutboxEvent;
use serde::{Deserialize, Serialize};

#[derive(Debug, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "order.placed")]
struct V1 { #[outbox(id)] order_id: u64, total: i64 }

#[derive(Debug, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "order.placed", version = 2, upcast_from = V1)]
struct V2 { #[outbox(id)] order_id: u64, cents: i64 }
impl From<V1> for V2 { fn from(v: V1) -> Self { V2 { order_id: v.order_id, cents: v.total * 100 } } }

#[derive(Debug, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "order.placed", version = 3, upcast_from = V2)]
struct V3 { #[outbox(id)] order_id: u64, cents: u64 }
impl TryFrom<V2> for V3 { type Error = String; fn try_from(v: V2) -> Result<Self, String> { Ok(V3 { order_id: v.order_id, cents: u64::try_from(v.cents).map_err(|e| e.to_string())? }) } }

#[derive(Debug, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[serde(rename_all = "snake_case")]
#[outbox(aggregate = "order")]
enum Fam {
    #[outbox(event_type = "order.placed")]
    Placed(V3),
    #[outbox(event_type = "order.cancelled", version = 2)]
    #[serde(rename = "gone")]
    Cancelled { #[serde(rename = "why")] reason: String, #[outbox(id)] order_id: u64 },
}

fn main() {
    let v = V3::__read("order.placed", 1, r#"{"order_id":1,"total":2}"#).unwrap();
    assert_eq!(v, V3 { order_id: 1, cents: 200 });
    let v = V3::__read("order.placed", 2, r#"{"order_id":1,"cents":5}"#).unwrap();
    assert_eq!(v, V3 { order_id: 1, cents: 5 });
    let e = V3::__read("order.placed", 2, r#"{"order_id":1,"cents":-5}"#).unwrap_err();
    println!("{e}");
    let e = V3::__read("order.placed", 4, r#"{}"#).unwrap_err();
    println!("{e}");

    let f = Fam::Cancelled { reason: "x".into(), order_id: 9 };
    let p = f.__payload().unwrap();
    println!("{p}");
    assert_eq!(p, r#"{"why":"x","order_id":9}"#);
    assert_eq!(Fam::__read("order.cancelled", 2, &p).unwrap(), f);
    println!("{}", Fam::__read("order.cancelled", 1, &p).unwrap_err());
    println!("{}", Fam::__read("order.nope", 1, &p).unwrap_err());
    let f = Fam::Placed(V3 { order_id: 3, cents: 4 });
    let p = f.__payload().unwrap();
    assert_eq!(p, r#"{"order_id":3,"cents":4}"#);
    assert_eq!(Fam::__read("order.placed", 3, &p).unwrap(), f);
    assert_eq!(Fam::__read("order.placed", 1, r#"{"order_id":3,"total":1}"#).unwrap(), Fam::Placed(V3 { order_id: 3, cents: 100 }));
    assert_eq!(Fam::EVENT_TYPES[0].oldest_version(), 1);
    println!("all good");
}
