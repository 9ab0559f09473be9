//! Syntax of `#[outbox(...)]`: one pass over the attributes, every problem recorded in the `Ctxt`.
//!
//! Only the shape of each key is checked here (known key, not repeated, right kind of value).
//! What the values mean, and rules spanning several attributes, live in `valid.rs`.

use proc_macro2::{TokenStream, TokenTree};
use syn::meta::ParseNestedMeta;
use syn::parse::ParseStream;
use syn::{Attribute, Ident, LitStr, Token};

use crate::ctxt::Ctxt;
use crate::symbol::{AGGREGATE, CONTAINER_KEYS, CRATE, EVENT_TYPE, FIELD_KEYS, ID, OUTBOX};

/// `#[outbox(...)]` on the struct.
#[derive(Default)]
pub struct Container {
    pub aggregate: Value<LitStr>,
    /// `event_type = "..."`.
    pub event_type: Value<LitStr>,
    /// `crate = "..."`, parsed as a path whose tokens carry the literal's span.
    pub krate: Value<syn::Path>,
}

/// One key's value, as far as syntax goes.
#[derive(Default)]
pub enum Value<T> {
    /// The key is not there.
    #[default]
    Absent,
    /// The key is there but its value is unusable; the error is already recorded.
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

/// `#[outbox(...)]` on a field.
#[derive(Default)]
pub struct Field {
    /// The `id` key, when the field is marked as the aggregate id.
    pub id: Option<Ident>,
}

impl Container {
    pub fn from_attrs(cx: &Ctxt, attrs: &[Attribute]) -> Self {
        let mut out = Container::default();
        let mut seen = Seen::default();
        for attr in outbox_attrs(attrs) {
            let result = attr.parse_nested_meta(|meta| {
                let Some(key) = meta.path.get_ident() else {
                    return unknown_key(cx, &meta, KeyPlace::Container);
                };
                if key == AGGREGATE {
                    seen.check(cx, key);
                    out.aggregate.set(string_value(cx, &meta, AGGREGATE)?);
                } else if key == EVENT_TYPE {
                    seen.check(cx, key);
                    out.event_type.set(string_value(cx, &meta, EVENT_TYPE)?);
                } else if key == CRATE {
                    seen.check(cx, key);
                    let path = string_value(cx, &meta, CRATE)?.and_then(|lit| crate_path(cx, &lit));
                    out.krate.set(path);
                } else {
                    return unknown_key(cx, &meta, KeyPlace::Container);
                }
                Ok(())
            });
            if let Err(err) = result {
                cx.syn_error(err);
                // The rest of this attribute was not read; a `crate` key may be in it.
                if mentions_crate(attr) {
                    out.krate.set(None);
                }
            }
        }
        out
    }
}

impl Field {
    pub fn from_attrs(cx: &Ctxt, attrs: &[Attribute]) -> Self {
        let mut out = Field::default();
        let mut seen = Seen::default();
        for attr in outbox_attrs(attrs) {
            let result = attr.parse_nested_meta(|meta| {
                let Some(key) = meta.path.get_ident() else {
                    return unknown_key(cx, &meta, KeyPlace::Field);
                };
                if key != ID {
                    return unknown_key(cx, &meta, KeyPlace::Field);
                }
                seen.check(cx, key);
                if !at_end(meta.input) {
                    let args = skip_value(meta.input)?;
                    cx.error_spanned_by(args, "`id` takes no arguments: write `#[outbox(id)]`");
                }
                out.id.get_or_insert_with(|| key.clone());
                Ok(())
            });
            if let Err(err) = result {
                cx.syn_error(err);
            }
        }
        out
    }
}

fn outbox_attrs(attrs: &[Attribute]) -> impl Iterator<Item = &Attribute> {
    attrs.iter().filter(|attr| attr.path().is_ident(OUTBOX))
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

#[derive(Clone, Copy)]
enum KeyPlace {
    Container,
    Field,
}

/// Reports an unknown key at the key, skips its value and goes on with the next key.
fn unknown_key(cx: &Ctxt, meta: &ParseNestedMeta, place: KeyPlace) -> syn::Result<()> {
    let name = path_to_string(&meta.path);
    let msg = match place {
        KeyPlace::Container if FIELD_KEYS.contains(&name.as_str()) => {
            format!("`{name}` goes on the aggregate id field, not on the struct")
        }
        KeyPlace::Field if CONTAINER_KEYS.contains(&name.as_str()) => {
            format!("`{name}` goes on the struct, not on a field")
        }
        KeyPlace::Container => unknown_key_message("outbox attribute", &name, CONTAINER_KEYS),
        KeyPlace::Field => unknown_key_message("outbox field attribute", &name, FIELD_KEYS),
    };
    cx.error_spanned_by(&meta.path, msg);
    skip_value(meta.input)?;
    Ok(())
}

fn unknown_key_message(what: &str, name: &str, expected: &[&str]) -> String {
    if let Some(best) = suggest(name, expected) {
        return format!("unknown {what} `{name}`, did you mean `{best}`?");
    }
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

/// Reads `= "..."` after `key`. Records a spanned error and returns `None` for anything else.
fn string_value(cx: &Ctxt, meta: &ParseNestedMeta, key: &str) -> syn::Result<Option<LitStr>> {
    let input = meta.input;
    if at_end(input) {
        cx.error_spanned_by(&meta.path, format_args!("`{key}` needs a value: `{key} = \"...\"`"));
        return Ok(None);
    }
    if !input.peek(Token![=]) {
        let rest = skip_value(input)?;
        cx.error_spanned_by(rest, format_args!("expected `{key} = \"...\"`"));
        return Ok(None);
    }
    let eq: Token![=] = input.parse()?;
    if input.peek(LitStr) {
        let lit: LitStr = input.parse()?;
        if !lit.suffix().is_empty() {
            cx.error_spanned_by(&lit, "unexpected suffix on a string literal");
            return Ok(None);
        }
        return Ok(Some(lit));
    }
    let rest = skip_value(input)?;
    let msg = format!("expected a string literal: `{key} = \"...\"`");
    if rest.is_empty() {
        cx.error_spanned_by(eq, msg);
    } else {
        cx.error_spanned_by(rest, msg);
    }
    Ok(None)
}

/// Parses the value of `crate = "..."` as a module path, spanned at the literal.
fn crate_path(cx: &Ctxt, lit: &LitStr) -> Option<syn::Path> {
    if lit.value().trim().is_empty() {
        cx.error_spanned_by(lit, "`crate` cannot be empty: give the path of `outbox_runtime`");
        return None;
    }
    match lit.parse_with(syn::Path::parse_mod_style) {
        Ok(path) => Some(path),
        Err(_) => {
            cx.error_spanned_by(
                lit,
                format_args!(
                    "invalid crate path {:?}: expected a path such as `my_outbox` or `::outbox_runtime`",
                    lit.value()
                ),
            );
            None
        }
    }
}

/// Whether the attribute's tokens contain a top-level `crate` key.
fn mentions_crate(attr: &Attribute) -> bool {
    let syn::Meta::List(list) = &attr.meta else {
        return false;
    };
    list.tokens.clone().into_iter().any(|tt| match tt {
        TokenTree::Ident(ident) => ident == CRATE,
        _ => false,
    })
}

/// No value follows the key: the attribute ends or the next key begins.
fn at_end(input: ParseStream) -> bool {
    input.is_empty() || input.peek(Token![,])
}

/// Consumes the tokens up to the next top-level `,` and returns them (for spanning an error).
fn skip_value(input: ParseStream) -> syn::Result<TokenStream> {
    let mut skipped = TokenStream::new();
    while !at_end(input) {
        let tt: TokenTree = input.parse()?;
        skipped.extend([tt]);
    }
    Ok(skipped)
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

    #[test]
    fn suggests_close_keys() {
        assert_eq!(suggest("agregate", CONTAINER_KEYS), Some(AGGREGATE));
        assert_eq!(suggest("aggregate_type", CONTAINER_KEYS), Some(AGGREGATE));
        assert_eq!(suggest("event-type", CONTAINER_KEYS), Some(EVENT_TYPE));
        assert_eq!(suggest("eventtype", CONTAINER_KEYS), Some(EVENT_TYPE));
        assert_eq!(suggest("event", CONTAINER_KEYS), Some(EVENT_TYPE));
        assert_eq!(suggest("crates", CONTAINER_KEYS), Some(CRATE));
        assert_eq!(suggest("ids", FIELD_KEYS), Some(ID));
    }

    #[test]
    fn no_suggestion_for_unrelated_keys() {
        assert_eq!(suggest("name", CONTAINER_KEYS), None);
        assert_eq!(suggest("topic", CONTAINER_KEYS), None);
        assert_eq!(suggest("key", FIELD_KEYS), None);
    }
}
