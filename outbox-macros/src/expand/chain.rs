//! A struct with `upcast_from = Previous`: it reads every version of its chain, each stored
//! payload decoded by the struct of its version and converted up one version at a time.
//!
//! What the derive cannot see is the predecessor's own derive: its aggregate, event type and
//! version, and the conversion. Generated constants check them, every token at the
//! `upcast_from` type, so each broken rule is reported there.

use proc_macro2::{Literal, TokenStream};
use quote::{quote, quote_spanned};
use syn::TypePath;

use super::{fails_if, respan, At};
use crate::valid::{Event, Struct};

/// The oldest version the chain reads: the predecessor's.
pub fn oldest(krate: &TokenStream, previous: &TypePath) -> TokenStream {
    let span = At::of(previous).first;
    quote_spanned! {span=>
        <#previous as #krate::OutboxEvent>::EVENT_TYPES[0].oldest_version()
    }
}

/// `OutboxEvent::__read`: this version decoded, an older one read by the predecessor and upcast,
/// a newer one refused.
pub fn read(krate: &TokenStream, previous: &TypePath, version: u32) -> TokenStream {
    let at = At::of(previous);
    let span = at.first;
    let version = Literal::u32_unsuffixed(version);
    let read_previous = quote_spanned! {span=>
        <#previous as #krate::OutboxEvent>::__read(event_type, version, payload)?
    };
    let upcast = {
        let krate = respan(krate.clone(), span);
        let close = quote_spanned!(at.last=> >);
        quote_spanned!(span=> #krate::__private::upcast::<#previous, Self #close(previous))
    };
    quote! {
        #[inline]
        fn __read(
            event_type: &str,
            version: u32,
            payload: &str,
        ) -> ::core::result::Result<Self, #krate::__private::DecodeError> {
            if version == #version {
                return #krate::__private::decode::<Self>(payload);
            }
            // The relay never asks for a newer version; a direct caller learns it from `Self`,
            // not from the oldest struct of the chain.
            if version > #version {
                return ::core::result::Result::Err(
                    #krate::__private::unknown_version::<Self>(event_type, version),
                );
            }
            let previous = #read_previous;
            #upcast
        }
    }
}

/// The rules between a struct and its predecessor, as constants that fail to compile.
pub fn checks(
    krate: &TokenStream,
    event: &Event,
    event_struct: &Struct,
    previous: &TypePath,
) -> TokenStream {
    let at = At::of(previous);
    let span = at.first;
    let krate = &respan(krate.clone(), span);
    let name = event.ident;
    let aggregate = event.aggregate;
    let event_type = event_struct.event_type;
    let version = event_struct.version;
    // `valid` made sure of a version above 1.
    let expected = version.saturating_sub(1);
    let (version_lit, expected_lit) =
        (Literal::u32_unsuffixed(version), Literal::u32_unsuffixed(expected));
    let str_eq = quote_spanned!(span=> #krate::__private::str_eq);
    let previous_event = quote_spanned!(span=> <#previous as #krate::OutboxEvent>);
    let entry = quote_spanned!(span=> #previous_event::EVENT_TYPES[0]);
    // The entry's checks only make sense, and only index safely, for a struct.
    let one = quote_spanned!(span=>
        #previous_event::EVENT_TYPES.len() == 1 && !#previous_event::__FAMILY
    );
    let rules = [
        fails_if(
            at,
            quote_spanned!(span=> !#str_eq(#previous_event::AGGREGATE_TYPE, #aggregate)),
            &format!(
                "the predecessor of `{name}` has another aggregate type: `upcast_from` names the previous version of this event, of aggregate {:?}",
                aggregate.value()
            ),
        ),
        fails_if(
            at,
            quote_spanned!(span=> !(#one)),
            &format!(
                "the predecessor of `{name}` is an event family: `upcast_from` names the struct of the previous version"
            ),
        ),
        fails_if(
            at,
            quote_spanned!(span=> #one && !#str_eq(#entry.name(), #event_type)),
            &format!(
                "the predecessor of `{name}` has another event type: `upcast_from` names the previous version of {:?}",
                event_type.value()
            ),
        ),
        fails_if(
            at,
            quote_spanned!(span=> #one && #entry.version() >= #version_lit),
            &format!(
                "the predecessor of `{name}` is not an older version: it must be version {expected}, one below `{name}`'s {version}"
            ),
        ),
        fails_if(
            at,
            quote_spanned!(span=> #one && #entry.version() < #expected_lit),
            &format!(
                "the predecessor of `{name}` is more than one version older: it must be version {expected}, one below `{name}`'s {version}; give each version in between a struct"
            ),
        ),
    ];
    // Instantiating the conversion check requires the conversion.
    let close = quote_spanned!(at.last=> >);
    let converts = quote_spanned! {span=>
        const _: fn() = #krate::__private::assert_upcast::<#previous, #name #close;
    };
    quote! {
        #(#rules)*
        #converts
    }
}

#[cfg(test)]
mod tests {
    use syn::parse_quote;

    fn derive(input: syn::DeriveInput) -> String {
        crate::derive(&input).to_string()
    }

    #[test]
    fn a_struct_without_predecessor_reads_its_own_version() {
        let out = derive(parse_quote! {
            #[outbox(aggregate = "order", event_type = "order.placed", version = 3)]
            struct OrderPlaced { #[outbox(id)] order_id: u64 }
        });
        assert!(out.contains(r#"EventType :: new ("order.placed" , 3 , 3 , false)"#), "{out}");
        assert!(out.contains("pub const VERSION : u32 = 3"), "{out}");
        // The trait's default `__read` reads the one version.
        assert!(!out.contains("__read"), "{out}");
        assert!(!out.contains("panic"), "{out}");
    }

    #[test]
    fn a_chain_reads_older_versions_through_its_predecessor() {
        let out = derive(parse_quote! {
            #[outbox(aggregate = "order", event_type = "order.placed", version = 2, upcast_from = v1::OrderPlaced)]
            struct OrderPlaced { #[outbox(id)] order_id: u64 }
        });
        let previous = "< v1 :: OrderPlaced as :: outbox_runtime :: OutboxEvent >";
        assert!(
            out.contains(&format!(
                r#"EventType :: new ("order.placed" , 2 , {previous} :: EVENT_TYPES [0] . oldest_version () , false)"#
            )),
            "{out}"
        );
        assert!(out.contains("if version == 2 { return :: outbox_runtime :: __private :: decode :: < Self > (payload) ; }"), "{out}");
        assert!(out.contains("if version > 2 { return :: core :: result :: Result :: Err (:: outbox_runtime :: __private :: unknown_version :: < Self > (event_type , version) ,) ; }"), "{out}");
        assert!(out.contains(&format!("{previous} :: __read (event_type , version , payload) ?")));
        assert!(out.contains("__private :: upcast :: < v1 :: OrderPlaced , Self > (previous)"));
        assert!(out.contains("__private :: assert_upcast :: < v1 :: OrderPlaced , OrderPlaced >"));
    }

    #[test]
    fn the_rules_between_versions_are_constants_naming_the_versions() {
        let out = derive(parse_quote! {
            #[outbox(aggregate = "order", event_type = "order.placed", version = 5, upcast_from = OrderPlacedV4)]
            struct OrderPlaced { #[outbox(id)] order_id: u64 }
        });
        let previous = "< OrderPlacedV4 as :: outbox_runtime :: OutboxEvent >";
        let one = format!("{previous} :: EVENT_TYPES . len () == 1 && ! {previous} :: __FAMILY");
        for check in [
            format!(
                r#"! :: outbox_runtime :: __private :: str_eq ({previous} :: AGGREGATE_TYPE , "order")"#
            ),
            format!("! ({one})"),
            format!(
                r#"{one} && ! :: outbox_runtime :: __private :: str_eq ({previous} :: EVENT_TYPES [0] . name () , "order.placed")"#
            ),
            format!("{one} && {previous} :: EVENT_TYPES [0] . version () >= 5"),
            format!("{one} && {previous} :: EVENT_TYPES [0] . version () < 4"),
        ] {
            assert!(out.contains(&format!("const _ : () = if {check} {{")), "{check}\n{out}");
        }
        assert!(out.contains("it must be version 4, one below `OrderPlaced`'s 5"), "{out}");
        assert!(out.contains(r#"of aggregate \"order\""#), "{out}");
    }
}
