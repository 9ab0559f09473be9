//! Syntax of `#[outbox(...)]`: one pass over the attributes, every problem recorded in the `Ctxt`.
//!
//! Everything one key can tell on its own is checked here: known key, taken on this item, not
//! repeated, right kind of value, names following the grammar. Rules spanning several
//! attributes live in `valid.rs`.

mod keys;
pub mod serde;
mod value;

use syn::meta::ParseNestedMeta;
use syn::{Attribute, Ident, LitInt, LitStr, Meta, TypePath};

pub use self::keys::Place;
use self::keys::{known_key, unknown_key};
use self::value::{
    crate_path, flag, mentions_crate, skip_value, string_value, type_value, valid_name,
    version_value,
};
use crate::ctxt::Ctxt;
use crate::symbol::{AGGREGATE, CRATE, EVENT_TYPE, ID, ORDERED, OUTBOX, UPCAST_FROM, VERSION};

/// `#[outbox(...)]` on the struct, or on the enum of an event family (which takes only
/// `aggregate`, `ordered` and `crate`).
#[derive(Default)]
pub struct Container {
    /// `aggregate = "..."`, following the name grammar.
    pub aggregate: Value<LitStr>,
    /// `event_type = "..."`, following the name grammar.
    pub event_type: Value<LitStr>,
    /// `version = N`.
    pub version: Value<Version>,
    /// `upcast_from = Type`.
    pub upcast_from: Value<TypePath>,
    /// `crate = "..."`, parsed as a path whose tokens carry the literal's span.
    pub krate: Value<syn::Path>,
    /// The `ordered` flag.
    pub ordered: bool,
    /// Some `#[outbox]` attribute could not be read to its end (already reported), so a key
    /// may be there unseen: "missing key" errors would be guesses.
    pub incomplete: bool,
}

/// `#[outbox(...)]` on a variant of an event family.
#[derive(Default)]
pub struct Variant {
    /// `event_type = "..."`, following the name grammar.
    pub event_type: Value<LitStr>,
    /// `version = N`; only a struct variant takes it (checked in `valid`, which knows the shape).
    pub version: Value<Version>,
    /// The `upcast_from` key, which no variant takes: what to write instead depends on the
    /// variant's shape, so `valid` reports it.
    pub upcast_from: Option<Ident>,
    /// As [`Container::incomplete`].
    pub incomplete: bool,
}

/// `#[outbox(...)]` on a field.
#[derive(Default)]
pub struct Field {
    /// The `id` key, when the field is marked as the aggregate id.
    pub id: Option<Ident>,
    /// An `#[outbox]` attribute here was unreadable or had a misspelled `id` (already reported):
    /// the field may be meant as the id.
    pub maybe_id: bool,
    /// The `#[serde(...)]` keys that can keep the field out of the payload or from being read
    /// back from it (`skip` and its kin), which the id field cannot have.
    pub serde_skips: Vec<Ident>,
}

/// `version = N`, with N from 1 to `u32::MAX`.
pub struct Version {
    pub key: Ident,
    pub lit: LitInt,
    pub value: u32,
}

/// One key's value, as far as a single attribute can tell.
#[derive(Default)]
pub enum Value<T> {
    /// The key is not there.
    #[default]
    Absent,
    /// The key is there (or was likely meant) but unusable; the error is already recorded.
    Invalid,
    /// The key and a well-formed value (the first, when the key is repeated).
    Given(T),
}

impl<T> Value<T> {
    /// Keeps the first occurrence of a key.
    fn set(&mut self, value: Option<T>) {
        if let Value::Absent = self {
            *self = match value {
                Some(value) => Value::Given(value),
                None => Value::Invalid,
            };
        }
    }
}

impl Container {
    /// `place` is [`Place::Struct`] or [`Place::Enum`].
    pub fn from_attrs(cx: &Ctxt, attrs: &[Attribute], place: Place) -> Self {
        let mut out = Container::default();
        let mut seen = Seen::default();
        out.incomplete = !parse_outbox_attrs(cx, attrs, |meta| {
            let Some(key) = known_key(&meta, place) else {
                // A misspelled key counts as that key given badly: no "missing" error on top.
                match unknown_key(cx, &meta, place)? {
                    Some(AGGREGATE) => out.aggregate.set(None),
                    Some(EVENT_TYPE) => out.event_type.set(None),
                    Some(VERSION) => out.version.set(None),
                    Some(UPCAST_FROM) => out.upcast_from.set(None),
                    Some(CRATE) => out.krate.set(None),
                    _ => {}
                }
                return Ok(());
            };
            seen.check(cx, key);
            if key == AGGREGATE {
                let lit = string_value(cx, &meta, AGGREGATE)?;
                out.aggregate.set(lit.filter(|lit| valid_name(cx, lit, "aggregate")));
            } else if key == EVENT_TYPE {
                let lit = string_value(cx, &meta, EVENT_TYPE)?;
                out.event_type.set(lit.filter(|lit| valid_name(cx, lit, "event type")));
            } else if key == VERSION {
                out.version.set(version_value(cx, &meta, key)?);
            } else if key == UPCAST_FROM {
                out.upcast_from.set(type_value(cx, &meta, UPCAST_FROM)?);
            } else if key == CRATE {
                let path = string_value(cx, &meta, CRATE)?.and_then(|lit| crate_path(cx, &lit));
                out.krate.set(path);
            } else if key == ORDERED {
                flag(cx, &meta, ORDERED)?;
                out.ordered = true;
            }
            Ok(())
        });
        if out.incomplete && attrs.iter().any(mentions_crate) {
            // The unread rest may hold `crate = "..."`: do not guess the default path.
            out.krate.set(None);
        }
        out
    }
}

impl Variant {
    pub fn from_attrs(cx: &Ctxt, attrs: &[Attribute]) -> Self {
        let mut out = Variant::default();
        let mut seen = Seen::default();
        out.incomplete = !parse_outbox_attrs(cx, attrs, |meta| {
            if let Some(key) = meta.path.get_ident().filter(|key| *key == UPCAST_FROM) {
                seen.check(cx, key);
                out.upcast_from.get_or_insert_with(|| key.clone());
                skip_value(meta.input)?;
                return Ok(());
            }
            let Some(key) = known_key(&meta, Place::Variant) else {
                match unknown_key(cx, &meta, Place::Variant)? {
                    Some(EVENT_TYPE) => out.event_type.set(None),
                    Some(VERSION) => out.version.set(None),
                    _ => {}
                }
                return Ok(());
            };
            seen.check(cx, key);
            if key == EVENT_TYPE {
                let lit = string_value(cx, &meta, EVENT_TYPE)?;
                out.event_type.set(lit.filter(|lit| valid_name(cx, lit, "event type")));
            } else if key == VERSION {
                out.version.set(version_value(cx, &meta, key)?);
            }
            Ok(())
        });
        out
    }
}

impl Field {
    /// `place` is [`Place::Field`] or [`Place::VariantField`].
    pub fn from_attrs(cx: &Ctxt, attrs: &[Attribute], place: Place) -> Self {
        let mut out = Field::default();
        let mut seen = Seen::default();
        let complete = parse_outbox_attrs(cx, attrs, |meta| {
            let Some(key) = known_key(&meta, place) else {
                if unknown_key(cx, &meta, place)? == Some(ID) {
                    out.maybe_id = true;
                }
                return Ok(());
            };
            seen.check(cx, key);
            if !value::at_end(meta.input) {
                let args = skip_value(meta.input)?;
                cx.error_spanned_by(args, "`id` takes no arguments: write `#[outbox(id)]`");
            }
            out.id.get_or_insert_with(|| key.clone());
            Ok(())
        });
        out.maybe_id |= !complete;
        out.serde_skips = serde::field_skips(attrs);
        out
    }
}

/// Runs `each` on every key of every `#[outbox(...)]` in `attrs`. Returns `false` if some
/// attribute could not be read to its end (the error is recorded).
fn parse_outbox_attrs(
    cx: &Ctxt,
    attrs: &[Attribute],
    mut each: impl FnMut(ParseNestedMeta) -> syn::Result<()>,
) -> bool {
    let mut complete = true;
    for attr in attrs.iter().filter(|attr| attr.path().is_ident(OUTBOX)) {
        let result = match &attr.meta {
            Meta::List(_) => attr.parse_nested_meta(&mut each),
            Meta::Path(meta) => Err(syn::Error::new_spanned(
                meta,
                "`#[outbox]` needs keys in parentheses: `#[outbox(...)]`",
            )),
            Meta::NameValue(meta) => Err(syn::Error::new_spanned(
                meta,
                "expected `#[outbox(...)]`, found `#[outbox = ...]`",
            )),
        };
        if let Err(err) = result {
            cx.syn_error(err);
            complete = false;
        }
    }
    complete
}

/// Keys already seen on one item, to report the second occurrence of a key.
#[derive(Default)]
struct Seen(Vec<String>);

impl Seen {
    /// Records `key`, reporting it when it was already seen.
    fn check(&mut self, cx: &Ctxt, key: &Ident) {
        let name = key.to_string();
        if self.0.contains(&name) {
            cx.error_spanned_by(key, format_args!("duplicate `{name}`"));
        } else {
            self.0.push(name);
        }
    }
}
