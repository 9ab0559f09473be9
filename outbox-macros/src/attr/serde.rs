//! The `#[serde(...)]` keys an event cannot have, and the ones on a field that `valid` needs.
//!
//! A family's value is stored as its variant's event type with the variant's content as the
//! payload, and read back by variant index: that needs serde's default, externally tagged
//! representation (`{"Variant": content}`) and every variant serialized and deserialized.
//! The aggregate id is read from the value when it is emitted, and a delivered event is read
//! from the payload: a field serde may leave out of the payload, or not read back from it,
//! cannot be the id (whether a field is the id is `valid`'s to say, so only the keys are read
//! here). Everything else about serde (renames, other field attributes) is left to serde.
//! Unreadable serde attributes are serde's to report.

use proc_macro2::TokenStream;
use syn::{Attribute, Ident};

use super::value::skip_value;
use crate::ctxt::Ctxt;
use crate::symbol::SERDE;

/// Reports the enum's serde keys that change its representation.
pub fn check_enum(cx: &Ctxt, attrs: &[Attribute]) {
    each_key(attrs, |key, tokens| {
        let msg = match key {
            "tag" | "content" | "untagged" => format!(
                "an event family keeps serde's default, externally tagged representation: the \
                 stored event type names the variant and the payload is its content; remove `{key}`"
            ),
            "from" | "try_from" | "into" => format!(
                "an event family is serialized as itself: the payload is its variant's content as \
                 serde writes the enum; remove `{key}`"
            ),
            _ => return,
        };
        cx.error_spanned_by(tokens, msg);
    });
}

/// Reports a variant's serde keys that leave it out of the family or change its representation.
pub fn check_variant(cx: &Ctxt, attrs: &[Attribute]) {
    each_key(attrs, |key, tokens| {
        let msg = match key {
            "skip" | "skip_serializing" | "skip_deserializing" => format!(
                "a variant of an event family cannot be skipped: every variant is an event type \
                 the family writes and reads; remove `{key}`"
            ),
            "other" => "a variant of an event family cannot be `other`: a stored event of an \
                        unknown type is a failed delivery, not a variant; remove `other`"
                .to_owned(),
            "untagged" => "a variant of an event family cannot be untagged: the stored event \
                           type names the variant; remove `untagged`"
                .to_owned(),
            _ => return,
        };
        cx.error_spanned_by(tokens, msg);
    });
}

/// A field's serde keys that can keep it out of the payload (`skip`, `skip_serializing`,
/// `skip_serializing_if`) or keep it from being read back (`skip_deserializing`), in source
/// order, each spanned at the key alone.
pub fn field_skips(attrs: &[Attribute]) -> Vec<Ident> {
    let mut skips = Vec::new();
    each_meta(attrs, |key, _| {
        if FIELD_SKIPS.iter().any(|skip| key == skip) {
            skips.push(key.clone());
        }
    });
    skips
}

/// The keys [`field_skips`] returns.
const FIELD_SKIPS: &[&str] =
    &["skip", "skip_serializing", "skip_deserializing", "skip_serializing_if"];

/// Runs `each` on every key of every `#[serde(...)]` in `attrs`, with the key's tokens and its
/// value's (for spanning an error).
fn each_key(attrs: &[Attribute], mut each: impl FnMut(&str, TokenStream)) {
    each_meta(attrs, |key, value| {
        let mut tokens = quote::quote!(#key);
        tokens.extend(value);
        each(&key.to_string(), tokens);
    });
}

/// Runs `each` on every single-word key of every `#[serde(...)]` in `attrs`, with its value's
/// tokens (`= ...` or `(...)`, empty for a flag).
fn each_meta(attrs: &[Attribute], mut each: impl FnMut(&Ident, TokenStream)) {
    for attr in attrs.iter().filter(|attr| attr.path().is_ident(SERDE)) {
        // A syntax error is serde's to report; the keys read before it are still checked.
        let _ = attr.parse_nested_meta(|meta| {
            let value = skip_value(meta.input)?;
            if let Some(key) = meta.path.get_ident() {
                each(key, value);
            }
            Ok(())
        });
    }
}
