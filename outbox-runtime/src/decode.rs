//! Reading a stored payload as the handler's event type: the "extractor" step of a delivery.
//! The row's version is read through JSON upcasters (versions whose structs are gone), then the
//! type's `upcast_from` chain; every failure is a typed, recorded error naming what failed.

use std::any::type_name;
use std::collections::HashMap;
use std::fmt;

use serde::de::{self, DeserializeOwned, IntoDeserializer};
use serde_json::Value;
use serde_path_to_error::{Deserializer as PathDeserializer, Track};

use crate::error::BoxError;
use crate::event::{EventType, OutboxEvent};

/// Why a stored event could not be read as a handler's type: recorded as a failed delivery.
#[derive(Debug)]
pub struct DecodeError {
    reason: Reason,
    /// What a failed conversion or JSON upcaster returned.
    source: Option<BoxError>,
}

#[derive(Debug)]
enum Reason {
    /// The payload does not deserialize into `type_name`.
    Payload {
        type_name: &'static str,
        /// The failing field's path (`items[2].qty`); empty at the top level.
        path: String,
        message: String,
    },
    /// A `From`/`TryFrom` conversion between two versions failed.
    Upcast { from: &'static str, from_version: u32, to: &'static str, to_version: u32 },
    /// A JSON upcaster failed.
    Json { event_type: String, from_version: u32 },
    /// The stored version is not one the handler's type reads.
    Version { event_type: String, version: u32, type_name: &'static str, oldest: u32, newest: u32 },
    /// The handler's type has no such event type (a relay bug if it happens).
    EventType { event_type: String, type_name: &'static str },
}

impl DecodeError {
    /// `path` is where `error` happened (`""` at the top level).
    fn payload<T>(path: String, error: &serde_json::Error) -> Self {
        let mut message = error.to_string();
        // serde_json's `Display` is `{message} at line {line} column {column}` unless line is 0;
        // it has no accessor for the message alone.
        if error.line() != 0 {
            let position = format!(" at line {} column {}", error.line(), error.column());
            if let Some(alone) = message.strip_suffix(&position) {
                message.truncate(alone.len());
            }
        }
        Reason::Payload { type_name: type_name::<T>(), path, message }.into()
    }

    fn version<E>(event_type: &str, version: u32, known: &EventType) -> Self {
        Reason::Version {
            event_type: event_type.to_owned(),
            version,
            type_name: type_name::<E>(),
            oldest: known.oldest_version(),
            newest: known.version(),
        }
        .into()
    }
}

impl DecodeError {
    /// What a log line may say: the same but for what can quote the payload (serde's message,
    /// a conversion's or upcaster's error), which stays in `last_error`.
    pub(crate) fn without_payload(&self) -> String {
        match &self.reason {
            Reason::Payload { type_name, path, .. } if path.is_empty() => {
                format!("payload does not deserialize into `{type_name}`")
            }
            Reason::Payload { type_name, path, .. } => {
                format!("payload does not deserialize into `{type_name}` at `{path}`")
            }
            _ => self.to_string(),
        }
    }
}

impl From<Reason> for DecodeError {
    fn from(reason: Reason) -> Self {
        DecodeError { reason, source: None }
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.reason {
            Reason::Payload { type_name, path, message } => {
                write!(f, "payload does not deserialize into `{type_name}`")?;
                if !path.is_empty() {
                    write!(f, " at `{path}`")?;
                }
                write!(f, ": {message}")
            }
            Reason::Upcast { from, from_version, to, to_version } => write!(
                f,
                "cannot upcast `{from}` (version {from_version}) to `{to}` (version {to_version})"
            ),
            Reason::Json { event_type, from_version } => write!(
                f,
                "the JSON upcaster of `{event_type}` from version {from_version} to {} failed",
                from_version + 1
            ),
            Reason::Version { event_type, version, type_name, oldest, newest } => {
                let known = if oldest == newest {
                    format!("version {newest}")
                } else {
                    format!("versions {oldest} to {newest}")
                };
                write!(f, "`{event_type}` version {version} is ")?;
                if version > newest {
                    write!(f, "newer than `{type_name}` reads ({known})")
                } else {
                    write!(
                        f,
                        "older than `{type_name}` reads ({known}): register JSON upcasters \
                         with `RelayBuilder::upcast_json`"
                    )
                }
            }
            Reason::EventType { event_type, type_name } => {
                write!(f, "`{type_name}` has no event type `{event_type}`")
            }
        }
    }
}

impl std::error::Error for DecodeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_deref().map(|source| source as _)
    }
}

/// A JSON upcaster: the payload of one version in, the next version's out.
pub(crate) type JsonUpcaster = Box<dyn Fn(Value) -> Result<Value, BoxError> + Send + Sync>;

/// The relay's JSON upcasters, by aggregate type, event type and the version they read.
#[derive(Default)]
pub(crate) struct JsonUpcasters(
    pub(crate) HashMap<(&'static str, &'static str, u32), JsonUpcaster>,
);

/// Reads a stored row as `E`: the relay's entry point. A version below the oldest that `E`
/// reads goes through the JSON upcasters first; a newer one than `E` writes is an error (the
/// relay leaves such rows to newer relays unless told to fail them).
pub(crate) fn read<E: OutboxEvent>(
    event_type: &str,
    version: u32,
    payload: &str,
    upcasters: &JsonUpcasters,
) -> Result<E, DecodeError> {
    let known = known::<E>(event_type)?;
    if version > known.version() {
        return Err(DecodeError::version::<E>(event_type, version, known));
    }
    if version >= known.oldest_version() {
        return E::__read(event_type, version, payload);
    }
    let mut value: Value = serde_json::from_str(payload)
        .map_err(|error| DecodeError::payload::<Value>(String::new(), &error))?;
    for from_version in version..known.oldest_version() {
        let key = (E::AGGREGATE_TYPE, known.name(), from_version);
        let Some(upcaster) = upcasters.0.get(&key) else {
            return Err(DecodeError::version::<E>(event_type, version, known));
        };
        value = upcaster(value).map_err(|source| DecodeError {
            reason: Reason::Json { event_type: event_type.to_owned(), from_version },
            source: Some(source),
        })?;
    }
    E::__read(event_type, known.oldest_version(), &value.to_string())
}

/// `E`'s entry for `event_type`.
fn known<E: OutboxEvent>(event_type: &str) -> Result<&'static EventType, DecodeError> {
    E::EVENT_TYPES.iter().find(|known| known.name() == event_type).ok_or_else(|| {
        Reason::EventType { event_type: event_type.to_owned(), type_name: type_name::<E>() }.into()
    })
}

/// [`OutboxEvent::__read`] of a type without predecessors: its own version only.
pub(crate) fn read_plain<E: OutboxEvent>(
    event_type: &str,
    version: u32,
    payload: &str,
) -> Result<E, DecodeError> {
    let known = known::<E>(event_type)?;
    if version != known.version() {
        return Err(DecodeError::version::<E>(event_type, version, known));
    }
    decode(payload)
}

/// A stored version that `E`'s chain does not read (the derive's fallback branch).
pub(crate) fn unknown_version<E: OutboxEvent>(event_type: &str, version: u32) -> DecodeError {
    match known::<E>(event_type) {
        Ok(known) => DecodeError::version::<E>(event_type, version, known),
        Err(error) => error,
    }
}

/// An event type that `E` does not have (the derive's fallback branch).
pub(crate) fn unknown_event_type<E>(event_type: &str) -> DecodeError {
    Reason::EventType { event_type: event_type.to_owned(), type_name: type_name::<E>() }.into()
}

/// Converts the previous version's value into the next one's.
pub(crate) fn upcast<P, E>(previous: P) -> Result<E, DecodeError>
where
    P: OutboxEvent,
    E: OutboxEvent + TryFrom<P>,
    E::Error: Into<BoxError>,
{
    E::try_from(previous).map_err(|error| DecodeError {
        reason: Reason::Upcast {
            from: type_name::<P>(),
            from_version: P::EVENT_TYPES[0].version(),
            to: type_name::<E>(),
            to_version: E::EVENT_TYPES[0].version(),
        },
        source: Some(error.into()),
    })
}

/// Decodes a payload into `T`.
///
/// `jsonb` prints numbers in plain decimal (`1e308` as a 309-digit integer, `5e-324` as 324
/// decimals): `serde_json`'s `float_roundtrip` feature (set in the workspace) parses those to the
/// exact `f64` that was emitted, where its default parser is up to 3 ulps off for a fifth of all
/// finite bit patterns (huge and tiny magnitudes) and refuses `f64::MAX` as out of range.
///
/// Tracking the path of every field as it decodes (`serde_path_to_error`) about doubles the cost
/// of a decode (0.41 -> 0.76 us for a small order, 13.5 -> 25.2 us with 100 items), so only a
/// payload that failed is decoded a second time, tracked, to name the field.
pub(crate) fn decode<T: DeserializeOwned>(payload: &str) -> Result<T, DecodeError> {
    serde_json::from_str(payload).map_err(|untracked| {
        let mut deserializer = serde_json::Deserializer::from_str(payload);
        let mut track = Track::new();
        let tracked = T::deserialize(PathDeserializer::new(&mut deserializer, &mut track));
        failure::<T>(tracked.map(drop), track, &untracked)
    })
}

/// The payload of one variant of an enum family, read as that variant: the variant is chosen
/// by its index (as serde numbers them), so renamed variants and fields read as serde wrote them.
pub(crate) fn decode_variant<T: DeserializeOwned>(
    index: u32,
    payload: &str,
) -> Result<T, DecodeError> {
    let mut deserializer = serde_json::Deserializer::from_str(payload);
    let untracked = T::deserialize(Variant { index, content: &mut deserializer })
        .and_then(|value| deserializer.end().map(|()| value));
    untracked.map_err(|untracked| {
        let mut deserializer = serde_json::Deserializer::from_str(payload);
        let mut track = Track::new();
        let content = PathDeserializer::new(&mut deserializer, &mut track);
        let tracked = T::deserialize(Variant { index, content });
        failure::<T>(tracked.map(drop), track, &untracked)
    })
}

/// The error of a failed decode, naming the failing field found by the tracked second decode.
fn failure<T>(
    tracked: Result<(), serde_json::Error>,
    track: Track,
    untracked: &serde_json::Error,
) -> DecodeError {
    match tracked {
        Err(error) => {
            // `Path` displays the top level as `.`; the message leaves it out instead.
            let path = track.path();
            let path = if path.iter().len() == 0 { String::new() } else { path.to_string() };
            DecodeError::payload::<T>(path, &error)
        }
        // Only trailing text fails the untracked decode alone (`jsonb` writes none).
        Ok(()) => DecodeError::payload::<T>(String::new(), untracked),
    }
}

/// A deserializer that presents one variant of an enum, by index, with `content` as its data.
struct Variant<D> {
    index: u32,
    content: D,
}

impl<'de, D: de::Deserializer<'de>> de::Deserializer<'de> for Variant<D> {
    type Error = D::Error;

    fn deserialize_any<V: de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        visitor.visit_enum(self)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map struct enum
        identifier ignored_any
    }
}

impl<'de, D: de::Deserializer<'de>> de::EnumAccess<'de> for Variant<D> {
    type Error = D::Error;
    type Variant = Content<D>;

    fn variant_seed<V: de::DeserializeSeed<'de>>(
        self,
        seed: V,
    ) -> Result<(V::Value, Content<D>), D::Error> {
        let variant = seed.deserialize(self.index.into_deserializer())?;
        Ok((variant, Content(self.content)))
    }
}

/// The data of the variant [`Variant`] presents.
struct Content<D>(D);

impl<'de, D: de::Deserializer<'de>> de::VariantAccess<'de> for Content<D> {
    type Error = D::Error;

    fn unit_variant(self) -> Result<(), D::Error> {
        de::Deserialize::deserialize(self.0)
    }

    fn newtype_variant_seed<T: de::DeserializeSeed<'de>>(
        self,
        seed: T,
    ) -> Result<T::Value, D::Error> {
        seed.deserialize(self.0)
    }

    fn tuple_variant<V: de::Visitor<'de>>(
        self,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_tuple(len, visitor)
    }

    fn struct_variant<V: de::Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_struct("", fields, visitor)
    }
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};

    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Order {
        items: Vec<Item>,
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Item {
        qty: u32,
    }

    fn decode_error(payload: &str) -> String {
        decode::<Order>(payload).unwrap_err().to_string()
    }

    #[test]
    fn decodes_a_payload_that_fits() {
        let order = decode::<Order>(r#"{"items": [{"qty": 1}]}"#).unwrap();
        assert_eq!(order, Order { items: vec![Item { qty: 1 }] });
    }

    #[test]
    fn names_the_type_and_the_failing_field_without_a_text_position() {
        let payload = r#"{"items": [{"qty": 1}, {"qty": 2}, {"qty": "heavy"}]}"#;
        assert_eq!(
            decode_error(payload),
            format!(
                "payload does not deserialize into `{}` at `items[2].qty`: \
                 invalid type: string \"heavy\", expected u32",
                type_name::<Order>()
            )
        );
        let missing = decode_error(r#"{"items": [{"qty": 1}, {}]}"#);
        assert!(missing.ends_with("` at `items[1]`: missing field `qty`"), "{missing}");
    }

    #[test]
    fn leaves_the_path_out_at_the_top_level() {
        let prefix = format!("payload does not deserialize into `{}`: ", type_name::<Order>());
        for (payload, message) in [
            ("{}", "missing field `items`"),
            ("[]", "invalid length 0, expected struct Order with 1 element"),
            ("42", "invalid type: integer `42`, expected struct Order"),
            // Only the untracked decode sees trailing text: its message is kept.
            (r#"{"items": []} x"#, "trailing characters"),
        ] {
            assert_eq!(decode_error(payload), format!("{prefix}{message}"), "{payload}");
        }
    }

    #[derive(Debug, PartialEq, Deserialize)]
    #[serde(rename_all = "snake_case")]
    enum Family {
        Placed(Order),
        #[serde(rename = "gone")]
        Cancelled {
            #[serde(rename = "why")]
            reason: String,
            qty: u32,
        },
    }

    #[test]
    fn reads_a_variant_by_index_whatever_serde_calls_it() {
        let placed = decode_variant::<Family>(0, r#"{"items": [{"qty": 3}]}"#).unwrap();
        assert_eq!(placed, Family::Placed(Order { items: vec![Item { qty: 3 }] }));
        let cancelled = decode_variant::<Family>(1, r#"{"why": "late", "qty": 2}"#).unwrap();
        assert_eq!(cancelled, Family::Cancelled { reason: "late".into(), qty: 2 });
    }

    #[test]
    fn names_the_failing_field_of_a_variant() {
        let error = decode_variant::<Family>(1, r#"{"why": "late", "qty": -1}"#).unwrap_err();
        assert_eq!(
            error.to_string(),
            format!(
                "payload does not deserialize into `{}` at `qty`: \
                 invalid value: integer `-1`, expected u32",
                type_name::<Family>()
            )
        );
        let trailing = decode_variant::<Family>(1, r#"{"why": "x", "qty": 1} 2"#).unwrap_err();
        assert!(trailing.to_string().ends_with("trailing characters"), "{trailing}");
    }
}
