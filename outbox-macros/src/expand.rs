//! Code generation for a checked [`Event`]. Never reports user-facing errors: `valid` did. What
//! the derive cannot see (another type's event type, a conversion) is checked by generated
//! constants and calls, spanned at the user's tokens so rustc points there.

mod chain;
mod family;

use proc_macro2::{Group, Literal, Span, TokenStream, TokenTree};
use quote::{quote, quote_spanned, ToTokens};
use syn::{GenericParam, Generics, LitStr, Type, WherePredicate};

use crate::valid::{Event, Kind, Struct};

pub fn expand(event: &Event) -> TokenStream {
    match &event.kind {
        Kind::Struct(event_struct) => expand_struct(event, event_struct),
        Kind::Family(variants) => family::expand(event, variants),
    }
}

fn expand_struct(event: &Event, event_struct: &Struct) -> TokenStream {
    let Event { ident, generics, aggregate, krate, ordered, .. } = event;
    let Struct { event_type, version, upcast_from, id } = event_struct;
    let krate = runtime_path(*krate);
    let (impl_generics, ty_generics, where_clause) = generics.split_for_impl();
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
    let version_lit = Literal::u32_unsuffixed(*version);
    let oldest = match upcast_from {
        Some(previous) => chain::oldest(&krate, previous),
        None => version_lit.to_token_stream(),
    };
    let read = upcast_from.map(|previous| chain::read(&krate, previous, *version));
    let checks = upcast_from.map(|previous| chain::checks(&krate, event, event_struct, previous));
    let event_type_doc =
        format!(" The event type this struct is stored as: `{:?}`.", event_type.value());
    let version_doc = format!(" The version of the payload this struct writes: {version}.");

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
                const EVENT_TYPES: &'static [#krate::__private::EventType] = &[
                    #krate::__private::EventType::new(#event_type, #version_lit, #oldest, #ordered),
                ];

                #[inline]
                fn aggregate_id(&self) -> ::std::string::String {
                    #krate::__private::aggregate_id(&self.#member)
                }

                #read
            }

            // Kept from before event families, so `OrderPlaced::EVENT_TYPE` reads as it did.
            #[automatically_derived]
            impl #impl_generics #ident #ty_generics #where_clause {
                #[doc = #event_type_doc]
                pub const EVENT_TYPE: &'static str = #event_type;
                #[doc = #version_doc]
                pub const VERSION: u32 = #version_lit;
            }
        };

        #checks
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
    let at = At::of(ty);
    let head = quote_spanned!(at.first=> ::core::fmt);
    let tail = quote_spanned!(at.last=> ::Display);
    quote!(#ty: #head #tail)
}

/// Where a generated check about one of the user's types is reported: every token at the type's
/// first token, except the last token of the expression rustc points at, at the type's last. A
/// span from first to last makes rustc underline the whole type, `v1::OrderPlaced` included.
#[derive(Clone, Copy)]
struct At {
    first: Span,
    last: Span,
}

impl At {
    fn of(tokens: impl ToTokens) -> Self {
        let mut tokens = tokens.into_token_stream().into_iter();
        let first = tokens.next().map_or_else(Span::call_site, |tt| tt.span());
        let last = tokens.last().map_or(first, |tt| tt.span());
        At { first, last }
    }
}

/// A constant that fails to compile with `message` when `condition` holds, reported at `at`.
fn fails_if(at: At, condition: TokenStream, message: &str) -> TokenStream {
    // A const panic takes a literal; braces in it would be format arguments.
    let message = LitStr::new(&message.replace('{', "{{").replace('}', "}}"), at.first);
    let panic = quote_spanned!(at.first=> ::core::panic!);
    let args = quote_spanned!(at.last=> (#message));
    quote_spanned! {at.first=>
        const _: () = if #condition {
            #panic #args
        };
    }
}

/// `tokens` with every span set to `span`. Used only on the crate path, whose resolution does not
/// change: both the default path and the user's `crate = "..."` resolve at the call site. A path
/// that starts at the user's token is reported there.
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

        let chain = derive(parse_quote! {
            #[outbox(crate = "my_outbox", aggregate = "order", event_type = "order.placed")]
            #[outbox(version = 2, upcast_from = OrderPlacedV1)]
            struct OrderPlaced { #[outbox(id)] order_id: u64 }
        });
        assert!(chain.contains("my_outbox :: __private :: assert_upcast"), "{chain}");
        assert!(!chain.contains("outbox_runtime"), "{chain}");

        let family = derive(parse_quote! {
            #[outbox(crate = "my_outbox", aggregate = "order")]
            enum OrderEvent {
                #[outbox(event_type = "order.placed")]
                Placed(OrderPlaced),
                #[outbox(event_type = "order.cancelled")]
                Cancelled { #[outbox(id)] order_id: u64 },
            }
        });
        assert!(family.contains("my_outbox :: __private :: variant_payload"), "{family}");
        assert!(!family.contains("outbox_runtime"), "{family}");

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
    fn a_struct_keeps_its_inherent_constants() {
        let out = derive(parse_quote! {
            #[outbox(aggregate = "order", event_type = "order.placed")]
            struct OrderPlaced<T: Clone> where T: Copy { #[outbox(id)] order_id: u64, detail: T }
        });
        assert!(out.contains("impl < T : Clone > OrderPlaced < T > where T : Copy {"), "{out}");
        assert!(out.contains(r#"pub const EVENT_TYPE : & 'static str = "order.placed""#), "{out}");
        assert!(out.contains("pub const VERSION : u32 = 1"), "{out}");
        assert!(out.contains(r#"EventType :: new ("order.placed" , 1 , 1 , false)"#), "{out}");

        // Also in the stub, so `OrderPlaced::EVENT_TYPE` does not add an error.
        let stub = derive(parse_quote! {
            #[outbox(aggregate = "order")]
            struct OrderPlaced { #[outbox(id)] order_id: u64 }
        });
        assert!(stub.contains("compile_error"), "{stub}");
        assert!(stub.contains(r#"pub const EVENT_TYPE : & 'static str = """#), "{stub}");
        assert!(stub.contains(
            "const EVENT_TYPES : & 'static [:: outbox_runtime :: __private :: EventType] = & []"
        ));
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
        // A family's stub has no inherent constants.
        assert!(!out.contains("pub const"), "{out}");
    }
}
