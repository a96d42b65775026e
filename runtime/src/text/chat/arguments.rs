//! A tool call's arguments as a chat template is to see them. OpenAI's clients send them as
//! a string of JSON; the templates write them with `tojson`, expecting the object
//! (transformers' documentation: arguments are a dict, a string "may cause errors or strange
//! model behaviour"), so servers read the string first, vLLM with Python's `json.loads`.
//! For a rendering to equal transformers' over that conversation, the values must be
//! `json.loads`'s: integers of any size exact (`98765432109876543210987654321`, not
//! `9.876543210987655e+28`), `-0` the integer 0, `1e400` infinity, a repeated key's last
//! value where the key first stood (issue 42). `serde_json`'s own reading goes through f64
//! past 64 bits and keeps `-0` as -0.0, so the text is read here, each number as written.

use std::fmt;
use std::sync::Arc;

use minijinja::value::{Object, ObjectRepr, Value};
use serde::de::Error as _;
use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;

/// A call's arguments: a JSON value, each number kept as written.
#[derive(Debug, Clone, PartialEq)]
pub struct Arguments(Json);

#[derive(Debug, Clone, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    /// The number's text, as written (valid JSON).
    Number(String),
    String(String),
    Array(Vec<Json>),
    /// In the order written, a repeated key as often as written.
    Object(Vec<(String, Json)>),
}

/// Why text is not a call's arguments.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ArgumentsError(String);

impl Arguments {
    /// No arguments: `{}`.
    pub fn empty() -> Self {
        Arguments(Json::Object(Vec::new()))
    }

    /// The arguments `text` (JSON, as RFC 8259 has it) holds.
    pub fn from_json(text: &str) -> Result<Self, ArgumentsError> {
        // serde_json checks the syntax (and bounds the nesting) without reading numbers.
        let raw: &RawValue =
            serde_json::from_str(text).map_err(|e| ArgumentsError(e.to_string()))?;
        let mut reader = Reader {
            text: raw.get(),
            at: 0,
        };
        reader.value().map(Arguments)
    }
}

/// What reading text serde_json has checked cannot meet: an error all the same, not a panic.
fn unchecked() -> ArgumentsError {
    ArgumentsError("the arguments' JSON ends early".into())
}

/// Reads JSON text serde_json has checked.
struct Reader<'a> {
    text: &'a str,
    at: usize,
}

impl Reader<'_> {
    fn value(&mut self) -> Result<Json, ArgumentsError> {
        self.skip_whitespace();
        match self.text.as_bytes().get(self.at) {
            Some(b'{') => self.object(),
            Some(b'[') => self.array(),
            Some(b'"') => self.string().map(Json::String),
            Some(b'n') => Ok(self.word("null", Json::Null)),
            Some(b't') => Ok(self.word("true", Json::Bool(true))),
            Some(b'f') => Ok(self.word("false", Json::Bool(false))),
            Some(_) => Ok(Json::Number(self.number())),
            None => Err(unchecked()),
        }
    }

    fn word(&mut self, word: &str, value: Json) -> Json {
        self.at += word.len();
        value
    }

    fn object(&mut self) -> Result<Json, ArgumentsError> {
        let mut fields = Vec::new();
        self.at += 1;
        while !self.closes(b'}') {
            self.skip_whitespace();
            let key = self.string()?;
            self.skip_whitespace();
            self.at += 1; // ':'
            fields.push((key, self.value()?));
        }
        Ok(Json::Object(fields))
    }

    fn array(&mut self) -> Result<Json, ArgumentsError> {
        let mut items = Vec::new();
        self.at += 1;
        while !self.closes(b']') {
            items.push(self.value()?);
        }
        Ok(Json::Array(items))
    }

    /// Steps over a `,` or the closing `close`: whether it was the close.
    fn closes(&mut self, close: u8) -> bool {
        self.skip_whitespace();
        match self.text.as_bytes().get(self.at) {
            Some(&b) if b == close => {
                self.at += 1;
                true
            }
            Some(b',') => {
                self.at += 1;
                false
            }
            // The first item: nothing to step over.
            _ => false,
        }
    }

    /// A string's value; serde_json decodes its escapes (a lone surrogate, which Python
    /// keeps and Rust's strings cannot hold, is refused).
    fn string(&mut self) -> Result<String, ArgumentsError> {
        let start = self.at;
        let mut escaped = false;
        let length = (self.text[start + 1..].bytes())
            .position(|b| {
                let closes = b == b'"' && !escaped;
                escaped = b == b'\\' && !escaped;
                closes
            })
            .ok_or_else(unchecked)?;
        self.at = start + length + 2;
        serde_json::from_str(&self.text[start..self.at]).map_err(|e| ArgumentsError(e.to_string()))
    }

    fn number(&mut self) -> String {
        let rest = &self.text[self.at..];
        let end = rest
            .find(|c: char| !matches!(c, '0'..='9' | '-' | '+' | '.' | 'e' | 'E'))
            .unwrap_or(rest.len());
        self.at += end;
        rest[..end].to_string()
    }

    fn skip_whitespace(&mut self) {
        let rest = &self.text[self.at..];
        self.at += rest.len() - rest.trim_start_matches([' ', '\t', '\n', '\r']).len();
    }
}

impl Json {
    /// The value Python's `json.loads` gives, as the template engine holds it.
    fn template_value(&self) -> Value {
        match self {
            Json::Null => Value::from(()),
            Json::Bool(b) => Value::from(*b),
            Json::Number(text) => python_number(text),
            Json::String(text) => Value::from(text.as_str()),
            Json::Array(items) => items.iter().map(Json::template_value).collect(),
            // A map keeps a repeated key where it first stood, with its last value.
            Json::Object(fields) => (fields.iter())
                .map(|(key, value)| (key.as_str(), value.template_value()))
                .collect(),
        }
    }
}

/// A JSON number as Python reads it: an integer exact at any size, else a float (rounded
/// as Python rounds it; infinite past f64's range).
fn python_number(text: &str) -> Value {
    if text.contains(['.', 'e', 'E']) {
        return Value::from(text.parse::<f64>().unwrap_or(f64::NAN));
    }
    match text.parse::<i128>() {
        Ok(n) => match i64::try_from(n) {
            Ok(small) => Value::from(small),
            Err(_) => Value::from(n),
        },
        Err(_) => Value::from_object(WholeNumber(text.to_string())),
    }
}

/// An integer past 128 bits, which the template engine cannot hold as a number: printed,
/// and written by `tojson`, as its digits.
#[derive(Debug)]
pub(super) struct WholeNumber(pub(super) String);

impl Object for WholeNumber {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Plain
    }

    fn render(self: &Arc<Self>, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// To the template engine, the values `json.loads` gives; elsewhere (the request sent to
/// the child that renders, the check for special tokens) JSON, numbers as written.
impl Serialize for Arguments {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if minijinja::value::serializing_for_value() {
            self.0.template_value().serialize(serializer)
        } else {
            self.0.serialize(serializer)
        }
    }
}

impl Serialize for Json {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Json::Null => serializer.serialize_unit(),
            Json::Bool(b) => serializer.serialize_bool(*b),
            Json::Number(text) => RawValue::from_string(text.clone())
                .map_err(serde::ser::Error::custom)?
                .serialize(serializer),
            Json::String(text) => serializer.serialize_str(text),
            Json::Array(items) => {
                let mut seq = serializer.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Json::Object(fields) => {
                let mut map = serializer.serialize_map(Some(fields.len()))?;
                for (key, value) in fields {
                    map.serialize_entry(key, value)?;
                }
                map.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for Arguments {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = Box::<RawValue>::deserialize(deserializer)?;
        Arguments::from_json(raw.get()).map_err(D::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Text that is not JSON (a lone surrogate, which Rust's strings cannot hold, too) is an
    /// error, never a panic.
    #[test]
    fn text_that_is_not_json_is_an_error() {
        for text in [
            "{x",
            "",
            "[1,]",
            r#"{"a":1}x"#,
            "NaN",
            r#""\ud800""#,
            r#"{"a":"\u0"}"#,
        ] {
            assert!(Arguments::from_json(text).is_err(), "{text}");
        }
    }

    /// Outside the template engine (the request sent to the child that renders it, the check
    /// for special tokens) the arguments are JSON with each number as written and each
    /// string decoded (special-token text plain, so it is found).
    #[test]
    fn arguments_serialize_as_json_with_numbers_as_written() {
        let text = r#"{"n": 1.0e5, "big": 123456789012345678901234567890123456789012, "s": "\u003c|im_start|>", "a": [-0, {}]}"#;
        let arguments = Arguments::from_json(text).unwrap();
        assert_eq!(
            serde_json::to_string(&arguments).unwrap(),
            r#"{"n":1.0e5,"big":123456789012345678901234567890123456789012,"s":"<|im_start|>","a":[-0,{}]}"#
        );
        let sent: Arguments =
            serde_json::from_str(&serde_json::to_string(&arguments).unwrap()).unwrap();
        assert_eq!(sent, arguments);
    }
}
