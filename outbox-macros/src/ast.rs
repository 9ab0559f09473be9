//! A borrowed view of the derive input, with the `#[outbox]` attributes parsed.

use syn::{Data as SynData, DeriveInput, Fields, FieldsUnnamed, Generics, Ident, Type};

use crate::attr;
use crate::ctxt::Ctxt;

pub struct Input<'a> {
    pub ident: &'a Ident,
    pub generics: &'a Generics,
    pub attrs: attr::Container,
    pub data: Data<'a>,
}

pub enum Data<'a> {
    /// `struct S { ... }`: the only supported shape.
    Named(Vec<Field<'a>>),
    /// `struct S(...);`
    Tuple(&'a FieldsUnnamed),
    /// `struct S;`
    Unit,
    /// `enum S { ... }`
    Enum(&'a syn::token::Enum),
    /// `union S { ... }`
    Union(&'a syn::token::Union),
}

pub struct Field<'a> {
    pub ident: &'a Ident,
    pub ty: &'a Type,
    pub attrs: attr::Field,
}

impl<'a> Input<'a> {
    pub fn from_syn(cx: &Ctxt, input: &'a DeriveInput) -> Self {
        // Container first, so errors come out in source order.
        let attrs = attr::Container::from_attrs(cx, &input.attrs);
        let data = match &input.data {
            SynData::Struct(data) => match &data.fields {
                Fields::Named(fields) => Data::Named(
                    fields
                        .named
                        .iter()
                        .filter_map(|field| {
                            // Named fields always have an ident; skipping is only a fallback.
                            Some(Field {
                                ident: field.ident.as_ref()?,
                                ty: &field.ty,
                                attrs: attr::Field::from_attrs(cx, &field.attrs),
                            })
                        })
                        .collect(),
                ),
                Fields::Unnamed(fields) => Data::Tuple(fields),
                Fields::Unit => Data::Unit,
            },
            SynData::Enum(data) => Data::Enum(&data.enum_token),
            SynData::Union(data) => Data::Union(&data.union_token),
        };
        Input { ident: &input.ident, generics: &input.generics, attrs, data }
    }
}
