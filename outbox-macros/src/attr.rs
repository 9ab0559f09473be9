//! Syntax of `#[outbox(...)]`: one pass over the attributes, every problem recorded in the `Ctxt`.
//!
//! Everything one key can tell on its own is checked here: known key, not repeated, right kind
//! of value, names following the grammar. Rules spanning several attributes live in `valid.rs`.

use proc_macro2::{TokenStream, TokenTree};
use syn::meta::ParseNestedMeta;
use syn::parse::ParseStream;
use syn::{Attribute, Ident, LitStr, Meta, Token};

use crate::ctxt::Ctxt;
use crate::name;
use crate::symbol::{
    AGGREGATE, CONTAINER_KEYS, CRATE, EVENT_TYPE, FIELD_KEYS, ID, ORDERED, OUTBOX,
};

/// `#[outbox(...)]` on the struct.
#[derive(Default)]
pub struct Container {
    /// `aggregate = "..."`, following the name grammar.
    pub aggregate: Value<LitStr>,
    /// `event_type = "..."`, following the name grammar.
    pub event_type: Value<LitStr>,
    /// `crate = "..."`, parsed as a path whose tokens carry the literal's span.
    pub krate: Value<syn::Path>,
    /// The `ordered` flag.
    pub ordered: bool,
    /// Some `#[outbox]` attribute could not be read to its end (already reported), so a key
    /// may be there unseen: "missing key" errors would be guesses.
    pub incomplete: bool,
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

/// `#[outbox(...)]` on a field.
#[derive(Default)]
pub struct Field {
    /// The `id` key, when the field is marked as the aggregate id.
    pub id: Option<Ident>,
    /// An `#[outbox]` attribute here was unreadable or had a misspelled `id` (already reported):
    /// the field may be meant as the id.
    pub maybe_id: bool,
}

impl Container {
    pub fn from_attrs(cx: &Ctxt, attrs: &[Attribute]) -> Self {
        let mut out = Container::default();
        let mut seen = Seen::default();
        out.incomplete = !parse_outbox_attrs(cx, attrs, |meta| {
            let Some(key) = meta.path.get_ident() else {
                unknown_key(cx, &meta, KeyPlace::Container)?;
                return Ok(());
            };
            if key == AGGREGATE {
                seen.check(cx, key);
                let lit = string_value(cx, &meta, AGGREGATE)?;
                out.aggregate.set(lit.filter(|lit| valid_name(cx, lit, "aggregate")));
            } else if key == EVENT_TYPE {
                seen.check(cx, key);
                let lit = string_value(cx, &meta, EVENT_TYPE)?;
                out.event_type.set(lit.filter(|lit| valid_name(cx, lit, "event type")));
            } else if key == CRATE {
                seen.check(cx, key);
                let path = string_value(cx, &meta, CRATE)?.and_then(|lit| crate_path(cx, &lit));
                out.krate.set(path);
            } else if key == ORDERED {
                seen.check(cx, key);
                if !at_end(meta.input) {
                    let value = skip_value(meta.input)?;
                    cx.error_spanned_by(
                        value,
                        "`ordered` takes no value: write `#[outbox(ordered)]`",
                    );
                }
                out.ordered = true;
            } else {
                // A misspelled key counts as that key given badly: no "missing" error on top.
                match unknown_key(cx, &meta, KeyPlace::Container)? {
                    Some(AGGREGATE) => out.aggregate.set(None),
                    Some(EVENT_TYPE) => out.event_type.set(None),
                    Some(CRATE) => out.krate.set(None),
                    _ => {}
                }
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

impl Field {
    pub fn from_attrs(cx: &Ctxt, attrs: &[Attribute]) -> Self {
        let mut out = Field::default();
        let mut seen = Seen::default();
        let complete = parse_outbox_attrs(cx, attrs, |meta| {
            let key = meta.path.get_ident().filter(|key| *key == ID);
            let Some(key) = key else {
                if unknown_key(cx, &meta, KeyPlace::Field)? == Some(ID) {
                    out.maybe_id = true;
                }
                return Ok(());
            };
            seen.check(cx, key);
            if !at_end(meta.input) {
                let args = skip_value(meta.input)?;
                cx.error_spanned_by(args, "`id` takes no arguments: write `#[outbox(id)]`");
            }
            out.id.get_or_insert_with(|| key.clone());
            Ok(())
        });
        out.maybe_id |= !complete;
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

#[derive(Clone, Copy)]
enum KeyPlace {
    Container,
    Field,
}

/// Reports an unknown key at the key and skips its value, so parsing goes on with the next key.
/// Returns the known key it was likely meant as, if any.
fn unknown_key(
    cx: &Ctxt,
    meta: &ParseNestedMeta,
    place: KeyPlace,
) -> syn::Result<Option<&'static str>> {
    let name = path_to_string(&meta.path);
    let (here, elsewhere, what) = match place {
        KeyPlace::Container => (CONTAINER_KEYS, FIELD_KEYS, "outbox attribute"),
        KeyPlace::Field => (FIELD_KEYS, CONTAINER_KEYS, "outbox field attribute"),
    };
    let suggestion = suggest(&name, here);
    let msg = if elsewhere.contains(&name.as_str()) {
        match place {
            KeyPlace::Container => {
                format!("`{name}` goes on the aggregate id field, not on the struct")
            }
            KeyPlace::Field => format!("`{name}` goes on the struct, not on a field"),
        }
    } else if let Some(best) = suggestion {
        format!("unknown {what} `{name}`, did you mean `{best}`?")
    } else {
        unknown_key_message(what, &name, here)
    };
    cx.error_spanned_by(&meta.path, msg);
    skip_value(meta.input)?;
    Ok(suggestion.filter(|_| !elsewhere.contains(&name.as_str())))
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

/// Checks a name against the grammar, recording the error at the literal.
fn valid_name(cx: &Ctxt, lit: &LitStr, what: &str) -> bool {
    match name::check(what, &lit.value()) {
        Ok(()) => true,
        Err(msg) => {
            cx.error_spanned_by(lit, msg);
            false
        }
    }
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

/// Whether an `#[outbox(...)]` attribute's tokens contain a top-level `crate`.
fn mentions_crate(attr: &Attribute) -> bool {
    if !attr.path().is_ident(OUTBOX) {
        return false;
    }
    let Meta::List(list) = &attr.meta else {
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
