//! Which keys an item takes, and what to say about a key it does not take: where that key goes
//! instead, or the key it was likely a typo of.

use syn::meta::ParseNestedMeta;
use syn::Ident;

use super::value::skip_value;
use crate::ctxt::Ctxt;
use crate::symbol::{
    CONTAINER_KEYS, ENUM_KEYS, EVENT_TYPE, FIELD_KEYS, UPCAST_FROM, VARIANT_KEYS, VERSION,
};

/// The item an `#[outbox(...)]` sits on.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Place {
    Struct,
    /// An enum: an event family.
    Enum,
    /// A variant of an event family.
    Variant,
    /// A field of a struct.
    Field,
    /// A field of a variant.
    VariantField,
}

impl Place {
    /// The keys taken here.
    pub fn keys(self) -> &'static [&'static str] {
        match self {
            Place::Struct => CONTAINER_KEYS,
            Place::Enum => ENUM_KEYS,
            Place::Variant => VARIANT_KEYS,
            Place::Field | Place::VariantField => FIELD_KEYS,
        }
    }

    /// The item, as a message names it after "not on".
    fn item(self) -> &'static str {
        match self {
            Place::Struct => "the struct",
            Place::Enum => "the enum",
            Place::Variant => "a variant",
            Place::Field | Place::VariantField => "a field",
        }
    }

    /// The attribute, as "unknown ..." names it.
    fn attribute(self) -> &'static str {
        match self {
            Place::Struct | Place::Enum => "outbox attribute",
            Place::Variant => "outbox variant attribute",
            Place::Field | Place::VariantField => "outbox field attribute",
        }
    }
}

/// The key of `meta`, when it is one that `place` takes.
pub fn known_key<'m>(meta: &'m ParseNestedMeta, place: Place) -> Option<&'m Ident> {
    let key = meta.path.get_ident()?;
    place.keys().iter().any(|known| key == known).then_some(key)
}

/// Where a key that `place` does not take goes instead, if it is a key at all.
fn home(key: &str, place: Place) -> Option<&'static str> {
    let newtype_struct = "the struct that a newtype variant holds";
    let home = match place {
        Place::Field | Place::VariantField if FIELD_KEYS.contains(&key) => return None,
        _ if FIELD_KEYS.contains(&key) => "the aggregate id field",
        Place::Enum | Place::VariantField if key == UPCAST_FROM => newtype_struct,
        Place::Enum if key == EVENT_TYPE || key == VERSION => "each variant",
        Place::Variant | Place::VariantField if ENUM_KEYS.contains(&key) => "the enum",
        Place::VariantField if VARIANT_KEYS.contains(&key) => "the variant",
        Place::Field if CONTAINER_KEYS.contains(&key) => "the struct",
        _ => return None,
    };
    Some(home)
}

/// Reports a key that `place` does not take, at the key, and skips its value so parsing goes
/// on with the next key. Returns the key of `place` it was likely meant as, if any.
pub fn unknown_key(
    cx: &Ctxt,
    meta: &ParseNestedMeta,
    place: Place,
) -> syn::Result<Option<&'static str>> {
    let name = path_to_string(&meta.path);
    let expected = place.keys();
    let (msg, meant) = if let Some(home) = home(&name, place) {
        (format!("`{name}` goes on {home}, not on {}", place.item()), None)
    } else if let Some(best) = suggest(&name, expected) {
        (format!("unknown {} `{name}`, did you mean `{best}`?", place.attribute()), Some(best))
    } else {
        (unknown_key_message(place.attribute(), &name, expected), None)
    };
    cx.error_spanned_by(&meta.path, msg);
    skip_value(meta.input)?;
    Ok(meant)
}

fn unknown_key_message(what: &str, name: &str, expected: &[&str]) -> String {
    match expected {
        [only] => format!("unknown {what} `{name}`, expected `{only}`"),
        _ => {
            let list: Vec<String> = expected.iter().map(|key| format!("`{key}`")).collect();
            format!("unknown {what} `{name}`, expected one of {}", list.join(", "))
        }
    }
}

/// The known key closest to `name`, when it is close enough to be a likely typo.
pub fn suggest<'a>(name: &str, expected: &[&'a str]) -> Option<&'a str> {
    expected
        .iter()
        .map(|key| (strsim::jaro_winkler(name, key), *key))
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, key)| key)
}

fn path_to_string(path: &syn::Path) -> String {
    let mut out = String::new();
    if path.leading_colon.is_some() {
        out.push_str("::");
    }
    let segments: Vec<String> = path.segments.iter().map(|seg| seg.ident.to_string()).collect();
    out.push_str(&segments.join("::"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::symbol::{AGGREGATE, CRATE, ID, ORDERED};

    #[test]
    fn suggests_close_keys() {
        assert_eq!(suggest("agregate", CONTAINER_KEYS), Some(AGGREGATE));
        assert_eq!(suggest("aggregate_type", CONTAINER_KEYS), Some(AGGREGATE));
        assert_eq!(suggest("event-type", CONTAINER_KEYS), Some(EVENT_TYPE));
        assert_eq!(suggest("eventtype", CONTAINER_KEYS), Some(EVENT_TYPE));
        assert_eq!(suggest("event", CONTAINER_KEYS), Some(EVENT_TYPE));
        assert_eq!(suggest("crates", CONTAINER_KEYS), Some(CRATE));
        assert_eq!(suggest("ids", FIELD_KEYS), Some(ID));
        assert_eq!(suggest("versoin", CONTAINER_KEYS), Some(VERSION));
        assert_eq!(suggest("upcast", CONTAINER_KEYS), Some(UPCAST_FROM));
        assert_eq!(suggest("upcast_form", CONTAINER_KEYS), Some(UPCAST_FROM));
        assert_eq!(suggest("orderd", ENUM_KEYS), Some(ORDERED));
        assert_eq!(suggest("event_typ", VARIANT_KEYS), Some(EVENT_TYPE));
        assert_eq!(suggest("vers", VARIANT_KEYS), Some(VERSION));
    }

    #[test]
    fn no_suggestion_for_unrelated_keys() {
        assert_eq!(suggest("name", CONTAINER_KEYS), None);
        assert_eq!(suggest("topic", CONTAINER_KEYS), None);
        assert_eq!(suggest("key", FIELD_KEYS), None);
        assert_eq!(suggest("rename", VARIANT_KEYS), None);
    }

    #[test]
    fn misplaced_keys_are_sent_home() {
        assert_eq!(home(ID, Place::Struct), Some("the aggregate id field"));
        assert_eq!(home(ID, Place::Enum), Some("the aggregate id field"));
        assert_eq!(home(ID, Place::Variant), Some("the aggregate id field"));
        assert_eq!(home(EVENT_TYPE, Place::Enum), Some("each variant"));
        assert_eq!(home(VERSION, Place::Enum), Some("each variant"));
        assert_eq!(home(UPCAST_FROM, Place::Enum), Some("the struct that a newtype variant holds"));
        assert_eq!(home(AGGREGATE, Place::Variant), Some("the enum"));
        assert_eq!(home(ORDERED, Place::Variant), Some("the enum"));
        assert_eq!(home(CRATE, Place::VariantField), Some("the enum"));
        assert_eq!(home(EVENT_TYPE, Place::VariantField), Some("the variant"));
        assert_eq!(home(AGGREGATE, Place::Field), Some("the struct"));
        assert_eq!(home(UPCAST_FROM, Place::Field), Some("the struct"));
        assert_eq!(home("topic", Place::Struct), None);
        assert_eq!(home("agregate", Place::Enum), None);
    }
}
