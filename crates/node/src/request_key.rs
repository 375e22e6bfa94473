//! A rule's key template for gateways (`request_key: "apikey:{header:x-api-key}"`): which key a
//! forwarded request is limited by. Parsed once with the rules file; rendered per request from
//! what the forward-auth edge reads off the request (no HTTP types here).

use std::fmt;

/// What a placeholder reads from a forwarded request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Field {
    /// A request header, by lower-case name.
    Header(String),
    /// The client's address: the first `X-Forwarded-For` address, else `X-Real-IP`, else the
    /// connection's peer.
    ClientIp,
    /// `X-Forwarded-Method`.
    Method,
    /// `X-Forwarded-Host`.
    Host,
    /// The path of `X-Forwarded-Uri` (without its query).
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
}

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
        Ok(Self {
            source: source.to_owned(),
            parts,
        })
    }

    /// The key for a request whose fields `read` gives; `None` when a field is absent or empty
    /// (the rule does not apply to that request).
    pub fn render<'a>(&self, read: impl Fn(&Field) -> Option<&'a str>) -> Option<String> {
        let mut key = String::with_capacity(self.source.len() + 32);
        for p in &self.parts {
            match p {
                Part::Text(t) => key.push_str(t),
                Part::Field(f) => key.push_str(read(f).filter(|v| !v.is_empty())?),
            }
        }
        Some(key)
    }
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

    fn read(f: &Field) -> Option<&'static str> {
        match f {
            Field::Header(h) if h == "x-api-key" => Some("k42"),
            Field::Header(h) if h == "x-empty" => Some(""),
            Field::Header(_) => None,
            Field::ClientIp => Some("203.0.113.7"),
            Field::Method => Some("POST"),
            Field::Host => Some("shop.example"),
            Field::Path => Some("/orders"),
        }
    }

    #[test]
    fn templates_render_fields_and_literal_braces() {
        let t = KeyTemplate::parse("apikey:{header:X-API-Key}").expect("valid");
        assert_eq!(t.render(read).as_deref(), Some("apikey:k42"));
        let t = KeyTemplate::parse("{method} {host}{path} from {client_ip} {{x}}").expect("valid");
        assert_eq!(
            t.render(read).as_deref(),
            Some("POST shop.example/orders from 203.0.113.7 {x}")
        );
        // An absent or empty header: the rule does not apply.
        for s in ["k:{header:x-missing}", "k:{header:x-empty}"] {
            assert_eq!(KeyTemplate::parse(s).expect("valid").render(read), None);
        }
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
