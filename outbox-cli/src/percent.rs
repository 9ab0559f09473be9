//! Percent-decoding of the parts of a URL the CLI reads itself (NATS credentials, the paths of
//! TLS files), as its URL's parser would have decoded them.

/// `value` with its `%XX` escapes decoded, and `+` as a space if `plus_as_space` (a query's
/// values); an invalid escape is kept as it is, and invalid UTF-8 replaced.
pub fn decoded(value: &str, plus_as_space: bool) -> String {
    let bytes = value.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |at: usize| bytes.get(at).and_then(|b| char::from(*b).to_digit(16));
        match (bytes[i], hex(i + 1), hex(i + 2)) {
            (b'%', Some(high), Some(low)) => {
                // Two hex digits: at most 255.
                decoded.push(u8::try_from(high * 16 + low).unwrap_or(b'?'));
                i += 3;
            }
            (b'+', _, _) if plus_as_space => {
                decoded.push(b' ');
                i += 1;
            }
            (byte, _, _) => {
                decoded.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&decoded).into_owned()
}

#[cfg(test)]
mod tests {
    use super::decoded;

    #[test]
    fn decodes_escapes_and_keeps_invalid_ones() {
        assert_eq!(decoded("p%40ss%3Aw%2", false), "p@ss:w%2");
        assert_eq!(decoded("a+b%2Fc", false), "a+b/c");
        assert_eq!(decoded("a+b%2Fc", true), "a b/c");
        assert_eq!(decoded("%zz%", true), "%zz%");
    }
}
