//! A rule's key template for gateways (`request_key: "apikey:{header:x-api-key}"`): which key a
//! forwarded request is limited by. Parsed once with the rules file; rendered per request from
//! what the forward-auth edge reads off the request (no HTTP types here).
//!
//! A key names one bucket, so two requests with different values must not render to one key.
//! With one placeholder the value sits between fixed text and cannot be mistaken. With more,
//! a value could borrow its neighbour's separator (`u:1` + `2` and `u` + `1:2` both giving
//! `u:1:2`), so each value has its `%` and the character that ends it (the first of the text
//! after it) written `%XX`; placeholders side by side are joined by `|`, which is then such a
//! character. The key stays readable: `GET shop.example|/orders`, `u%3A1:2`.

use std::borrow::Cow;
use std::fmt;

/// What a placeholder reads from a forwarded request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Field {
    /// A request header, by lower-case name.
    Header(String),
    /// The client's address (see [`crate::forwarded::client_ip`]).
    ClientIp,
    /// `X-Forwarded-Method`.
    Method,
    /// `X-Forwarded-Host`.
    Host,
    /// The path of `X-Forwarded-Uri`, normalised (see [`crate::forwarded::path`]).
    Path,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Field(Field),
}

/// A parsed `request_key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyTemplate {
    source: String,
    parts: Vec<Part>,
    /// With two placeholders or more: the characters written `%XX` in values (`%` and each
    /// separator's first); empty with one, whose key is unambiguous as it is.
    escaped: Vec<char>,
}

/// Joins placeholders side by side in a key (`{host}{path}`), so that a separator ends each.
const JOIN: &str = "|";

impl fmt::Display for KeyTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

/// Most placeholders in one template (keys are at most 512 bytes anyway).
const MAX_FIELDS: usize = 8;

impl KeyTemplate {
    /// Parses `{header:NAME}`, `{client_ip}`, `{method}`, `{host}`, `{path}` between literal
    /// text; `{{` and `}}` are literal braces.
    pub fn parse(source: &str) -> Result<Self, String> {
        if source.is_empty() || source.len() > 512 {
            return Err(format!(
                "must be 1 to 512 bytes, got {} bytes",
                source.len()
            ));
        }
        let mut parts = Vec::new();
        let mut text = String::new();
        let mut rest = source;
        while let Some(i) = rest.find(['{', '}']) {
            text.push_str(&rest[..i]);
            let tail = &rest[i..];
            if tail.starts_with("{{") || tail.starts_with("}}") {
                text.push_str(&tail[..1]);
                rest = &tail[2..];
                continue;
            }
            if tail.starts_with('}') {
                return Err(format!("has a '}}' without its '{{' in {source:?}"));
            }
            let Some(end) = tail.find('}') else {
                return Err(format!("has a '{{' without its '}}' in {source:?}"));
            };
            let field = match &tail[1..end] {
                "client_ip" => Field::ClientIp,
                "method" => Field::Method,
                "host" => Field::Host,
                "path" => Field::Path,
                other => match other.strip_prefix("header:") {
                    Some(name) if valid_header_name(name) => {
                        Field::Header(name.to_ascii_lowercase())
                    }
                    Some(name) => return Err(format!("has an invalid header name {name:?}")),
                    None => {
                        return Err(format!(
                            "has an unknown placeholder {{{other}}}; known are {{header:NAME}}, {{client_ip}}, {{method}}, {{host}}, {{path}}"
                        ));
                    }
                },
            };
            if !text.is_empty() {
                parts.push(Part::Text(std::mem::take(&mut text)));
            }
            parts.push(Part::Field(field));
            rest = &tail[end + 1..];
        }
        text.push_str(rest);
        if !text.is_empty() {
            parts.push(Part::Text(text));
        }
        let fields = parts.iter().filter(|p| matches!(p, Part::Field(_))).count();
        if fields == 0 {
            return Err(format!(
                "has no placeholder, so every request would share one key: {source:?}"
            ));
        }
        if fields > MAX_FIELDS {
            return Err(format!("has {fields} placeholders; at most {MAX_FIELDS}"));
        }
        let escaped = if fields > 1 {
            separate(&mut parts)
        } else {
            Vec::new()
        };
        Ok(Self {
            source: source.to_owned(),
            parts,
            escaped,
        })
    }

    /// The key for a request whose fields `read` gives; `None` when a field is absent or empty
    /// (the rule does not apply to that request). Within the key size limit (see
    /// [`bounded_key`]).
    pub fn render<'a>(&self, read: impl Fn(&Field) -> Option<Cow<'a, str>>) -> Option<String> {
        let mut key = String::with_capacity(self.source.len() + 32);
        for p in &self.parts {
            match p {
                Part::Text(t) => key.push_str(t),
                Part::Field(f) => {
                    let value = read(f).filter(|v| !v.is_empty())?;
                    if self.escaped.is_empty() {
                        key.push_str(&value);
                    } else {
                        escape_into(&mut key, &value, &self.escaped);
                    }
                }
            }
        }
        Some(bounded_key(key))
    }
}

/// Makes every placeholder but the last end at a separator that its value cannot hold: `|`
/// between placeholders side by side, and before text that starts with `%` (the escape
/// character itself); returns the characters to escape in values.
fn separate(parts: &mut Vec<Part>) -> Vec<char> {
    let mut last = parts
        .iter()
        .rposition(|p| matches!(p, Part::Field(_)))
        .unwrap_or(0);
    let mut escaped = vec!['%'];
    let mut i = 0;
    while i < last {
        if matches!(parts[i], Part::Field(_)) {
            match &mut parts[i + 1] {
                Part::Text(t) if !t.starts_with('%') => {}
                Part::Text(t) => t.insert_str(0, JOIN),
                Part::Field(_) => {
                    parts.insert(i + 1, Part::Text(JOIN.to_owned()));
                    last += 1;
                }
            }
            if let Some(Part::Text(t)) = parts.get(i + 1)
                && let Some(c) = t.chars().next()
                && !escaped.contains(&c)
            {
                escaped.push(c);
            }
        }
        i += 1;
    }
    escaped
}

/// `value` into `key`, each of `escaped` written as its UTF-8 bytes `%XX`.
fn escape_into(key: &mut String, value: &str, escaped: &[char]) {
    for c in value.chars() {
        if escaped.contains(&c) {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                key.push('%');
                key.push(char::from(b"0123456789ABCDEF"[usize::from(b >> 4)]));
                key.push(char::from(b"0123456789ABCDEF"[usize::from(b & 0xf)]));
            }
        } else {
            key.push(c);
        }
    }
}

/// A key within the size limit: itself, or past it its first 128 bytes, `#` and the SHA-256
/// of the whole (a gateway's values can be long, e.g. a path) — still one key per value.
pub fn bounded_key(key: String) -> String {
    use std::fmt::Write;
    if key.len() <= ringlimit_proto::CheckAnswer::MAX_KEY_BYTES {
        return key;
    }
    use sha2::Digest;
    let digest = sha2::Sha256::digest(key.as_bytes());
    let mut cut = 128.min(key.len());
    while !key.is_char_boundary(cut) {
        cut -= 1;
    }
    let mut short = String::with_capacity(200);
    short.push_str(&key[..cut]);
    short.push('#');
    for b in digest {
        let _ = write!(short, "{b:02x}");
    }
    short
}

fn valid_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(f: &Field) -> Option<Cow<'static, str>> {
        let v = match f {
            Field::Header(h) if h == "x-api-key" => "k42",
            Field::Header(h) if h == "x-empty" => "",
            Field::Header(_) => return None,
            Field::ClientIp => "203.0.113.7",
            Field::Method => "POST",
            Field::Host => "shop.example",
            Field::Path => "/orders",
        };
        Some(Cow::Borrowed(v))
    }

    #[test]
    fn templates_render_fields_and_literal_braces() {
        let t = KeyTemplate::parse("apikey:{header:X-API-Key}").expect("valid");
        assert_eq!(t.render(read).as_deref(), Some("apikey:k42"));
        let t = KeyTemplate::parse("{method} {host}{path} from {client_ip} {{x}}").expect("valid");
        assert_eq!(
            t.render(read).as_deref(),
            Some("POST shop.example|/orders from 203.0.113.7 {x}")
        );
        assert_eq!(
            t.to_string(),
            "{method} {host}{path} from {client_ip} {{x}}"
        );
        // An absent or empty header: the rule does not apply.
        for s in ["k:{header:x-missing}", "k:{header:x-empty}"] {
            assert_eq!(KeyTemplate::parse(s).expect("valid").render(read), None);
        }
    }

    /// The key of `template` for header values `a` and `b`.
    fn key(template: &str, a: &str, b: &str) -> String {
        let (a, b) = (a.to_owned(), b.to_owned());
        KeyTemplate::parse(template)
            .expect("valid")
            .render(|f| match f {
                Field::Header(h) if h == "a" => Some(Cow::Owned(a.clone())),
                Field::Header(h) if h == "b" => Some(Cow::Owned(b.clone())),
                _ => None,
            })
            .expect("rendered")
    }

    #[test]
    fn values_cannot_trade_characters_through_a_separator() {
        // `u:1` + `2` and `u` + `1:2`: once both `u:1:2`.
        let t = "{header:a}:{header:b}";
        assert_eq!(key(t, "u:1", "2"), "u%3A1:2");
        assert_eq!(key(t, "u", "1:2"), "u:1%3A2");
        // The escape character itself, and a value that spells an escape.
        assert_ne!(key(t, "a%3A", "b"), key(t, "a:", "b"));
        // Side by side, a `|` between them.
        let t = "{header:a}{header:b}";
        assert_eq!(key(t, "ab", "c"), "ab|c");
        assert_ne!(key(t, "ab", "c"), key(t, "a", "bc"));
        assert_ne!(key(t, "a|b", "c"), key(t, "a", "b|c"));
        // Text starting with `%` after a value is joined by `|` too.
        let t = "{header:a}%{header:b}";
        assert_ne!(key(t, "a%", "b"), key(t, "a", "%b"));
        // A separator that is a hex digit is no trouble (escapes are read as a whole).
        let t = "{header:a}A{header:b}";
        assert_ne!(key(t, ":", "xAy"), key(t, "%3", "xAy"));
        assert_ne!(key(t, "1A2", "3"), key(t, "1", "2A3"));
        // Only the separators' first characters are escaped: a word stays a word.
        assert_eq!(
            key("{header:a} from {header:b}", "fr:om", "x y"),
            "fr:om from x%20y"
        );
        // One placeholder: the value between fixed text, as it is.
        assert_eq!(key("u:{header:a}", "1:2%", ""), "u:1:2%");
    }

    #[test]
    fn long_keys_stay_within_the_limit_and_distinct() {
        let long_a = "a".repeat(2000);
        let long_b = format!("{}b", "a".repeat(1999));
        let (ka, kb) = (
            key("{header:a}:{header:b}", &long_a, "x"),
            key("{header:a}:{header:b}", &long_b, "x"),
        );
        assert!(
            ka.len() <= ringlimit_proto::CheckAnswer::MAX_KEY_BYTES,
            "{}",
            ka.len()
        );
        assert!(ka.starts_with("aaaa") && ka.contains('#'));
        assert_ne!(ka, kb);
        let k = key("{header:a}", &"é".repeat(600), "");
        assert!(k.len() <= ringlimit_proto::CheckAnswer::MAX_KEY_BYTES);
    }

    #[test]
    fn bad_templates_are_refused_with_a_reason() {
        for (s, says) in [
            ("", "1 to 512 bytes"),
            ("plain", "no placeholder"),
            ("k:{nope}", "unknown placeholder {nope}"),
            ("k:{header:}", "invalid header name"),
            ("k:{header:a b}", "invalid header name"),
            ("k:{method", "without its '}'"),
            ("k:method}", "without its '{'"),
        ] {
            let e = KeyTemplate::parse(s).expect_err(s);
            assert!(e.contains(says), "{s}: {e}");
        }
    }
}
