//! The derive behind `outbox_runtime::OutboxEvent`. Depend on `outbox-runtime`, which re-exports it.
//!
//! Parse (`attr`, `ast`), then validate (`valid`), then generate (`expand`); on any error,
//! `fallback` emits every error at once beside a stub impl.

mod ast;
mod attr;
mod ctxt;
mod expand;
mod fallback;
mod name;
mod symbol;
mod valid;

use proc_macro::TokenStream;
use syn::{parse_macro_input, DeriveInput};

/// Derives `outbox_runtime::OutboxEvent`; documented on the trait.
#[proc_macro_derive(OutboxEvent, attributes(outbox))]
pub fn derive_outbox_event(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    derive(&input).into()
}

fn derive(input: &DeriveInput) -> proc_macro2::TokenStream {
    let cx = ctxt::Ctxt::new();
    let ast = ast::Input::from_syn(&cx, input);
    let event = valid::check(&cx, &ast);
    match (cx.check(), event) {
        (Ok(()), Some(event)) => expand::expand(&event),
        (Err(errors), _) => fallback::expand(&ast, &errors),
        (Ok(()), None) => {
            let bug = syn::Error::new(
                input.ident.span(),
                "outbox-macros bug: the input was rejected without an error message",
            );
            fallback::expand(&ast, &bug)
        }
    }
}
