//! Rules of an event family, an enum: each variant is one event type of the enum's aggregate,
//! either a newtype around an event struct or a struct variant with an id field of its own.
//! What the derive cannot see (a newtype variant's struct agreeing with the family) is checked
//! by the generated code.

use quote::quote;
use syn::token::Enum;
use syn::{Ident, LitStr, Type};

use super::{given, id_field, version, Content, Variant};
use crate::ast::{self, Field, Input, Shape};
use crate::attr::{self, Value};
use crate::ctxt::Ctxt;

/// Checks the enum and its variants, recording every violation.
pub fn check<'a>(
    cx: &Ctxt,
    input: &'a Input<'a>,
    token: &Enum,
    variants: &'a [ast::Variant<'a>],
) -> Option<Vec<Variant<'a>>> {
    let ident = input.ident;
    let attrs = &input.attrs;
    if matches!(attrs.aggregate, Value::Absent) && !attrs.incomplete {
        cx.error_spanned_by(
            ident,
            format_args!("missing `#[outbox(aggregate = \"...\")]` on `{ident}`"),
        );
    }
    if !input.generics.params.is_empty() {
        // The checks between the family and its variants' structs are constants, which cannot
        // depend on the enum's parameters.
        cx.error_spanned_by(
            input.generics,
            "an event family cannot be generic: its variants are checked against each other at compile time, on concrete types",
        );
    }
    if variants.is_empty() {
        cx.error_spanned_by(
            quote!(#token #ident),
            format_args!("`{ident}` has no variants: an event family has a variant per event type"),
        );
        return None;
    }
    let mut event_types = EventTypes::default();
    let checked: Vec<Option<Variant>> = variants
        .iter()
        .map(|variant| {
            event_types.check(cx, variant);
            check_variant(cx, ident, variant)
        })
        .collect();
    checked.into_iter().collect()
}

fn check_variant<'a>(
    cx: &Ctxt,
    family: &Ident,
    variant: &'a ast::Variant<'a>,
) -> Option<Variant<'a>> {
    let ident = variant.ident;
    let attrs = &variant.attrs;
    if !usable_shape(cx, variant) {
        // The shape is the one problem worth reporting; a missing key would be noise.
        return None;
    }
    if matches!(attrs.event_type, Value::Absent) && !attrs.incomplete {
        cx.error_spanned_by(
            ident,
            format_args!("missing `#[outbox(event_type = \"...\")]` on variant `{ident}`"),
        );
    }
    let content = match &variant.shape {
        Shape::Newtype(ty, field) => newtype(cx, attrs, ty, field),
        Shape::Struct(fields) => struct_variant(cx, family, ident, attrs, fields),
        Shape::Unit | Shape::Tuple(_) => None,
    };
    Some(Variant { ident, event_type: given(&attrs.event_type)?, content: content? })
}

/// A newtype or struct variant; any other is reported.
fn usable_shape(cx: &Ctxt, variant: &ast::Variant) -> bool {
    let ident = variant.ident;
    match &variant.shape {
        Shape::Newtype(..) | Shape::Struct(_) => true,
        Shape::Unit => {
            cx.error_spanned_by(
                ident,
                format_args!(
                    "unit variant `{ident}` holds no event: make it a newtype variant around an event struct, or a struct variant with an `#[outbox(id)]` field"
                ),
            );
            false
        }
        Shape::Tuple(fields) => {
            cx.error_spanned_by(
                fields,
                format_args!(
                    "a variant of an event family holds one event struct: make `{ident}` a newtype variant, `{ident}(Event)`, or a struct variant with named fields"
                ),
            );
            false
        }
    }
}

/// `V(Event)`: the struct carries the id, the version and the chain.
fn newtype<'a>(
    cx: &Ctxt,
    attrs: &attr::Variant,
    ty: &'a Type,
    field: &attr::Field,
) -> Option<Content<'a>> {
    if let Value::Given(version) = &attrs.version {
        let (key, lit) = (&version.key, &version.lit);
        cx.error_spanned_by(
            quote!(#key = #lit),
            "the version of a newtype variant is its struct's: declare it on the struct",
        );
    }
    if let Some(key) = &attrs.upcast_from {
        cx.error_spanned_by(
            key,
            "`upcast_from` goes on the struct that the variant holds: the variant reads every version its struct reads",
        );
    }
    if let Some(key) = &field.id {
        cx.error_spanned_by(
            key,
            "the aggregate id of a newtype variant is its struct's: mark a field of the struct `#[outbox(id)]`",
        );
    }
    Some(Content::Newtype(ty))
}

/// `V { ... }`: an event type of the family's own, one version only.
fn struct_variant<'a>(
    cx: &Ctxt,
    family: &Ident,
    ident: &Ident,
    attrs: &attr::Variant,
    fields: &'a [Field<'a>],
) -> Option<Content<'a>> {
    if let Some(key) = &attrs.upcast_from {
        cx.error_spanned_by(
            key,
            "a struct variant has no type to upcast into: make it a newtype variant around a struct that declares `upcast_from`",
        );
    }
    let version = version(&attrs.version);
    let id = id_field(cx, ident, &format!("{family}::{ident}"), fields);
    Some(Content::Struct { version: version?, id: id? })
}

/// The event types declared so far, to report one declared again at its later literal.
#[derive(Default)]
struct EventTypes<'a>(Vec<(String, &'a Ident)>);

impl<'a> EventTypes<'a> {
    fn check(&mut self, cx: &Ctxt, variant: &'a ast::Variant<'a>) {
        let Value::Given(lit) = &variant.attrs.event_type else {
            return;
        };
        let name = lit.value();
        match self.0.iter().find(|(earlier, _)| *earlier == name) {
            Some((_, first)) => duplicate(cx, lit, first),
            None => self.0.push((name, variant.ident)),
        }
    }
}

fn duplicate(cx: &Ctxt, lit: &LitStr, first: &Ident) {
    cx.error_spanned_by(
        lit,
        format_args!(
            "duplicate event type {:?}: variant `{first}` has it already, and each variant is an event type of its own",
            lit.value()
        ),
    );
}
