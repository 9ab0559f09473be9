//! Decoding a stored payload into the handler's event type: the "extractor" step of a
//! delivery, whose failure is a typed, recorded error that names the failing field.

use std::any::type_name;

use crate::event::OutboxEvent;

/// The payload did not deserialize into the handler's event type.
///
/// Reads ``payload does not deserialize into `shop::OrderPlaced` at `items[2].qty`: invalid type:
/// string "heavy", expected u32``: the Rust type, the path of the field that failed (left out
/// when the payload as a whole is wrong, e.g. `missing field` at the top), and serde's message
/// without `serde_json`'s `at line N column M`, which counts columns of `jsonb`'s re-formatted
/// text rather than anything the producer wrote.
#[derive(Debug)]
pub(crate) struct DecodeError {
    type_name: &'static str,
    /// The failing field's path (`items[2].qty`); empty at the top level.
    path: String,
    message: String,
}

impl DecodeError {
    /// `path` is where `error` happened (`""` at the top level).
    fn new<E>(path: String, error: &serde_json::Error) -> Self {
        let mut message = error.to_string();
        // serde_json's `Display` is `{message} at line {line} column {column}` unless line is 0;
        // it has no accessor for the message alone.
        if error.line() != 0 {
            let position = format!(" at line {} column {}", error.line(), error.column());
            if let Some(alone) = message.strip_suffix(&position) {
                message.truncate(alone.len());
            }
        }
        DecodeError { type_name: type_name::<E>(), path, message }
    }
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "payload does not deserialize into `{}`", self.type_name)?;
        if !self.path.is_empty() {
            write!(f, " at `{}`", self.path)?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for DecodeError {}

/// Decodes a payload into the handler's event type.
///
/// `jsonb` prints numbers in plain decimal (`1e308` as a 309-digit integer, `5e-324` as 324
/// decimals): `serde_json`'s `float_roundtrip` feature (set in the workspace) parses those to the
/// exact `f64` that was emitted, where its default parser is up to 3 ulps off for a fifth of all
/// finite bit patterns (huge and tiny magnitudes) and refuses `f64::MAX` as out of range.
///
/// Tracking the path of every field as it decodes (`serde_path_to_error`) about doubles the cost
/// of a decode (0.41 -> 0.76 us for a small order, 13.5 -> 25.2 us with 100 items), so only a
/// payload that failed is decoded a second time, tracked, to name the field.
pub(crate) fn decode<E: OutboxEvent>(payload: &str) -> Result<E, DecodeError> {
    serde_json::from_str(payload).map_err(|untracked| {
        let mut deserializer = serde_json::Deserializer::from_str(payload);
        match serde_path_to_error::deserialize::<_, E>(&mut deserializer) {
            Err(tracked) => {
                // `Path` displays the top level as `.`; the message leaves it out instead.
                let path = tracked.path();
                let path = if path.iter().len() == 0 { String::new() } else { path.to_string() };
                DecodeError::new::<E>(path, tracked.inner())
            }
            // Only trailing text fails the untracked decode alone (`jsonb` writes none).
            Ok(_) => DecodeError::new::<E>(String::new(), &untracked),
        }
    })
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

    impl OutboxEvent for Order {
        const AGGREGATE_TYPE: &'static str = "order";
        const EVENT_TYPE: &'static str = "order.placed";
        fn aggregate_id(&self) -> String {
            String::new()
        }
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
}
