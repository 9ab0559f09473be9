//! A borrowed view of the derive input, with the `#[outbox]` attributes parsed.

use syn::{
    Data as SynData, DeriveInput, Fields, FieldsNamed, FieldsUnnamed, Generics, Ident, Type,
};

use crate::attr::{self, Place};
use crate::ctxt::Ctxt;

pub struct Input<'a> {
    pub ident: &'a Ident,
    pub generics: &'a Generics,
    pub attrs: attr::Container,
    pub data: Data<'a>,
}

pub enum Data<'a> {
    /// `struct S { ... }`: an event.
    Named(Vec<Field<'a>>),
    /// `struct S(...);`
    Tuple(&'a FieldsUnnamed),
    /// `struct S;`
    Unit,
    /// `enum S { ... }`: an event family.
    Enum(&'a syn::token::Enum, Vec<Variant<'a>>),
    /// `union S { ... }`
    Union(&'a syn::token::Union),
}

pub struct Field<'a> {
    pub ident: &'a Ident,
    pub ty: &'a Type,
    pub attrs: attr::Field,
}

pub struct Variant<'a> {
    pub ident: &'a Ident,
    pub attrs: attr::Variant,
    pub shape: Shape<'a>,
}

pub enum Shape<'a> {
    /// `V { ... }`: an event of its own.
    Struct(Vec<Field<'a>>),
    /// `V(Event)`: an event struct's event.
    Newtype(&'a Type, attr::Field),
    /// `V()` or `V(A, B, ...)`
    Tuple(&'a FieldsUnnamed),
    /// `V`
    Unit,
}

impl<'a> Input<'a> {
    pub fn from_syn(cx: &Ctxt, input: &'a DeriveInput) -> Self {
        // Container first, then each variant and field, so errors come out in source order.
        let place = match input.data {
            SynData::Enum(_) => Place::Enum,
            SynData::Struct(_) | SynData::Union(_) => Place::Struct,
        };
        let attrs = attr::Container::from_attrs(cx, &input.attrs, place);
        let data = match &input.data {
            SynData::Struct(data) => match &data.fields {
                Fields::Named(fields) => Data::Named(named_fields(cx, fields, Place::Field)),
                Fields::Unnamed(fields) => Data::Tuple(fields),
                Fields::Unit => Data::Unit,
            },
            SynData::Enum(data) => {
                attr::serde::check_enum(cx, &input.attrs);
                let variants = data.variants.iter().map(|variant| Variant::from_syn(cx, variant));
                Data::Enum(&data.enum_token, variants.collect())
            }
            SynData::Union(data) => Data::Union(&data.union_token),
        };
        Input { ident: &input.ident, generics: &input.generics, attrs, data }
    }
}

impl<'a> Variant<'a> {
    fn from_syn(cx: &Ctxt, variant: &'a syn::Variant) -> Self {
        let attrs = attr::Variant::from_attrs(cx, &variant.attrs);
        attr::serde::check_variant(cx, &variant.attrs);
        let shape = match &variant.fields {
            Fields::Named(fields) => Shape::Struct(named_fields(cx, fields, Place::VariantField)),
            Fields::Unnamed(fields) => match fields.unnamed.first() {
                Some(field) if fields.unnamed.len() == 1 => Shape::Newtype(
                    &field.ty,
                    attr::Field::from_attrs(cx, &field.attrs, Place::VariantField),
                ),
                _ => Shape::Tuple(fields),
            },
            Fields::Unit => Shape::Unit,
        };
        Variant { ident: &variant.ident, attrs, shape }
    }
}

fn named_fields<'a>(cx: &Ctxt, fields: &'a FieldsNamed, place: Place) -> Vec<Field<'a>> {
    fields
        .named
        .iter()
        .filter_map(|field| {
            // Named fields always have an ident; skipping is only a fallback.
            Some(Field {
                ident: field.ident.as_ref()?,
                ty: &field.ty,
                attrs: attr::Field::from_attrs(cx, &field.attrs, place),
            })
        })
        .collect()
}
