//! Reading one key's value: a string, a version number, a type, or nothing for a flag. Each
//! reader records a spanned error and returns `None` for a value it cannot use, having
//! consumed it, so parsing goes on with the next key.

use proc_macro2::{TokenStream, TokenTree};
use syn::meta::ParseNestedMeta;
use syn::parse::discouraged::Speculative;
use syn::parse::ParseStream;
use syn::{Attribute, Ident, LitInt, LitStr, Meta, Token, TypePath};

use super::Version;
use crate::ctxt::Ctxt;
use crate::name;
use crate::symbol::{CRATE, OUTBOX, VERSION};

/// Reads `= "..."` after `key`.
pub fn string_value(cx: &Ctxt, meta: &ParseNestedMeta, key: &str) -> syn::Result<Option<LitStr>> {
    let Some(eq) = value_start(cx, meta, key, "\"...\"")? else {
        return Ok(None);
    };
    let input = meta.input;
    if input.peek(LitStr) {
        let lit: LitStr = input.parse()?;
        if !lit.suffix().is_empty() {
            cx.error_spanned_by(&lit, "unexpected suffix on a string literal");
            return Ok(None);
        }
        return Ok(Some(lit));
    }
    let rest = skip_value(input)?;
    let msg = format!("expected a string literal: `{key} = \"...\"`");
    if rest.is_empty() {
        cx.error_spanned_by(eq, msg);
    } else {
        cx.error_spanned_by(rest, msg);
    }
    Ok(None)
}

/// Reads `= N` after `version`: an integer from 1 to `u32::MAX`, unsuffixed or `u32`.
pub fn version_value(
    cx: &Ctxt,
    meta: &ParseNestedMeta,
    key: &Ident,
) -> syn::Result<Option<Version>> {
    let Some(eq) = value_start(cx, meta, VERSION, "2")? else {
        return Ok(None);
    };
    let rest = skip_value(meta.input)?;
    if rest.is_empty() {
        cx.error_spanned_by(eq, EXPECTED_VERSION);
        return Ok(None);
    }
    match version_number(&rest) {
        Ok((lit, value)) => Ok(Some(Version { key: key.clone(), lit, value })),
        Err(msg) => {
            cx.error_spanned_by(rest, msg);
            Ok(None)
        }
    }
}

const EXPECTED_VERSION: &str = "expected an integer literal: `version = 2`";

/// The version number `tokens` spell, or why they spell none.
fn version_number(tokens: &TokenStream) -> Result<(LitInt, u32), String> {
    // syn reads `-1` as one negative literal.
    let lit: LitInt = syn::parse2(tokens.clone()).map_err(|_| EXPECTED_VERSION.to_owned())?;
    let digits = lit.base10_digits();
    if digits.starts_with('-') {
        return Err(format!("version {digits} is not valid: versions start at 1"));
    }
    match lit.suffix() {
        "" | "u32" => {}
        suffix => {
            return Err(format!(
                "unexpected suffix `{suffix}`: a version is a `u32`, write `version = {digits}`"
            ))
        }
    }
    match digits.parse::<u32>() {
        Ok(0) => Err("version 0 is not valid: versions start at 1".to_owned()),
        Ok(value) => Ok((lit, value)),
        Err(_) => Err(format!("version {digits} is out of range: the largest is {}", u32::MAX)),
    }
}

/// Reads `= Type` after `key`: a type path such as `OrderPlacedV1` or `crate::v1::OrderPlaced`.
pub fn type_value(cx: &Ctxt, meta: &ParseNestedMeta, key: &str) -> syn::Result<Option<TypePath>> {
    const EXAMPLE: &str = "OrderPlacedV1";
    let Some(eq) = value_start(cx, meta, key, EXAMPLE)? else {
        return Ok(None);
    };
    // Parsed in place rather than from the skipped tokens: the commas of `Type<A, B>` are not
    // the end of the value.
    let input = meta.input;
    let fork = input.fork();
    if let Ok(ty) = fork.parse::<TypePath>() {
        if at_end(&fork) {
            input.advance_to(&fork);
            return Ok(Some(ty));
        }
    }
    let rest = skip_value(input)?;
    if rest.is_empty() {
        cx.error_spanned_by(eq, format_args!("expected a type: `{key} = {EXAMPLE}`"));
    } else if let Ok(lit) = syn::parse2::<LitStr>(rest.clone()) {
        // serde takes paths as strings; a type here is written bare.
        let example = lit.parse::<TypePath>().map_or_else(|_| EXAMPLE.to_owned(), |_| lit.value());
        cx.error_spanned_by(
            rest,
            format_args!("`{key}` takes a type, not a string: write `{key} = {example}`"),
        );
    } else {
        cx.error_spanned_by(rest, format_args!("expected a type: `{key} = {EXAMPLE}`"));
    }
    Ok(None)
}

/// Reads nothing after a flag such as `ordered`: reports a value if there is one.
pub fn flag(cx: &Ctxt, meta: &ParseNestedMeta, key: &str) -> syn::Result<()> {
    if !at_end(meta.input) {
        let value = skip_value(meta.input)?;
        cx.error_spanned_by(
            value,
            format_args!("`{key}` takes no value: write `#[outbox({key})]`"),
        );
    }
    Ok(())
}

/// Reads the `=` after `key`; reports a missing value or another form. `form` is how the value
/// is written, for the message.
fn value_start(
    cx: &Ctxt,
    meta: &ParseNestedMeta,
    key: &str,
    form: &str,
) -> syn::Result<Option<Token![=]>> {
    let input = meta.input;
    if at_end(input) {
        cx.error_spanned_by(&meta.path, format_args!("`{key}` needs a value: `{key} = {form}`"));
        return Ok(None);
    }
    if !input.peek(Token![=]) {
        let rest = skip_value(input)?;
        cx.error_spanned_by(rest, format_args!("expected `{key} = {form}`"));
        return Ok(None);
    }
    input.parse().map(Some)
}

/// Checks a name against the grammar, recording the error at the literal.
pub fn valid_name(cx: &Ctxt, lit: &LitStr, what: &str) -> bool {
    match name::check(what, &lit.value()) {
        Ok(()) => true,
        Err(msg) => {
            cx.error_spanned_by(lit, msg);
            false
        }
    }
}

/// Parses the value of `crate = "..."` as a module path, spanned at the literal.
pub fn crate_path(cx: &Ctxt, lit: &LitStr) -> Option<syn::Path> {
    if lit.value().trim().is_empty() {
        cx.error_spanned_by(lit, "`crate` cannot be empty: give the path of `outbox_runtime`");
        return None;
    }
    match lit.parse_with(syn::Path::parse_mod_style) {
        Ok(path) => Some(path),
        Err(_) => {
            cx.error_spanned_by(
                lit,
                format_args!(
                    "invalid crate path {:?}: expected a path such as `my_outbox` or `::outbox_runtime`",
                    lit.value()
                ),
            );
            None
        }
    }
}

/// Whether an `#[outbox(...)]` attribute's tokens contain a top-level `crate`.
pub fn mentions_crate(attr: &Attribute) -> bool {
    if !attr.path().is_ident(OUTBOX) {
        return false;
    }
    let Meta::List(list) = &attr.meta else {
        return false;
    };
    list.tokens.clone().into_iter().any(|tt| match tt {
        TokenTree::Ident(ident) => ident == CRATE,
        _ => false,
    })
}

/// No value follows the key: the attribute ends or the next key begins.
pub fn at_end(input: ParseStream) -> bool {
    input.is_empty() || input.peek(Token![,])
}

/// Consumes the tokens up to the next top-level `,` and returns them (for spanning an error).
pub fn skip_value(input: ParseStream) -> syn::Result<TokenStream> {
    let mut skipped = TokenStream::new();
    while !at_end(input) {
        let tt: TokenTree = input.parse()?;
        skipped.extend([tt]);
    }
    Ok(skipped)
}

#[cfg(test)]
mod tests {
    use quote::quote;

    use super::*;

    fn version(tokens: TokenStream) -> Result<u32, String> {
        version_number(&tokens).map(|(_, value)| value)
    }

    #[test]
    fn reads_versions() {
        assert_eq!(version(quote!(1)), Ok(1));
        assert_eq!(version(quote!(2u32)), Ok(2));
        assert_eq!(version(quote!(0x10)), Ok(16));
        assert_eq!(version(quote!(1_000)), Ok(1000));
        assert_eq!(version(quote!(4294967295)), Ok(u32::MAX));
    }

    #[test]
    fn rejects_versions_below_one() {
        let zero = "version 0 is not valid: versions start at 1";
        assert_eq!(version(quote!(0)), Err(zero.to_owned()));
        assert_eq!(version(quote!(-1)), Err("version -1 is not valid: versions start at 1".into()));
    }

    #[test]
    fn rejects_what_is_not_a_u32() {
        for tokens in [quote!("2"), quote!(1.5), quote!(two), quote!(1 + 1), quote!((2))] {
            assert_eq!(version(tokens.clone()), Err(EXPECTED_VERSION.to_owned()), "{tokens}");
        }
        assert_eq!(
            version(quote!(4294967296)),
            Err("version 4294967296 is out of range: the largest is 4294967295".into())
        );
        assert_eq!(
            version(quote!(2u8)),
            Err("unexpected suffix `u8`: a version is a `u32`, write `version = 2`".into())
        );
        assert!(version(quote!(2usize)).is_err());
    }
}
