//! JSON Schemas of event payloads (feature `schemars`), so consumers in other languages can
//! generate types from the contract instead of from samples.

use schemars::JsonSchema;
use serde_json::{json, Map, Value};

use crate::event::OutboxEvent;

/// The JSON Schema (draft 2020-12) of one event type's payload as stored and forwarded, with the
/// event's names under `x-outbox`: `{"aggregate_type", "event_type", "version"}`.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct EventSchema {
    /// The aggregate type.
    pub aggregate_type: &'static str,
    /// The event type.
    pub event_type: &'static str,
    /// The version the schema describes: the one the Rust type writes.
    pub version: u32,
    /// The schema.
    pub schema: Value,
}

impl EventSchema {
    /// A file name for the schema: `{event_type}.v{version}.schema.json`.
    pub fn file_name(&self) -> String {
        format!("{}.v{}.schema.json", self.event_type, self.version)
    }
}

/// The schema of every event type `E` writes: one for a struct, one per variant for an enum
/// family (each variant's content, as its rows store it).
///
/// ```
/// # use outbox_runtime::OutboxEvent;
/// # use serde::{Deserialize, Serialize};
/// #[derive(Serialize, Deserialize, OutboxEvent, schemars::JsonSchema)]
/// #[outbox(aggregate = "order", event_type = "order.placed", version = 2)]
/// struct OrderPlaced { #[outbox(id)] order_id: u64, total_cents: i64 }
///
/// let [placed] = outbox_runtime::event_schemas::<OrderPlaced>().try_into().unwrap();
/// assert_eq!(placed.schema["x-outbox"]["version"], 2);
/// assert_eq!(placed.schema["required"], serde_json::json!(["order_id", "total_cents"]));
/// ```
pub fn event_schemas<E: OutboxEvent + JsonSchema>() -> Vec<EventSchema> {
    let root: Value = schemars::schema_for!(E).into();
    let variants = match root.get("oneOf") {
        Some(Value::Array(variants)) if E::__FAMILY => Some(variants),
        _ => None,
    };
    E::EVENT_TYPES
        .iter()
        .enumerate()
        .map(|(index, event_type)| {
            let payload = match variants {
                // `{"type": "object", "properties": {"<variant>": <content>}, ...}`, in
                // declaration order: the content is what the variant's rows hold.
                Some(variants) => variants
                    .get(index)
                    .and_then(|variant| variant.get("properties")?.as_object()?.values().next())
                    .cloned()
                    .unwrap_or(Value::Bool(true)),
                None => root.clone(),
            };
            let mut schema = standalone(payload, &root);
            schema.insert(
                "x-outbox".into(),
                json!({
                    "aggregate_type": E::AGGREGATE_TYPE,
                    "event_type": event_type.name(),
                    "version": event_type.version(),
                }),
            );
            EventSchema {
                aggregate_type: E::AGGREGATE_TYPE,
                event_type: event_type.name(),
                version: event_type.version(),
                schema: Value::Object(schema),
            }
        })
        .collect()
}

/// `schema` as a document of its own: a reference to one of the root's definitions is replaced
/// by that definition, and the root's `$schema` and `$defs` come along for nested references.
fn standalone(schema: Value, root: &Value) -> Map<String, Value> {
    let defs = root.get("$defs");
    let referenced = schema
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|target| target.strip_prefix("#/$defs/"))
        .and_then(|name| defs?.get(name))
        .cloned();
    let mut out = match referenced.unwrap_or(schema) {
        Value::Object(object) => object,
        other => Map::from_iter([("allOf".to_owned(), json!([other]))]),
    };
    for key in ["$defs", "$schema"] {
        if let (Some(value), false) = (root.get(key), out.contains_key(key)) {
            out.insert(key.to_owned(), value.clone());
        }
    }
    out
}
