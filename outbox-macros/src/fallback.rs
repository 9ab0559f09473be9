//! What a failed derive emits: the errors, plus a stub impl so that code using the type as an
//! `OutboxEvent` (emit calls, handlers) does not pile more errors on top of the real ones.

use proc_macro2::TokenStream;
use quote::quote;

use crate::ast::{Data, Input};
use crate::attr::Value;
use crate::expand::{runtime_path, user_bounds};

pub fn expand(input: &Input, errors: &syn::Error) -> TokenStream {
    let errors = errors.to_compile_error();
    let stub = stub(input);
    quote! {
        #errors
        #stub
    }
}

/// An impl with placeholder items. Its bounds are higher-ranked so that rustc takes them as
/// given instead of checking them: a type that is not (yet) serde, or whose id does not display,
/// gets no error from the stub. Without a usable crate path there is nothing to name the trait by.
/// A struct also gets its inherent constants, so `OrderPlaced::EVENT_TYPE` resolves.
fn stub(input: &Input) -> Option<TokenStream> {
    let krate = match &input.attrs.krate {
        Value::Absent => runtime_path(None),
        Value::Given(path) => runtime_path(Some(path)),
        Value::Invalid => return None,
    };
    let ident = input.ident;
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    let user_bounds = user_bounds(input.generics);
    let inherent = match input.data {
        Data::Enum(..) => None,
        Data::Named(_) | Data::Tuple(_) | Data::Unit | Data::Union(_) => Some(quote! {
            #[automatically_derived]
            impl #impl_generics #ident #ty_generics #where_clause {
                #[doc = " The event type (not derived: see the errors)."]
                pub const EVENT_TYPE: &'static str = "";
                #[doc = " The version (not derived: see the errors)."]
                pub const VERSION: u32 = 1;
            }
        }),
    };
    Some(quote! {
        const _: () = {
            #[automatically_derived]
            impl #impl_generics #krate::OutboxEvent for #ident #ty_generics
            where
                #(#user_bounds,)*
                for<'__outbox> Self: #krate::__private::serde::Serialize,
                Self: for<'__de> #krate::__private::serde::Deserialize<'__de>,
            {
                const AGGREGATE_TYPE: &'static str = "";
                const EVENT_TYPES: &'static [#krate::__private::EventType] = &[];

                fn aggregate_id(&self) -> ::std::string::String {
                    ::core::unimplemented!()
                }
            }

            #inherent
        };
    })
}
