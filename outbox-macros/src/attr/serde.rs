//! The `#[serde(...)]` keys an event family cannot have.
//!
//! A family's value is stored as its variant's event type with the variant's content as the
//! payload, and read back by variant index: that needs serde's default, externally tagged
//! representation (`{"Variant": content}`) and every variant serialized and deserialized.
//! Everything else about serde (renames, field attributes) is left to serde. Unreadable serde
//! attributes are serde's to report.

use proc_macro2::TokenStream;
use syn::Attribute;

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

/// Runs `each` on every key of every `#[serde(...)]` in `attrs`, with the key's tokens and its
/// value's (for spanning an error).
fn each_key(attrs: &[Attribute], mut each: impl FnMut(&str, TokenStream)) {
    for attr in attrs.iter().filter(|attr| attr.path().is_ident(SERDE)) {
        // A syntax error is serde's to report; the keys read before it are still checked.
        let _ = attr.parse_nested_meta(|meta| {
            let value = skip_value(meta.input)?;
            if let Some(key) = meta.path.get_ident() {
                let mut tokens = quote::quote!(#key);
                tokens.extend(value);
                each(&key.to_string(), tokens);
            }
            Ok(())
        });
    }
}
