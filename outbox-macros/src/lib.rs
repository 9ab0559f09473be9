//! The derive behind `outbox_runtime::OutboxEvent`. Depend on `outbox-runtime`, which re-exports it.

use proc_macro::TokenStream;

/// Derives `outbox_runtime::OutboxEvent`; documented on the trait.
#[proc_macro_derive(OutboxEvent, attributes(outbox))]
pub fn derive_outbox_event(input: TokenStream) -> TokenStream {
    let _ = input;
    TokenStream::new()
}
