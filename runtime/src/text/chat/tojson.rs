//! The `tojson` filter as transformers defines it for chat templates: Python's
//! `json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`, the
//! four options taken as keyword arguments. Templates print tools and tool-call arguments
//! through it, so a rendering equals transformers' only if this writes what `json.dumps`
//! writes: `", "` and `": "` between items (`","` once indented), non-ASCII kept, nothing
//! HTML-escaped, keys in their own order, floats as Python's `repr`. minijinja's own
//! `tojson` writes compact JSON with `<>&'` escaped.

use std::fmt::Write;

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Error, ErrorKind};

use super::arguments::WholeNumber;

struct Style {
    ensure_ascii: bool,
    /// The text of one level of indentation; `None` writes everything on one line.
    indent: Option<String>,
    item: String,
    key: String,
    sort_keys: bool,
}

pub(super) fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match kwargs.get::<Option<Value>>("indent")? {
        None => None,
        Some(n) if n.is_integer() => Some(" ".repeat(n.as_i64().unwrap_or(0).max(0) as usize)),
        Some(n) if n.kind() == ValueKind::None => None,
        Some(text) => Some(text.as_str().map(str::to_string).ok_or_else(|| {
            invalid(format!(
                "tojson: indent must be a number or a string, not {text}"
            ))
        })?),
    };
    let (item, key) = match kwargs.get::<Option<Vec<String>>>("separators")? {
        Some(pair) if pair.len() == 2 => (pair[0].clone(), pair[1].clone()),
        Some(_) => return Err(invalid("tojson: separators must be two strings".into())),
        None if indent.is_some() => (",".into(), ": ".into()),
        None => (", ".into(), ": ".into()),
    };
    let style = Style {
        ensure_ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
        indent,
        item,
        key,
        sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
    };
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_value(&mut out, value, &style, 0)?;
    Ok(Value::from_safe_string(out))
}

fn invalid(message: String) -> Error {
    Error::new(ErrorKind::InvalidOperation, message)
}

fn write_value(out: &mut String, value: &Value, style: &Style, depth: usize) -> Result<(), Error> {
    // An integer past 128 bits from a call's arguments: its digits, as Python's int prints.
    if let Some(whole) = value.downcast_object_ref::<WholeNumber>() {
        out.push_str(&whole.0);
        return Ok(());
    }
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number if value.is_integer() => write!(out, "{value}").expect("to a string"),
        ValueKind::Number => {
            let float = f64::try_from(value.clone())?;
            out.push_str(&python_float(float));
        }
        ValueKind::String => write_string(out, value.as_str().unwrap_or_default(), style),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_items(out, style, depth, ('[', ']'), &items, |out, item| {
                write_value(out, item, style, depth + 1)
            })?;
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = value.try_iter()?.collect();
            if style.sort_keys {
                keys.sort_by_key(Value::to_string);
            }
            write_items(out, style, depth, ('{', '}'), &keys, |out, key| {
                // JSON's keys are strings; Python writes other keys as their text.
                match key.as_str() {
                    Some(text) => write_string(out, text, style),
                    None => write_string(out, &key.to_string(), style),
                }
                out.push_str(&style.key);
                write_value(out, &value.get_item(key)?, style, depth + 1)
            })?;
        }
        kind => {
            return Err(invalid(format!(
                "tojson: a value of type {kind} is not JSON serializable"
            )));
        }
    }
    Ok(())
}

/// `open`, the items each written by `write` with the separators and indentation of
/// `style`, `close`; an empty list is just `open` and `close`, as Python writes it.
fn write_items(
    out: &mut String,
    style: &Style,
    depth: usize,
    (open, close): (char, char),
    items: &[Value],
    mut write: impl FnMut(&mut String, &Value) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    let newline = |out: &mut String, depth: usize| {
        if let Some(indent) = &style.indent {
            out.push('\n');
            out.push_str(&indent.repeat(depth));
        }
    };
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(&style.item);
        }
        newline(out, depth + 1);
        write(out, item)?;
    }
    if !items.is_empty() {
        newline(out, depth);
    }
    out.push(close);
    Ok(())
}

fn write_string(out: &mut String, text: &str, style: &Style) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (style.ensure_ascii && !c.is_ascii()) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    write!(out, "\\u{unit:04x}").expect("to a string");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A float as Python's `repr` writes it: the shortest text that reads back as the same
/// value, in positional notation with at least one decimal for exponents -4 to 15, else
/// as `1e-07`, `1.5e+16`.
fn python_float(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    // Rust's `{:e}` is the shortest round-trip digits too, with the exponent apart.
    let scientific = format!("{x:e}");
    let (mantissa, exponent) = scientific.split_once('e').expect("{:e} writes an exponent");
    let exponent: i32 = exponent.parse().expect("an integer exponent");
    if (-4..16).contains(&exponent) {
        let positional = format!("{x}");
        match positional.contains('.') {
            true => positional,
            false => positional + ".0",
        }
    } else {
        let sign = if exponent < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exponent.abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Python's `repr` of each (checked with CPython 3.13).
    #[test]
    fn floats_print_as_python_repr() {
        for (x, repr) in [
            (1.0, "1.0"),
            (0.5, "0.5"),
            (-0.0, "-0.0"),
            (1e-7, "1e-07"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (123456789012345.6, "123456789012345.6"),
            (0.1 + 0.2, "0.30000000000000004"),
            (1e300, "1e+300"),
            (-2.5e-10, "-2.5e-10"),
        ] {
            assert_eq!(python_float(x), repr, "{x}");
        }
    }

    fn render(template: &str, value: serde_json::Value) -> String {
        let mut env = minijinja::Environment::new();
        env.add_filter("tojson", tojson);
        env.render_str(template, minijinja::context! { x => value })
            .unwrap()
    }

    /// `json.dumps`'s output, as CPython 3.13 writes each.
    #[test]
    fn values_print_as_json_dumps() {
        let value = serde_json::json!({"b": [1, 2.0, null, true], "a": "é<&>'\"\\\n\u{1}", "e": {}, "f": []});
        assert_eq!(
            render("{{ x | tojson }}", value.clone()),
            r#"{"b": [1, 2.0, null, true], "a": "é<&>'\"\\\n\u0001", "e": {}, "f": []}"#
        );
        assert_eq!(
            render(
                "{{ x | tojson(indent=2) }}",
                serde_json::json!({"a": [1, {}], "b": {"c": null}})
            ),
            "{\n  \"a\": [\n    1,\n    {}\n  ],\n  \"b\": {\n    \"c\": null\n  }\n}"
        );
        assert_eq!(
            render(
                "{{ x | tojson(ensure_ascii=true, sort_keys=true) }}",
                serde_json::json!({"z": "日😀", "a": 1})
            ),
            r#"{"a": 1, "z": "\u65e5\ud83d\ude00"}"#
        );
        assert_eq!(
            render(
                "{{ x | tojson(separators=[',', ':']) }}",
                serde_json::json!([1, {"a": 2}])
            ),
            r#"[1,{"a":2}]"#
        );
    }
}
