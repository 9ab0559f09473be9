//! Rules over the whole input: its shape, the keys that must be present, the one id field, the
//! keys that only make sense together. Produces the fully checked [`Event`] that `expand` turns
//! into code. An enum's rules (an event family's) are in `family`.

mod family;

use syn::{Generics, Ident, LitStr, Type, TypePath};

use crate::ast::{Data, Field, Input};
use crate::attr::{Value, Version};
use crate::ctxt::Ctxt;

/// Everything `expand` needs, all of it checked.
pub struct Event<'a> {
    pub ident: &'a Ident,
    pub generics: &'a Generics,
    pub aggregate: &'a LitStr,
    /// `None`: the default `::outbox_runtime`.
    pub krate: Option<&'a syn::Path>,
    /// A struct's `ordered`, or a family's, for every variant.
    pub ordered: bool,
    pub kind: Kind<'a>,
}

pub enum Kind<'a> {
    Struct(Struct<'a>),
    /// An enum: one variant per event type, in declaration order.
    Family(Vec<Variant<'a>>),
}

pub struct Struct<'a> {
    pub event_type: &'a LitStr,
    pub version: u32,
    /// The predecessor: a concrete struct, and this struct's version is above 1.
    pub upcast_from: Option<&'a TypePath>,
    pub id: &'a Field<'a>,
}

/// A variant of an event family.
pub struct Variant<'a> {
    pub ident: &'a Ident,
    /// Unique in the family.
    pub event_type: &'a LitStr,
    pub content: Content<'a>,
}

pub enum Content<'a> {
    /// `V(Event)`: the struct's event type, version and id.
    Newtype(&'a Type),
    /// `V { ... }`: an event type of the family's own.
    Struct { version: u32, id: &'a Field<'a> },
}

/// Checks `input`, recording every violation. `None` only if something was recorded.
pub fn check<'a>(cx: &Ctxt, input: &'a Input<'a>) -> Option<Event<'a>> {
    let attrs = &input.attrs;
    let krate = match &attrs.krate {
        Value::Absent => Some(None),
        Value::Given(path) => Some(Some(path)),
        Value::Invalid => None,
    };
    let kind = match &input.data {
        Data::Named(fields) => check_struct(cx, input, fields).map(Kind::Struct),
        Data::Enum(token, variants) => family::check(cx, input, token, variants).map(Kind::Family),
        other => {
            // The shape is the one problem worth reporting; missing keys and fields would be noise.
            shape_error(cx, input.ident, other);
            return None;
        }
    };
    Some(Event {
        ident: input.ident,
        generics: input.generics,
        aggregate: given(&attrs.aggregate)?,
        krate: krate?,
        ordered: attrs.ordered,
        kind: kind?,
    })
}

fn check_struct<'a>(
    cx: &Ctxt,
    input: &'a Input<'a>,
    fields: &'a [Field<'a>],
) -> Option<Struct<'a>> {
    let ident = input.ident;
    let attrs = &input.attrs;
    match (&attrs.aggregate, &attrs.event_type) {
        _ if attrs.incomplete => {}
        (Value::Absent, Value::Absent) => cx.error_spanned_by(
            ident,
            format_args!(
                "missing `#[outbox(aggregate = \"...\", event_type = \"...\")]` on `{ident}`"
            ),
        ),
        (Value::Absent, _) => cx.error_spanned_by(
            ident,
            format_args!("missing `#[outbox(aggregate = \"...\")]` on `{ident}`"),
        ),
        (_, Value::Absent) => cx.error_spanned_by(
            ident,
            format_args!("missing `#[outbox(event_type = \"...\")]` on `{ident}`"),
        ),
        _ => {}
    }
    let version = version(&attrs.version);
    let upcast_from = match &attrs.upcast_from {
        Value::Absent => Some(None),
        Value::Given(ty) => predecessor(cx, input, ty, version).map(Some),
        Value::Invalid => None,
    };
    let id = id_field(cx, ident, &ident.to_string(), fields);
    Some(Struct {
        event_type: given(&attrs.event_type)?,
        version: version?,
        upcast_from: upcast_from?,
        id: id?,
    })
}

/// A declared version, or the default 1.
fn version(value: &Value<Version>) -> Option<u32> {
    match value {
        Value::Absent => Some(1),
        Value::Given(version) => Some(version.value),
        Value::Invalid => None,
    }
}

/// The rules of `upcast_from` that the derive can see; the rest are about the predecessor's
/// derive, and are checked by the generated code.
fn predecessor<'a>(
    cx: &Ctxt,
    input: &Input,
    ty: &'a TypePath,
    version: Option<u32>,
) -> Option<&'a TypePath> {
    let mut ok = true;
    if !input.generics.params.is_empty() {
        // A chain's checks are constants over concrete types, and a generic struct's predecessor
        // would differ with its parameters.
        cx.error_spanned_by(
            input.generics,
            "version chains are for concrete types: a generic struct cannot have `upcast_from`",
        );
        ok = false;
    }
    if is_self(ty, input.ident) {
        cx.error_spanned_by(
            ty,
            "a struct cannot upcast from itself: `upcast_from` names the struct of the previous version",
        );
        ok = false;
    } else if version == Some(1) {
        cx.error_spanned_by(
            ty,
            "version 1 has no predecessor: declare this struct's `version`, one above its predecessor's",
        );
        ok = false;
    }
    ok.then_some(ty)
}

/// `Self`, or the struct's own name.
fn is_self(ty: &TypePath, ident: &Ident) -> bool {
    ty.qself.is_none() && ty.path.get_ident().is_some_and(|name| name == ident || name == "Self")
}

fn given<T>(value: &Value<T>) -> Option<&T> {
    match value {
        Value::Given(value) => Some(value),
        Value::Absent | Value::Invalid => None,
    }
}

/// The one `#[outbox(id)]` field of the struct or struct variant `name`, spanned at `at`;
/// extra ones are reported at their `id` key.
fn id_field<'a>(
    cx: &Ctxt,
    at: &Ident,
    name: &str,
    fields: &'a [Field<'a>],
) -> Option<&'a Field<'a>> {
    let mut marked = fields.iter().filter_map(|field| Some((field, field.attrs.id.as_ref()?)));
    let first = marked.next().map(|(field, _)| field);
    if let Some(first) = first {
        not_skipped(cx, first);
        for (_, key) in marked {
            cx.error_spanned_by(
                key,
                format_args!(
                    "`#[outbox(id)]` is already on `{}`: an event has exactly one aggregate id field",
                    first.ident
                ),
            );
        }
    } else if fields.iter().any(|field| field.attrs.maybe_id) {
        // An unreadable or misspelled field attribute was reported; it may have meant `id`.
    } else if fields.is_empty() {
        cx.error_spanned_by(
            at,
            format_args!(
                "`{name}` has no fields: an event needs an aggregate id field marked `#[outbox(id)]`"
            ),
        );
    } else {
        cx.error_spanned_by(
            at,
            format_args!(
                "no field of `{name}` is marked `#[outbox(id)]`: add it to the field that holds the aggregate id"
            ),
        );
    }
    first
}

/// Reports the serde keys that would keep the id field out of the payload, or keep it from being
/// read back: the id is taken from the value at emit, but a delivered event is read from the
/// payload, and would not carry the id it was emitted with.
fn not_skipped(cx: &Ctxt, id: &Field) {
    let name = id.ident;
    for key in &id.attrs.serde_skips {
        let effect = if key == "skip_deserializing" {
            format!("`{name}` would not be read back from the payload")
        } else if key == "skip_serializing_if" {
            format!("`{name}` would be left out of the payload whenever the condition holds")
        } else {
            format!("`{name}` would be left out of the payload")
        };
        cx.error_spanned_by(
            key,
            format_args!(
                "the aggregate id field cannot be skipped by serde: {effect}, and a delivered event would not carry the id it was emitted with; remove `{key}`"
            ),
        );
    }
}

fn shape_error(cx: &Ctxt, ident: &Ident, data: &Data) {
    const PREFIX: &str =
        "`OutboxEvent` can only be derived for structs with named fields and for enums";
    match data {
        Data::Named(_) | Data::Enum(..) => {}
        Data::Tuple(fields) => cx.error_spanned_by(
            fields,
            format_args!("{PREFIX}; tuple structs are not supported: name the fields"),
        ),
        Data::Unit => cx.error_spanned_by(
            ident,
            format_args!(
                "{PREFIX}; unit structs are not supported: an event needs an aggregate id field"
            ),
        ),
        Data::Union(token) => cx.error_spanned_by(
            quote::quote!(#token #ident),
            format_args!("{PREFIX}; unions are not supported"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use syn::parse_quote;

    use crate::ast::Input;
    use crate::ctxt::Ctxt;

    /// Every message the derive reports for `input`, in order.
    fn errors(input: syn::DeriveInput) -> Vec<String> {
        let cx = Ctxt::new();
        let ast = Input::from_syn(&cx, &input);
        let _ = super::check(&cx, &ast);
        match cx.check() {
            Ok(()) => Vec::new(),
            Err(errors) => errors.into_iter().map(|error| error.to_string()).collect(),
        }
    }

    #[test]
    fn a_predecessor_needs_a_version_above_one() {
        let errors = errors(parse_quote! {
            #[outbox(aggregate = "order", event_type = "order.placed", upcast_from = OrderPlacedV1)]
            struct OrderPlaced { #[outbox(id)] order_id: u64 }
        });
        assert_eq!(
            errors,
            ["version 1 has no predecessor: declare this struct's `version`, one above its predecessor's"]
        );
    }

    #[test]
    fn a_chain_is_concrete_and_does_not_loop() {
        let errors = errors(parse_quote! {
            #[outbox(aggregate = "order", event_type = "order.placed", version = 2, upcast_from = Self)]
            struct OrderPlaced<T> { #[outbox(id)] order_id: u64, detail: T }
        });
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors[0].starts_with("version chains are for concrete types"), "{errors:?}");
        assert!(errors[1].starts_with("a struct cannot upcast from itself"), "{errors:?}");
    }

    #[test]
    fn a_family_reports_every_variant_at_once() {
        let errors = errors(parse_quote! {
            #[outbox(event_type = "order.changed")]
            enum OrderEvent {
                #[outbox(event_type = "order.placed", version = 2)]
                Placed(OrderPlaced),
                Unit,
                #[outbox(event_type = "order.placed")]
                Again { #[outbox(id)] order_id: u64 },
                Missing { order_id: u64 },
            }
        });
        assert_eq!(
            errors,
            [
                "`event_type` goes on each variant, not on the enum",
                "missing `#[outbox(aggregate = \"...\")]` on `OrderEvent`",
                "the version of a newtype variant is its struct's: declare it on the struct",
                "unit variant `Unit` holds no event: make it a newtype variant around an event struct, or a struct variant with an `#[outbox(id)]` field",
                "duplicate event type \"order.placed\": variant `Placed` has it already, and each variant is an event type of its own",
                "missing `#[outbox(event_type = \"...\")]` on variant `Missing`",
                "no field of `OrderEvent::Missing` is marked `#[outbox(id)]`: add it to the field that holds the aggregate id",
            ]
        );
    }

    #[test]
    fn the_id_field_is_never_skipped_by_serde() {
        let errors = errors(parse_quote! {
            #[outbox(aggregate = "order", event_type = "order.placed")]
            struct OrderPlaced {
                #[outbox(id)]
                #[serde(rename = "id", skip_serializing_if = "is_zero")]
                #[serde(skip_deserializing, default)]
                order_id: u64,
                #[serde(skip)]
                note: String,
            }
        });
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors[0].contains("left out of the payload whenever"), "{errors:?}");
        assert!(errors[0].ends_with("remove `skip_serializing_if`"), "{errors:?}");
        assert!(errors[1].contains("`order_id` would not be read back"), "{errors:?}");
        assert!(errors[1].ends_with("remove `skip_deserializing`"), "{errors:?}");
    }

    #[test]
    fn a_struct_variant_id_is_never_skipped_by_serde() {
        let errors = errors(parse_quote! {
            #[outbox(aggregate = "order")]
            enum OrderEvent {
                #[outbox(event_type = "order.cancelled")]
                Cancelled { #[serde(skip)] #[outbox(id)] order_id: u64 },
                #[outbox(event_type = "order.shipped")]
                Shipped { #[outbox(id)] order_id: u64, #[serde(skip_serializing)] note: String },
            }
        });
        assert_eq!(
            errors,
            ["the aggregate id field cannot be skipped by serde: `order_id` would be left out of the payload, and a delivered event would not carry the id it was emitted with; remove `skip`"]
        );
    }

    #[test]
    fn a_family_keeps_serde_default_representation() {
        let errors = errors(parse_quote! {
            #[serde(tag = "type")]
            #[outbox(aggregate = "order")]
            enum OrderEvent {
                #[outbox(event_type = "order.placed")]
                #[serde(skip_serializing)]
                Placed(OrderPlaced),
            }
        });
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors[0].ends_with("remove `tag`"), "{errors:?}");
        assert!(errors[1].ends_with("remove `skip_serializing`"), "{errors:?}");
    }
}
