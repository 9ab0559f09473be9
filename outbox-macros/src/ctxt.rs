//! An error accumulator, so one derive reports every mistake at once (after serde_derive's `Ctxt`).

use std::cell::RefCell;
use std::fmt::Display;

use quote::ToTokens;

/// Collects errors while the input is parsed and validated.
#[derive(Default)]
pub struct Ctxt {
    errors: RefCell<Vec<syn::Error>>,
}

impl Ctxt {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records an error spanning the tokens of `obj` (first to last token).
    pub fn error_spanned_by<A: ToTokens, T: Display>(&self, obj: A, msg: T) {
        self.syn_error(syn::Error::new_spanned(obj.into_token_stream(), msg));
    }

    /// Records an error produced by syn.
    pub fn syn_error(&self, err: syn::Error) {
        self.errors.borrow_mut().push(err);
    }

    /// All recorded errors combined into one, or `Ok` when there were none.
    pub fn check(self) -> Result<(), syn::Error> {
        let mut errors = self.errors.into_inner().into_iter();
        let Some(mut combined) = errors.next() else {
            return Ok(());
        };
        for err in errors {
            combined.combine(err);
        }
        Err(combined)
    }
}
