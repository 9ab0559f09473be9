//! An event family, an enum: one `EventType` per variant, in declaration order; each value
//! stored as its variant's event type, with the variant's content as the payload.
//!
//! A newtype variant is its struct's event: entry, id, payload and reading all delegate to the
//! struct, and generated constants check, at the struct's type, that it agrees with the family.
//! A struct variant is an event type of the family's own, at one version.

use proc_macro2::{Literal, TokenStream};
use quote::{quote, quote_spanned};
use syn::Type;

use super::{display_bound, fails_if, respan, runtime_path, At};
use crate::valid::{Content, Event, Variant};

pub fn expand(event: &Event, variants: &[Variant]) -> TokenStream {
    let Event { ident, aggregate, krate, ordered, .. } = event;
    let krate = runtime_path(*krate);
    let private = quote!(#krate::__private);

    let mut entries = Vec::new();
    let mut ids = Vec::new();
    let mut types = Vec::new();
    let mut payloads = Vec::new();
    let mut reads = Vec::new();
    let mut display_bounds = Vec::new();
    let mut checks = Vec::new();
    for (index, variant) in variants.iter().enumerate() {
        let Variant { ident: name, event_type, content } = variant;
        // The entry's index, and the variant's as serde numbers them: in declaration order, as
        // `valid` refused the serde attributes that would leave a variant out.
        let position = Literal::usize_unsuffixed(index);
        types.push(quote!(Self::#name { .. } => &Self::EVENT_TYPES[#position]));
        match content {
            Content::Newtype(ty) => {
                let inner = inner_event(&krate, ty);
                entries.push(quote_spanned!(At::of(ty).first=> #inner::EVENT_TYPES[0]));
                ids.push(quote!(Self::#name(__event) => #inner::aggregate_id(__event)));
                payloads.push(quote!(Self::#name(__event) => #inner::__payload(__event)));
                reads.push(quote! {
                    #event_type => #inner::__read(event_type, version, payload).map(Self::#name)
                });
                checks.push(newtype_checks(&krate, event, variant, ty));
            }
            Content::Struct { version, id } => {
                let version = Literal::u32_unsuffixed(*version);
                let member = id.ident;
                entries.push(quote! {
                    #private::EventType::new(#event_type, #version, #version, #ordered)
                });
                ids.push(quote! {
                    Self::#name { #member: __id, .. } => #private::aggregate_id(__id)
                });
                payloads.push(quote!(Self::#name { .. } => #private::variant_payload(self)));
                reads.push(quote! {
                    #event_type => if version == #version {
                        #private::decode_variant::<Self>(#position, payload)
                    } else {
                        ::core::result::Result::Err(#private::unknown_version::<Self>(event_type, version))
                    }
                });
                display_bounds.push(display_bound(id.ty));
            }
        }
    }

    quote! {
        const _: () = {
            #[automatically_derived]
            impl #krate::OutboxEvent for #ident
            where
                #(#display_bounds,)*
            {
                const AGGREGATE_TYPE: &'static str = #aggregate;
                const EVENT_TYPES: &'static [#private::EventType] = &[#(#entries,)*];
                const __FAMILY: bool = true;

                fn aggregate_id(&self) -> ::std::string::String {
                    match self {
                        #(#ids,)*
                    }
                }

                fn event_type(&self) -> &'static #private::EventType {
                    match self {
                        #(#types,)*
                    }
                }

                fn __payload(
                    &self,
                ) -> ::core::result::Result<::std::string::String, #private::InvalidEvent> {
                    match self {
                        #(#payloads,)*
                    }
                }

                fn __read(
                    event_type: &str,
                    version: u32,
                    payload: &str,
                ) -> ::core::result::Result<Self, #private::DecodeError> {
                    match event_type {
                        #(#reads,)*
                        _ => ::core::result::Result::Err(#private::unknown_event_type::<Self>(event_type)),
                    }
                }
            }
        };

        #(#checks)*
    }
}

/// `<Ty as OutboxEvent>`, at the type: a type that is no event is reported there.
fn inner_event(krate: &TokenStream, ty: &Type) -> TokenStream {
    quote_spanned!(At::of(ty).first=> <#ty as #krate::OutboxEvent>)
}

/// A newtype variant's struct agrees with the family: its aggregate, the event type the variant
/// declares, the family's `ordered`; and it is one event, not a family.
fn newtype_checks(krate: &TokenStream, event: &Event, variant: &Variant, ty: &Type) -> TokenStream {
    let at = At::of(ty);
    let span = at.first;
    let krate = &respan(krate.clone(), span);
    let family = event.ident;
    let aggregate = event.aggregate;
    let ordered = event.ordered;
    let name = format!("{family}::{}", variant.ident);
    let event_type = variant.event_type;
    let inner = inner_event(krate, ty);
    let str_eq = quote_spanned!(span=> #krate::__private::str_eq);
    let entry = quote_spanned!(span=> #inner::EVENT_TYPES[0]);
    // The entry's checks only make sense, and only index safely, for a struct.
    let one = quote_spanned!(span=> #inner::EVENT_TYPES.len() == 1 && !#inner::__FAMILY);
    let ordered_rule = if ordered {
        format!(
            "`{name}` holds an unordered event in the ordered family `{family}`: `ordered` is a property of the family, mark the struct `ordered` too"
        )
    } else {
        format!(
            "`{name}` holds an ordered event in the unordered family `{family}`: `ordered` is a property of the family, mark both `ordered` or neither"
        )
    };
    let rules = [
        fails_if(
            at,
            quote_spanned!(span=> !#str_eq(#inner::AGGREGATE_TYPE, #aggregate)),
            &format!(
                "`{name}` holds an event of another aggregate type: every event of `{family}` is of aggregate {:?}",
                aggregate.value()
            ),
        ),
        fails_if(
            at,
            quote_spanned!(span=> !(#one)),
            &format!("`{name}` holds an event family: a variant holds one event struct"),
        ),
        fails_if(
            at,
            quote_spanned!(span=> #one && !#str_eq(#entry.name(), #event_type)),
            &format!(
                "`{name}` holds an event of another event type: the variant declares {:?}, which must be its struct's event type",
                event_type.value()
            ),
        ),
        fails_if(at, quote_spanned!(span=> #one && #entry.ordered() != #ordered), &ordered_rule),
    ];
    quote!(#(#rules)*)
}

#[cfg(test)]
mod tests {
    use syn::parse_quote;

    fn derive(input: syn::DeriveInput) -> String {
        crate::derive(&input).to_string()
    }

    fn order_event() -> String {
        derive(parse_quote! {
            #[outbox(aggregate = "order", ordered)]
            enum OrderEvent {
                #[outbox(event_type = "order.placed")]
                Placed(OrderPlaced),
                #[outbox(event_type = "order.cancelled", version = 2)]
                Cancelled { reason: String, #[outbox(id)] order_id: u64 },
            }
        })
    }

    const PLACED: &str = "< OrderPlaced as :: outbox_runtime :: OutboxEvent >";

    #[test]
    fn one_entry_per_variant_in_declaration_order() {
        let out = order_event();
        assert!(!out.contains("compile_error"), "{out}");
        assert!(
            out.contains(&format!(
                r#"EVENT_TYPES : & 'static [:: outbox_runtime :: __private :: EventType] = & [{PLACED} :: EVENT_TYPES [0] , :: outbox_runtime :: __private :: EventType :: new ("order.cancelled" , 2 , 2 , true) ,]"#
            )),
            "{out}"
        );
        assert!(out.contains("Self :: Placed { .. } => & Self :: EVENT_TYPES [0]"), "{out}");
        assert!(out.contains("Self :: Cancelled { .. } => & Self :: EVENT_TYPES [1]"), "{out}");
        assert!(out.contains("u64 : :: core :: fmt :: Display"), "{out}");
        // A family has no inherent constants: it has several event types.
        assert!(!out.contains("pub const"), "{out}");
    }

    #[test]
    fn a_newtype_variant_delegates_to_its_struct() {
        let out = order_event();
        assert!(out
            .contains(&format!("Self :: Placed (__event) => {PLACED} :: aggregate_id (__event)")));
        assert!(
            out.contains(&format!("Self :: Placed (__event) => {PLACED} :: __payload (__event)"))
        );
        assert!(
            out.contains(&format!(
                r#""order.placed" => {PLACED} :: __read (event_type , version , payload) . map (Self :: Placed)"#
            )),
            "{out}"
        );
        // The family's rules for the struct, ordered included.
        assert!(
            out.contains(&format!("{PLACED} :: EVENT_TYPES [0] . ordered () != true")),
            "{out}"
        );
        assert!(out.contains("`OrderEvent::Placed` holds an unordered event in the ordered family"));
    }

    #[test]
    fn a_struct_variant_is_read_by_its_serde_index() {
        let out = order_event();
        assert!(out.contains(
            "Self :: Cancelled { order_id : __id , .. } => :: outbox_runtime :: __private :: aggregate_id (__id)"
        ));
        assert!(out.contains(
            "Self :: Cancelled { .. } => :: outbox_runtime :: __private :: variant_payload (self)"
        ));
        assert!(
            out.contains(
                r#""order.cancelled" => if version == 2 { :: outbox_runtime :: __private :: decode_variant :: < Self > (1 , payload) }"#
            ),
            "{out}"
        );
        assert!(out.contains("_ => :: core :: result :: Result :: Err (:: outbox_runtime :: __private :: unknown_event_type :: < Self > (event_type))"));
    }
}
