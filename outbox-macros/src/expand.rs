//! Code generation for a checked [`Event`]. Never reports user-facing errors: `valid` did.

use proc_macro2::{Group, Span, TokenStream, TokenTree};
use quote::{quote, quote_spanned, ToTokens};
use syn::{GenericParam, Generics, Type, WherePredicate};

use crate::valid::Event;

pub fn expand(event: &Event) -> TokenStream {
    let Event { ident, generics, aggregate, event_type, id, krate, ordered } = event;
    let krate = runtime_path(*krate);
    let (impl_generics, ty_generics, _) = generics.split_for_impl();
    let user_bounds = user_bounds(generics);
    let display_bound = display_bound(id.ty);
    // A concrete type's serde impls are checked by the trait's supertraits, at the impl's self
    // type (the struct name), with serde's own hints. A generic type needs them as bounds.
    // Every token of it at the struct name, so rustc's notes point there.
    let serde_bound = has_type_params(generics).then(|| {
        let krate = respan(krate.clone(), ident.span());
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
                const ORDERED: bool = #ordered;

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

/// `tokens` with every span set to `span`. Used only on the crate path, whose resolution does not
/// change: both the default path and the user's `crate = "..."` resolve at the call site.
fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut tt| {
            if let TokenTree::Group(group) = &tt {
                let mut inner = Group::new(group.delimiter(), respan(group.stream(), span));
                inner.set_span(span);
                tt = TokenTree::Group(inner);
            }
            tt.set_span(span);
            tt
        })
        .collect()
}

fn has_type_params(generics: &Generics) -> bool {
    generics
        .params
        .iter()
        .any(|param| matches!(param, GenericParam::Type(_) | GenericParam::Const(_)))
}

#[cfg(test)]
mod tests {
    use syn::parse_quote;

    fn derive(input: syn::DeriveInput) -> String {
        crate::derive(&input).to_string()
    }

    #[test]
    fn default_path_is_absolute() {
        let out = derive(parse_quote! {
            #[outbox(aggregate = "order", event_type = "order.placed")]
            struct OrderPlaced { #[outbox(id)] order_id: u64 }
        });
        assert!(out.contains(":: outbox_runtime :: OutboxEvent for OrderPlaced"), "{out}");
        assert!(out.contains(":: outbox_runtime :: __private :: aggregate_id (& self . order_id)"));
        assert!(out.contains("u64 : :: core :: fmt :: Display"), "{out}");
        assert!(!out.contains("compile_error"), "{out}");
        // A concrete type's serde impls are left to the trait's supertraits.
        assert!(!out.contains("Self :"), "{out}");
    }

    #[test]
    fn crate_path_replaces_every_runtime_path() {
        let ok = derive(parse_quote! {
            #[outbox(crate = "my_outbox", aggregate = "order", event_type = "order.placed")]
            struct OrderPlaced<T> { #[outbox(id)] order_id: u64, inner: T }
        });
        assert!(ok.contains("my_outbox :: __private :: serde :: Serialize"), "{ok}");
        assert!(!ok.contains("outbox_runtime"), "{ok}");

        let stub = derive(parse_quote! {
            #[outbox(crate = "my_outbox", aggregate = "order")]
            struct OrderPlaced { #[outbox(id)] order_id: u64 }
        });
        assert!(stub.contains("compile_error"), "{stub}");
        assert!(stub.contains("my_outbox :: OutboxEvent for OrderPlaced"), "{stub}");
        assert!(!stub.contains("outbox_runtime"), "{stub}");
    }

    #[test]
    fn generic_types_bound_self_on_serde() {
        let out = derive(parse_quote! {
            #[outbox(aggregate = "order", event_type = "order.placed")]
            struct Keyed<K> where K: Clone { #[outbox(id)] key: K }
        });
        assert!(out.contains("impl < K > :: outbox_runtime :: OutboxEvent for Keyed < K >"));
        assert!(out.contains("K : Clone ,"), "{out}");
        assert!(out.contains("Self : :: outbox_runtime :: __private :: serde :: Serialize"));
        assert!(out.contains(":: outbox_runtime :: __private :: serde :: de :: DeserializeOwned"));
        assert!(out.contains("K : :: core :: fmt :: Display"), "{out}");
    }

    #[test]
    fn no_stub_without_a_usable_crate_path() {
        let out = derive(parse_quote! {
            #[outbox(crate = "not a path", aggregate = "order", event_type = "order.placed")]
            struct OrderPlaced { #[outbox(id)] order_id: u64 }
        });
        assert!(out.contains("compile_error"), "{out}");
        assert!(!out.contains("impl"), "{out}");
    }

    #[test]
    fn stub_asserts_nothing() {
        let out = derive(parse_quote! {
            enum OrderChanged { Placed }
        });
        assert!(out.contains("compile_error"), "{out}");
        assert!(
            out.contains(
                "for < '__outbox > Self : :: outbox_runtime :: __private :: serde :: Serialize"
            ),
            "{out}"
        );
        assert!(!out.contains("Display"), "{out}");
    }
}
