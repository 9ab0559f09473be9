//! Rules over the whole input: its shape, the keys that must be present, the one id field.
//! Produces the fully checked [`Event`] that `expand` turns into code.

use syn::{Generics, Ident, LitStr};

use crate::ast::{Data, Field, Input};
use crate::attr::Value;
use crate::ctxt::Ctxt;

/// Everything `expand` needs, all of it checked.
pub struct Event<'a> {
    pub ident: &'a Ident,
    pub generics: &'a Generics,
    pub aggregate: &'a LitStr,
    pub event_type: &'a LitStr,
    pub id: &'a Field<'a>,
    /// `None`: the default `::outbox_runtime`.
    pub krate: Option<&'a syn::Path>,
    pub ordered: bool,
}

/// Checks `input`, recording every violation. `None` only if something was recorded.
pub fn check<'a>(cx: &Ctxt, input: &'a Input<'a>) -> Option<Event<'a>> {
    let ident = input.ident;
    let attrs = &input.attrs;
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
        _ if attrs.incomplete => {}
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
        aggregate: given(&attrs.aggregate)?,
        event_type: given(&attrs.event_type)?,
        id: id?,
        krate: krate?,
        ordered: attrs.ordered,
    })
}

fn given<T>(value: &Value<T>) -> Option<&T> {
    match value {
        Value::Given(value) => Some(value),
        Value::Absent | Value::Invalid => None,
    }
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
    } else if fields.iter().any(|field| field.attrs.maybe_id) {
        // An unreadable or misspelled field attribute was reported; it may have meant `id`.
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
