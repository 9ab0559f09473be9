//! Compile-time behaviour of `#[derive(OutboxEvent)]`: every misuse is a spanned error
//! (`ui/`), and the supported shapes compile and behave (`pass/`).
//!
//! Regenerate the expected output with `TRYBUILD=overwrite cargo test -p outbox-tests --test
//! compile`, then read every `.stderr` diff: the messages are rustc's and drift with the toolchain.

#[test]
fn derive_outbox_event() {
    let t = trybuild::TestCases::new();
    t.compile_fail("ui/*.rs");
    t.pass("pass/*.rs");
}
