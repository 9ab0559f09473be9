//! Code generation for a checked [`Event`]. Never reports user-facing errors: `valid` did.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned, ToTokens};
use syn::{GenericParam, Generics, Type, WherePredicate};

use crate::valid::Event;

pub fn expand(event: &Event) -> TokenStream {
    let Event { ident, generics, aggregate, event_type, id, krate } = event;
    let krate = runtime_path(*krate);
    let (impl_generics, ty_generics, _) = generics.split_for_impl();
    let user_bounds = user_bounds(generics);
    let display_bound = display_bound(id.ty);
    // A concrete type's serde impls are checked by the trait's supertraits, at the impl's self
    // type (the struct name), with serde's own hints. A generic type needs them as bounds.
    let serde_bound = has_type_params(generics).then(|| {
        quote_spanned! {ident.span()=>
            Self: #krate::__private::serde::Serialize
                + #krate::__private::serde::de::DeserializeOwned,
        }
    });
    let member = id.ident;

    quote! {
        const _: () = {
            #[automatically_derived]
            impl #impl_generics #krate::OutboxEvent for #ident #ty_generics
            where
                #(#user_bounds,)*
                #serde_bound
                #display_bound
            {
                const AGGREGATE_TYPE: &'static str = #aggregate;
                const EVENT_TYPE: &'static str = #event_type;

                #[inline]
                fn aggregate_id(&self) -> ::std::string::String {
                    #krate::__private::aggregate_id(&self.#member)
                }
            }
        };
    }
}

/// The runtime crate: `crate = "..."` if given, else `::outbox_runtime`.
pub fn runtime_path(krate: Option<&syn::Path>) -> TokenStream {
    match krate {
        Some(path) => path.to_token_stream(),
        None => quote!(::outbox_runtime),
    }
}

/// The where-clause predicates the user wrote on the struct.
pub fn user_bounds(generics: &Generics) -> impl Iterator<Item = &WherePredicate> {
    generics.where_clause.iter().flat_map(|clause| clause.predicates.iter())
}

/// `Ty: ::core::fmt::Display`, spanned so that rustc underlines the whole field type: the bound's
/// path starts at the type's first token and ends at its last.
fn display_bound(ty: &Type) -> TokenStream {
    let mut tokens = ty.to_token_stream().into_iter();
    let first = tokens.next().map_or_else(Span::call_site, |tt| tt.span());
    let last = tokens.last().map_or(first, |tt| tt.span());
    let head = quote_spanned!(first=> ::core::fmt);
    let tail = quote_spanned!(last=> ::Display);
    quote!(#ty: #head #tail)
}

fn has_type_params(generics: &Generics) -> bool {
    generics
        .params
        .iter()
        .any(|param| matches!(param, GenericParam::Type(_) | GenericParam::Const(_)))
}
