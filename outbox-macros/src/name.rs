//! The grammar of aggregate and event types.

/// Longest accepted aggregate or event type, in characters.
pub const MAX_NAME_LEN: usize = 128;

/// The grammar of aggregate and event types: a lowercase ASCII letter, then lowercase ASCII
/// letters, digits, `_`, `.` and `-`; at most [`MAX_NAME_LEN`] characters.
pub fn check(what: &str, name: &str) -> Result<(), String> {
    const RULE: &str = "use lowercase letters, digits, `_`, `.` and `-`, starting with a letter";
    let mut chars = name.chars();
    let Some(first) = chars.next() else {
        return Err(format!("{what} cannot be empty: {RULE}"));
    };
    if let Some(bad) = name.chars().find(|c| !is_name_char(*c)) {
        return Err(format!("invalid character {} in {what} {name:?}: {RULE}", show_char(bad)));
    }
    if !first.is_ascii_lowercase() {
        return Err(format!("{what} {name:?} starts with {}: {RULE}", show_char(first)));
    }
    let len = name.chars().count();
    if len > MAX_NAME_LEN {
        return Err(format!("{what} is {len} characters long, the maximum is {MAX_NAME_LEN}"));
    }
    Ok(())
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '.' | '-')
}

/// A character quoted for a message; invisible ones spelled as escapes.
fn show_char(c: char) -> String {
    if c == ' ' {
        "` ` (a space)".to_owned()
    } else {
        format!("`{}`", c.escape_debug())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_valid_names() {
        for name in ["a", "order", "order.placed", "order.placed-v2_x", "billing-v2.invoice_paid"] {
            assert_eq!(check("event type", name), Ok(()), "{name}");
        }
        let longest = "a".repeat(MAX_NAME_LEN);
        assert_eq!(check("event type", &longest), Ok(()));
    }

    #[test]
    fn rejects_empty() {
        assert!(check("aggregate", "").unwrap_err().starts_with("aggregate cannot be empty"));
    }

    #[test]
    fn names_the_first_invalid_character() {
        assert_eq!(
            check("event type", "Order.placed").unwrap_err(),
            "invalid character `O` in event type \"Order.placed\": use lowercase letters, digits, `_`, `.` and `-`, starting with a letter"
        );
        assert!(check("aggregate", "order placed").unwrap_err().contains("` ` (a space)"));
        assert!(check("aggregate", "order/x").unwrap_err().contains("`/`"));
        assert!(check("aggregate", "ordér").unwrap_err().contains("`é`"));
        assert!(check("aggregate", "a\tb").unwrap_err().contains("`\\t`"));
    }

    #[test]
    fn must_start_with_a_letter() {
        for name in ["1order", "_order", ".order", "-order"] {
            let err = check("aggregate", name).unwrap_err();
            assert!(err.contains("starts with"), "{name}: {err}");
        }
    }

    #[test]
    fn rejects_long_names() {
        let long = "a".repeat(MAX_NAME_LEN + 1);
        assert_eq!(
            check("aggregate", &long).unwrap_err(),
            "aggregate is 129 characters long, the maximum is 128"
        );
    }
}
