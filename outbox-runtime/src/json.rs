//! Payload serialization that refuses what JSON or PostgreSQL would silently mangle or reject, or
//! what the relay could not decode again.

use std::io;

use serde::ser::{self, Serialize};

use crate::error::InvalidEvent;

/// The deepest nesting of arrays and objects the relay can decode: `serde_json`'s deserializer
/// refuses the 128th level ("recursion limit exceeded"), while its serializer and `jsonb` take any
/// depth. The tests below and `tests/payloads.rs` fail if `serde_json` changes it.
pub(crate) const MAX_DEPTH: usize = 127;

/// Serializes `value` to JSON text for a `jsonb` column.
///
/// On top of `serde_json`'s own errors (non-string map keys, failing `Serialize` impls) this
/// rejects non-finite floats, which `serde_json` writes as `null` (losing the value), NUL
/// characters, which `jsonb` refuses (aborting the caller's transaction), and nesting deeper than
/// [`MAX_DEPTH`], which the relay could not decode (the event would die undelivered).
/// `what` names the value in the error (`"the payload"`, `"a header"`).
pub(crate) fn to_json<T: Serialize + ?Sized>(
    value: &T,
    what: &'static str,
) -> Result<String, InvalidEvent> {
    to_json_within(value, what, 0)
}

/// The payload of an enum family's value: its variant's content, as [`to_json`] checks it.
/// Serde writes an enum value `{"Variant":content}` (the derive refuses other representations);
/// the content is cut out of that text rather than serialized again.
pub(crate) fn untagged<T: Serialize + ?Sized>(value: &T) -> Result<String, InvalidEvent> {
    let json = to_json_within(value, "the payload", 1)?;
    let content = json
        .strip_prefix('{')
        .and_then(|rest| rest.strip_suffix('}'))
        .and_then(|inner| Some(&inner[string_end(inner)?..]))
        .and_then(|rest| rest.strip_prefix(':'));
    match content {
        Some(content) => Ok(content.to_owned()),
        None => Err(InvalidEvent::Serialize(ser::Error::custom(
            "an enum family must serialize as serde's default, externally tagged enum",
        ))),
    }
}

/// The end of the JSON string `text` starts with, just past its closing quote.
fn string_end(text: &str) -> Option<usize> {
    let mut chars = text.char_indices();
    if chars.next()?.1 != '"' {
        return None;
    }
    while let Some((at, c)) = chars.next() {
        match c {
            '\\' => {
                chars.next()?;
            }
            '"' => return Some(at + 1),
            _ => {}
        }
    }
    None
}

/// [`to_json`] of a value that sits `wrapping` levels deep in what is serialized.
fn to_json_within<T: Serialize + ?Sized>(
    value: &T,
    what: &'static str,
    wrapping: usize,
) -> Result<String, InvalidEvent> {
    // The formatter counts the depth as it writes each bracket: no pass of its own over the
    // value or the text, and the text is exactly what `serde_json::to_string` writes. The price
    // is checking below that the bytes are UTF-8, which `to_string` skips with `unsafe` (this
    // crate has none). Measured in release against `to_string`: small and structured payloads
    // within noise (0 to +15 %, about 15 ns on a 127-byte event), 10 MB of ASCII text +8 %,
    // 8 MB of non-ASCII text +2.5 ms (+105 %), small beside inserting it. Merely counting
    // brackets in the text afterwards cost more (+25 % on a 4 KB event, +100 % on 10 MB).
    let mut max_depth = 0;
    let mut bytes = Vec::with_capacity(128);
    let formatter = Depth { depth: 0, max: &mut max_depth };
    value
        .serialize(&mut serde_json::Serializer::with_formatter(&mut bytes, formatter))
        .map_err(InvalidEvent::Serialize)?;
    let depth = max_depth.saturating_sub(wrapping);
    if depth > MAX_DEPTH {
        return Err(InvalidEvent::TooDeep { what, depth, limit: MAX_DEPTH });
    }
    // Cannot fail: `serde_json` writes only UTF-8.
    let json = String::from_utf8(bytes)
        .map_err(|error| InvalidEvent::Serialize(ser::Error::custom(error)))?;
    // A non-finite float always comes out as `null`: only then is the second pass needed.
    if json.contains("null") {
        value.serialize(FiniteFloats).map_err(|NonFinite(x)| InvalidEvent::NonFiniteFloat(x))?;
    }
    if has_escaped_nul(&json) {
        return Err(InvalidEvent::NulCharacter(what));
    }
    Ok(json)
}

/// `serde_json`'s compact formatter, recording how deep arrays and objects nest.
struct Depth<'a> {
    depth: usize,
    max: &'a mut usize,
}

impl Depth<'_> {
    fn open(&mut self) {
        self.depth += 1;
        *self.max = (*self.max).max(self.depth);
    }
}

impl serde_json::ser::Formatter for Depth<'_> {
    fn begin_array<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.open();
        writer.write_all(b"[")
    }
    fn end_array<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.depth -= 1;
        writer.write_all(b"]")
    }
    fn begin_object<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.open();
        writer.write_all(b"{")
    }
    fn end_object<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.depth -= 1;
        writer.write_all(b"}")
    }
    // A `RawValue` (`serde_json`'s `raw_value` feature) is written as text, not bracket by
    // bracket: scan it.
    fn write_raw_fragment<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        *self.max = (*self.max).max(self.depth + text_depth(fragment));
        writer.write_all(fragment.as_bytes())
    }
}

/// How deep arrays and objects nest in JSON text, skipping brackets inside strings.
fn text_depth(json: &str) -> usize {
    let (mut depth, mut max, mut in_string, mut escaped) = (0_usize, 0, false, false);
    for &byte in json.as_bytes() {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                max = max.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

/// Whether JSON text holds the escape `\u0000` (and not an escaped backslash followed by `u0000`).
pub(crate) fn has_escaped_nul(json: &str) -> bool {
    let bytes = json.as_bytes();
    json.match_indices("u0000").any(|(at, _)| {
        let backslashes = bytes[..at].iter().rev().take_while(|&&b| b == b'\\').count();
        backslashes % 2 == 1
    })
}

/// A non-finite float found by [`FiniteFloats`].
#[derive(Debug)]
struct NonFinite(f64);

impl std::fmt::Display for NonFinite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "non-finite float {}", self.0)
    }
}

impl std::error::Error for NonFinite {}

impl ser::Error for NonFinite {
    // A custom error from the value's own `Serialize` impl: serde_json already reported those in
    // the first pass, so this pass cannot meet one it has not seen.
    fn custom<M: std::fmt::Display>(_msg: M) -> Self {
        NonFinite(f64::NAN)
    }
}

/// A serializer that writes nothing and fails on the first NaN or infinity.
struct FiniteFloats;

macro_rules! accept {
    ($($method:ident($ty:ty)),* $(,)?) => {
        $(fn $method(self, _: $ty) -> Result<(), NonFinite> { Ok(()) })*
    };
}

impl ser::Serializer for FiniteFloats {
    type Ok = ();
    type Error = NonFinite;
    type SerializeSeq = Self;
    type SerializeTuple = Self;
    type SerializeTupleStruct = Self;
    type SerializeTupleVariant = Self;
    type SerializeMap = Self;
    type SerializeStruct = Self;
    type SerializeStructVariant = Self;

    accept!(
        serialize_bool(bool),
        serialize_i8(i8),
        serialize_i16(i16),
        serialize_i32(i32),
        serialize_i64(i64),
        serialize_i128(i128),
        serialize_u8(u8),
        serialize_u16(u16),
        serialize_u32(u32),
        serialize_u64(u64),
        serialize_u128(u128),
        serialize_char(char),
        serialize_str(&str),
        serialize_bytes(&[u8]),
        serialize_unit_struct(&'static str),
    );

    fn serialize_f32(self, v: f32) -> Result<(), NonFinite> {
        self.serialize_f64(f64::from(v))
    }
    fn serialize_f64(self, v: f64) -> Result<(), NonFinite> {
        if v.is_finite() {
            Ok(())
        } else {
            Err(NonFinite(v))
        }
    }
    fn serialize_none(self) -> Result<(), NonFinite> {
        Ok(())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, v: &T) -> Result<(), NonFinite> {
        v.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), NonFinite> {
        Ok(())
    }
    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
    ) -> Result<(), NonFinite> {
        Ok(())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        v: &T,
    ) -> Result<(), NonFinite> {
        v.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        v: &T,
    ) -> Result<(), NonFinite> {
        v.serialize(self)
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self, NonFinite> {
        Ok(self)
    }
    fn serialize_tuple(self, _: usize) -> Result<Self, NonFinite> {
        Ok(self)
    }
    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Self, NonFinite> {
        Ok(self)
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self, NonFinite> {
        Ok(self)
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self, NonFinite> {
        Ok(self)
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self, NonFinite> {
        Ok(self)
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self, NonFinite> {
        Ok(self)
    }
}

/// Every compound serializer only forwards its elements to [`FiniteFloats`].
macro_rules! forward_elements {
    ($($trait:ident :: $method:ident $(($key:ty))?),* $(,)?) => {$(
        impl ser::$trait for FiniteFloats {
            type Ok = ();
            type Error = NonFinite;
            fn $method<T: Serialize + ?Sized>(&mut self, $(_: $key,)? value: &T) -> Result<(), NonFinite> {
                value.serialize(FiniteFloats)
            }
            fn end(self) -> Result<(), NonFinite> {
                Ok(())
            }
        }
    )*};
}

forward_elements!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field,
    SerializeStruct::serialize_field(&'static str),
    SerializeStructVariant::serialize_field(&'static str),
);

impl ser::SerializeMap for FiniteFloats {
    type Ok = ();
    type Error = NonFinite;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), NonFinite> {
        key.serialize(FiniteFloats)
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), NonFinite> {
        value.serialize(FiniteFloats)
    }
    fn end(self) -> Result<(), NonFinite> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn rejects_non_finite_floats_anywhere() {
        assert!(
            matches!(to_json(&f64::NAN, "x"), Err(InvalidEvent::NonFiniteFloat(x)) if x.is_nan())
        );
        assert!(matches!(
            to_json(&vec![Some(1.0), None, Some(f64::INFINITY)], "x"),
            Err(InvalidEvent::NonFiniteFloat(x)) if x == f64::INFINITY
        ));
        let map = BTreeMap::from([("a", f32::NEG_INFINITY)]);
        assert!(matches!(to_json(&map, "x"), Err(InvalidEvent::NonFiniteFloat(_))));
    }

    #[test]
    fn keeps_real_nulls_and_finite_floats() {
        assert_eq!(to_json(&(None::<u8>, 1.5, ()), "x").unwrap(), "[null,1.5,null]");
    }

    #[test]
    fn rejects_non_string_map_keys() {
        let map = BTreeMap::from([((1, 2), "x")]);
        assert!(matches!(to_json(&map, "x"), Err(InvalidEvent::Serialize(_))));
    }

    #[test]
    fn finds_nul_but_not_an_escaped_backslash() {
        assert!(matches!(to_json("a\0b", "x"), Err(InvalidEvent::NulCharacter(_))));
        assert_eq!(to_json(r"\u0000", "x").unwrap(), r#""\\u0000""#);
        assert!(has_escaped_nul(r#""\\\u0000""#));
    }

    /// `depth` arrays, one inside the other.
    fn nested(depth: usize) -> serde_json::Value {
        (0..depth).fold(serde_json::json!(1), |inner, _| serde_json::json!([inner]))
    }

    #[test]
    fn rejects_nesting_the_decoder_refuses() {
        assert!(to_json(&nested(MAX_DEPTH), "x").is_ok());
        let error = to_json(&nested(MAX_DEPTH + 1), "x").unwrap_err();
        assert!(
            matches!(error, InvalidEvent::TooDeep { what: "x", depth: 128, limit: 127 }),
            "{error:?}"
        );
        // The same limit as the decoder's, both sides of it.
        let at_limit = to_json(&nested(MAX_DEPTH), "x").unwrap();
        assert!(serde_json::from_str::<serde_json::Value>(&at_limit).is_ok());
        let deeper = format!("[{at_limit}]");
        assert!(serde_json::from_str::<serde_json::Value>(&deeper).is_err());
    }

    #[test]
    fn counts_objects_and_empty_containers_but_not_siblings() {
        let deep_object = (0..MAX_DEPTH)
            .fold(serde_json::json!({}), |inner, _| serde_json::json!({ "k": inner }));
        assert!(matches!(
            to_json(&deep_object, "x"),
            Err(InvalidEvent::TooDeep { depth: 128, .. })
        ));
        let wide: Vec<Vec<u8>> = vec![Vec::new(); 1000];
        assert_eq!(to_json(&wide, "x").unwrap().len(), 2 + 1000 * 3 - 1);
    }

    #[test]
    fn writes_what_serde_json_writes() {
        let value = serde_json::json!({ "a": [1, {"b": null}, [], {}], "c": "[{\"" });
        assert_eq!(to_json(&value, "x").unwrap(), serde_json::to_string(&value).unwrap());
    }

    #[test]
    fn text_depth_skips_strings() {
        assert_eq!(text_depth(r#"{"a": [1, {"b": "[[[{{"}], "c": []}"#), 3);
        assert_eq!(text_depth(r#"["\"[", "\\", []]"#), 2);
        assert_eq!(text_depth("42"), 0);
    }

    #[derive(serde::Serialize)]
    enum Family {
        Placed(BTreeMap<&'static str, u32>),
        #[serde(rename = "a\"b\\")]
        Cancelled {
            why: &'static str,
        },
    }

    #[test]
    fn untagged_cuts_the_variant_content_out() {
        let placed = Family::Placed(BTreeMap::from([("qty", 2)]));
        assert_eq!(untagged(&placed).unwrap(), r#"{"qty":2}"#);
        // A name with escaped quotes and backslashes does not end the tag early.
        let cancelled = Family::Cancelled { why: "late\"}" };
        assert_eq!(untagged(&cancelled).unwrap(), r#"{"why":"late\"}"}"#);
        assert!(untagged(&7).is_err());
        assert!(untagged("text").is_err());
    }

    #[test]
    fn untagged_counts_depth_from_the_content() {
        let mut nested = serde_json::json!(1);
        for _ in 0..MAX_DEPTH {
            nested = serde_json::json!([nested]);
        }
        let deepest = serde_json::json!({ "Placed": nested });
        assert_eq!(untagged(&deepest).unwrap(), nested.to_string());
        let too_deep = serde_json::json!({ "Placed": [nested] });
        assert!(matches!(untagged(&too_deep), Err(InvalidEvent::TooDeep { depth: 128, .. })));
    }
}
