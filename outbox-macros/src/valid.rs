//! Rules over the parsed attributes: what the names may look like, what must be present, the
//! shape of the input. Produces the fully checked [`Event`] that `expand` turns into code.

use syn::{Generics, Ident, LitStr};

use crate::ast::{Data, Field, Input};
use crate::attr::Value;
use crate::ctxt::Ctxt;

/// Longest accepted aggregate or event type, in characters.
pub const MAX_NAME_LEN: usize = 128;

/// Everything `expand` needs, all of it checked.
pub struct Event<'a> {
    pub ident: &'a Ident,
    pub generics: &'a Generics,
    pub aggregate: &'a LitStr,
    pub event_type: &'a LitStr,
    pub id: &'a Field<'a>,
    /// `None`: the default `::outbox_runtime`.
    pub krate: Option<&'a syn::Path>,
}

/// Checks `input`, recording every violation. `None` only if something was recorded.
pub fn check<'a>(cx: &Ctxt, input: &'a Input<'a>) -> Option<Event<'a>> {
    let ident = input.ident;
    let attrs = &input.attrs;
    let aggregate = checked_name(cx, &attrs.aggregate, "aggregate");
    let event_type = checked_name(cx, &attrs.event_type, "event type");
    let krate = match &attrs.krate {
        Value::Absent => Some(None),
        Value::Given(path) => Some(Some(path)),
        Value::Invalid => None,
    };

    let fields = match &input.data {
        Data::Named(fields) => fields,
        other => {
            // The shape is the one problem worth reporting; missing keys and fields would be noise.
            shape_error(cx, ident, other);
            return None;
        }
    };

    match (&attrs.aggregate, &attrs.event_type) {
        (Value::Absent, Value::Absent) => cx.error_spanned_by(
            ident,
            format_args!(
                "missing `#[outbox(aggregate = \"...\", event_type = \"...\")]` on `{ident}`"
            ),
        ),
        (Value::Absent, _) => cx.error_spanned_by(
            ident,
            format_args!("missing `#[outbox(aggregate = \"...\")]` on `{ident}`"),
        ),
        (_, Value::Absent) => cx.error_spanned_by(
            ident,
            format_args!("missing `#[outbox(event_type = \"...\")]` on `{ident}`"),
        ),
        _ => {}
    }

    let id = id_field(cx, ident, fields);

    Some(Event {
        ident,
        generics: input.generics,
        aggregate: aggregate?,
        event_type: event_type?,
        id: id?,
        krate: krate?,
    })
}

/// The one `#[outbox(id)]` field; extra ones are reported at their `id` key.
fn id_field<'a>(cx: &Ctxt, ident: &Ident, fields: &'a [Field<'a>]) -> Option<&'a Field<'a>> {
    let mut marked = fields.iter().filter_map(|field| Some((field, field.attrs.id.as_ref()?)));
    let first = marked.next().map(|(field, _)| field);
    if let Some(first) = first {
        for (_, key) in marked {
            cx.error_spanned_by(
                key,
                format_args!(
                    "`#[outbox(id)]` is already on `{}`: an event has exactly one aggregate id field",
                    first.ident
                ),
            );
        }
    } else if fields.is_empty() {
        cx.error_spanned_by(
            ident,
            format_args!(
                "`{ident}` has no fields: an event needs an aggregate id field marked `#[outbox(id)]`"
            ),
        );
    } else {
        cx.error_spanned_by(
            ident,
            format_args!(
                "no field of `{ident}` is marked `#[outbox(id)]`: add it to the field that holds the aggregate id"
            ),
        );
    }
    first
}

fn shape_error(cx: &Ctxt, ident: &Ident, data: &Data) {
    const PREFIX: &str = "`OutboxEvent` can only be derived for structs with named fields";
    match data {
        Data::Named(_) => {}
        Data::Tuple(fields) => cx.error_spanned_by(
            fields,
            format_args!("{PREFIX}; tuple structs are not supported: name the fields"),
        ),
        Data::Unit => cx.error_spanned_by(
            ident,
            format_args!(
                "{PREFIX}; unit structs are not supported: an event needs an aggregate id field"
            ),
        ),
        Data::Enum(token) => cx.error_spanned_by(
            quote::quote!(#token #ident),
            format_args!("{PREFIX}; enums are not supported yet"),
        ),
        Data::Union(token) => cx.error_spanned_by(
            quote::quote!(#token #ident),
            format_args!("{PREFIX}; unions are not supported"),
        ),
    }
}

/// The literal if it is present and follows the grammar; errors are recorded at the literal.
fn checked_name<'a>(cx: &Ctxt, value: &'a Value<LitStr>, what: &str) -> Option<&'a LitStr> {
    let Value::Given(lit) = value else {
        return None;
    };
    match check_name(what, &lit.value()) {
        Ok(()) => Some(lit),
        Err(msg) => {
            cx.error_spanned_by(lit, msg);
            None
        }
    }
}

/// The grammar of aggregate and event types: a lowercase ASCII letter, then lowercase ASCII
/// letters, digits, `_`, `.` and `-`; at most [`MAX_NAME_LEN`] characters.
pub fn check_name(what: &str, name: &str) -> Result<(), String> {
    const RULE: &str = "use lowercase letters, digits, `_`, `.` and `-`, starting with a letter";
    let mut chars = name.chars();
    let Some(first) = chars.next() else {
        return Err(format!("{what} cannot be empty: {RULE}"));
    };
    if let Some(bad) = name.chars().find(|c| !is_name_char(*c)) {
        return Err(format!("invalid character {} in {what} {name:?}: {RULE}", show_char(bad)));
    }
    if !first.is_ascii_lowercase() {
        return Err(format!("{what} {name:?} starts with {}: {RULE}", show_char(first)));
    }
    let len = name.chars().count();
    if len > MAX_NAME_LEN {
        return Err(format!("{what} is {len} characters long, the maximum is {MAX_NAME_LEN}"));
    }
    Ok(())
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '.' | '-')
}

/// A character quoted for a message; invisible ones spelled as escapes.
fn show_char(c: char) -> String {
    if c == ' ' {
        "` ` (a space)".to_owned()
    } else {
        format!("`{}`", c.escape_debug())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_valid_names() {
        for name in ["a", "order", "order.placed", "order.placed-v2_x", "billing-v2.invoice_paid"] {
            assert_eq!(check_name("event type", name), Ok(()), "{name}");
        }
        let longest = "a".repeat(MAX_NAME_LEN);
        assert_eq!(check_name("event type", &longest), Ok(()));
    }

    #[test]
    fn rejects_empty() {
        assert!(check_name("aggregate", "").unwrap_err().starts_with("aggregate cannot be empty"));
    }

    #[test]
    fn names_the_first_invalid_character() {
        assert_eq!(
            check_name("event type", "Order.placed").unwrap_err(),
            "invalid character `O` in event type \"Order.placed\": use lowercase letters, digits, `_`, `.` and `-`, starting with a letter"
        );
        assert!(check_name("aggregate", "order placed").unwrap_err().contains("` ` (a space)"));
        assert!(check_name("aggregate", "order/x").unwrap_err().contains("`/`"));
        assert!(check_name("aggregate", "ordér").unwrap_err().contains("`é`"));
        assert!(check_name("aggregate", "a\tb").unwrap_err().contains("`\\t`"));
    }

    #[test]
    fn must_start_with_a_letter() {
        for name in ["1order", "_order", ".order", "-order"] {
            let err = check_name("aggregate", name).unwrap_err();
            assert!(err.contains("starts with"), "{name}: {err}");
        }
    }

    #[test]
    fn rejects_long_names() {
        let long = "a".repeat(MAX_NAME_LEN + 1);
        assert_eq!(
            check_name("aggregate", &long).unwrap_err(),
            "aggregate is 129 characters long, the maximum is 128"
        );
    }
}
