//! JSON Schemas said the way llguidance compiles them as meant (issue 42): keywords it
//! refuses or reads wrongly as written are rewritten before it sees them, and what no
//! rewriting can save is refused here, naming the keyword, where it is, and the limit.
//!
//! - `multipleOf` with a decimal that is not exact as a binary float (`0.07`): llguidance
//!   turns the float into a decimal by multiplying it by ten until it is whole, which
//!   `0.07` never is (`0.7000000000000001`, ...); a float next to it that reaches the same
//!   digits (`7`, two places) stands in for it. A multiple whose digits do not fit 32 bits
//!   (`1e10`, `0.123456789012`) is refused: llguidance holds the digits in a `u32` (and
//!   divides them by a power of ten, never multiplies).
//! - Bounds (`minimum`, `maximum` and the exclusive ones) past ±(2^53 - 1): llguidance
//!   writes a bound's integer digits as an `i64` (past ±9.2e18 it fails, and it negates
//!   -2^63, the int64 schemas' minimum), and past 2^53 a float is no longer every integer.
//!   A bound past the limit on the far side (`maximum: 1e308`, `minimum: -2^63`) is
//!   narrowed to it: every number the grammar then allows is one the schema allows. A bound
//!   past it on the near side (`minimum: 1e20`) cannot be narrowed, and is refused.
//! - `format: date` and `date-time`: llguidance's regex lets every February have a 29th;
//!   a pattern of the Gregorian calendar's leap years (RFC 3339's) is added beside it.

use serde_json::{Map, Value, json};

use super::GrammarError;

/// Keywords whose value is one schema, a map of names to schemas, a list of schemas: where
/// a schema's subschemas are. Every other keyword holds data (`const`, `enum`, `default`,
/// `examples`) or annotations, never a schema.
const ONE_SCHEMA: [&str; 11] = [
    "additionalProperties",
    "items",
    "additionalItems",
    "contains",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
    "unevaluatedItems",
    "unevaluatedProperties",
];
const NAMED_SCHEMAS: [&str; 6] = [
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
    "dependencies",
];
const LISTED_SCHEMAS: [&str; 5] = ["allOf", "anyOf", "oneOf", "prefixItems", "items"];

/// What is done to one schema object, given the JSON pointer to it (for errors).
pub(crate) type Visit<'a, E> = dyn FnMut(&mut Map<String, Value>, &str) -> Result<(), E> + 'a;

/// Calls `visit` on `schema` and on each of its subschemas that is an object, parents
/// first, with each one's JSON pointer from `schema` (`at` is `schema`'s own); stops at
/// the first error.
pub(crate) fn for_each_schema<E>(
    schema: &mut Value,
    at: &str,
    visit: &mut Visit<E>,
) -> Result<(), E> {
    let Value::Object(object) = schema else {
        return Ok(());
    };
    visit(object, at)?;
    for (keyword, value) in object.iter_mut() {
        let here = format!("{at}/{}", escape(keyword));
        let keyword = keyword.as_str();
        match value {
            Value::Object(_) if ONE_SCHEMA.contains(&keyword) => {
                for_each_schema(value, &here, visit)?;
            }
            Value::Object(named) if NAMED_SCHEMAS.contains(&keyword) => {
                for (name, schema) in named.iter_mut() {
                    for_each_schema(schema, &format!("{here}/{}", escape(name)), visit)?;
                }
            }
            Value::Array(list) if LISTED_SCHEMAS.contains(&keyword) => {
                for (i, schema) in list.iter_mut().enumerate() {
                    for_each_schema(schema, &format!("{here}/{i}"), visit)?;
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// `name` as one token of a JSON pointer.
fn escape(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
}

/// `schema` rewritten as the module docs say, or the first keyword that cannot be.
pub(crate) fn prepare(schema: &mut Value) -> Result<(), GrammarError> {
    for_each_schema(schema, "", &mut |object, at| {
        multiple_of(object, at)?;
        bounds(object, at)?;
        calendar_dates(object);
        Ok(())
    })
}

/// Where in a schema a keyword is, for errors: "at /properties/x", "at the schema's root".
fn place(at: &str) -> String {
    match at {
        "" => "at the schema's root".into(),
        at => format!("at {at}"),
    }
}

/// The largest bound llguidance takes as written: 2^53 - 1, past which a float no longer
/// holds every integer (and well inside the `i64` its number regexes are built in).
const BOUND_LIMIT: f64 = 9_007_199_254_740_991.0;

fn bounds(schema: &mut Map<String, Value>, at: &str) -> Result<(), GrammarError> {
    for (keyword, lower) in [
        ("minimum", true),
        ("exclusiveMinimum", true),
        ("maximum", false),
        ("exclusiveMaximum", false),
    ] {
        // A number; draft 4's boolean `exclusiveMinimum` is a flag on `minimum`.
        let Some(bound) = schema.get(keyword).and_then(Value::as_f64) else {
            continue;
        };
        // Toward the other bound is inside the schema's range: narrowing there is sound.
        let (far, near) = match lower {
            true => (bound < -BOUND_LIMIT, bound > BOUND_LIMIT),
            false => (bound > BOUND_LIMIT, bound < -BOUND_LIMIT),
        };
        if far {
            let limit = if lower { -BOUND_LIMIT } else { BOUND_LIMIT };
            schema.insert(keyword.into(), json!(limit as i64));
        } else if near {
            return Err(GrammarError(format!(
                "{}: {keyword} {bound} is past ±{} (2^53 - 1), the largest bound constrained decoding supports",
                place(at),
                BOUND_LIMIT as i64
            )));
        }
    }
    Ok(())
}

fn multiple_of(schema: &mut Map<String, Value>, at: &str) -> Result<(), GrammarError> {
    let Some(multiple) = schema.get("multipleOf").and_then(Value::as_f64) else {
        return Ok(());
    };
    // Already read as meant, or not a positive number: llguidance's own answer.
    if !(multiple > 0.0 && multiple.is_finite()) || llguidance_decimal(multiple).is_some() {
        return Ok(());
    }
    let refused = |why: &str| GrammarError(format!("{}: multipleOf {multiple}: {why}", place(at)));
    let digits = shortest_decimal(multiple).ok_or_else(|| {
        refused("past constrained decoding's limit: a multiple must be a whole number below 2^32 divided by a power of ten (llguidance's)")
    })?;
    let stand_in = neighbours(multiple)
        .find(|&near| llguidance_decimal(near) == Some(digits))
        .ok_or_else(|| {
            refused("no float near it that constrained decoding reads as this decimal")
        })?;
    schema.insert("multipleOf".into(), json!(stand_in));
    Ok(())
}

/// A decimal as llguidance holds a `multipleOf`: its digits times ten to minus the places,
/// in lowest terms.
type Decimal = (u32, u32);

/// The decimal llguidance reads `x` as (its `Decimal::try_from`): `x` times ten until it
/// is whole, `None` if the digits then do not fit 32 bits.
fn llguidance_decimal(mut x: f64) -> Option<Decimal> {
    let mut places = 0;
    while x.fract() != 0.0 {
        // A finite float is whole after at most ~340 steps; this bounds the loop anyway.
        if places > 400 {
            return None;
        }
        x *= 10.0;
        places += 1;
    }
    (x <= u32::MAX as f64).then(|| lowest_terms(x as u32, places))
}

/// The decimal `x` is written as in its shortest form (`0.07`: 7, two places), if its
/// digits fit 32 bits.
fn shortest_decimal(x: f64) -> Option<Decimal> {
    let scientific = format!("{x:e}");
    let (mantissa, exponent) = scientific.split_once('e')?;
    let exponent: i32 = exponent.parse().ok()?;
    let fraction = mantissa.split_once('.').map_or(0, |(_, f)| f.len() as i32);
    let digits: u64 = mantissa.replace('.', "").parse().ok()?;
    let shift = exponent - fraction;
    let (digits, places) = match shift {
        0.. => (digits.checked_mul(10u64.checked_pow(shift as u32)?)?, 0),
        _ => (digits, shift.unsigned_abs()),
    };
    Some(lowest_terms(u32::try_from(digits).ok()?, places))
}

fn lowest_terms(mut digits: u32, mut places: u32) -> Decimal {
    if digits == 0 {
        return (0, 0);
    }
    while places > 0 && digits.is_multiple_of(10) {
        digits /= 10;
        places -= 1;
    }
    (digits, places)
}

/// The positive floats nearest `x` (positive), nearest first, up to 64 steps either way.
fn neighbours(x: f64) -> impl Iterator<Item = f64> {
    let bits = x.to_bits();
    (1..=64)
        .flat_map(move |step| [bits.checked_sub(step), bits.checked_add(step)])
        .flatten()
        .map(f64::from_bits)
        .filter(|near| *near > 0.0 && near.is_finite())
}

/// A `full-date` of RFC 3339: months of their lengths, February's 29th in leap years only
/// (every fourth year, but of centuries only every fourth).
const FULL_DATE: &str = concat!(
    "(?:[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])",
    "|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)",
    "|02-(?:0[1-9]|1[0-9]|2[0-8]))",
    "|(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[048]|[2468][048]|[13579][26])00)-02-29)"
);

/// A `date` or `date-time` string is given the calendar's pattern too (its own `pattern`,
/// if it has one, is kept: the calendar's then joins through `allOf`).
fn calendar_dates(schema: &mut Map<String, Value>) {
    let pattern = match schema.get("format").and_then(Value::as_str) {
        Some("date") => format!("^{FULL_DATE}$"),
        Some("date-time") => format!("^{FULL_DATE}[Tt]"),
        _ => return,
    };
    if !schema.contains_key("pattern") {
        schema.insert("pattern".into(), pattern.into());
        return;
    }
    let also = json!({ "pattern": pattern });
    match schema.get_mut("allOf") {
        Some(Value::Array(all)) => all.push(also),
        _ => {
            schema.insert("allOf".into(), json!([also]));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decimals a schema may ask multiples of, exact as floats or not: each gets a stand-in
    /// llguidance reads as that decimal.
    #[test]
    fn multiples_get_a_float_read_as_their_decimal() {
        for (multiple, expected) in [
            (0.07, (7, 2)),
            (0.01, (1, 2)),
            (0.3, (3, 1)),
            (0.15, (15, 2)),
            (2.5, (25, 1)),
            (0.0001, (1, 4)),
            (1e-9, (1, 9)),
            (0.035, (35, 3)),
            (1.1, (11, 1)),
            (12.34, (1234, 2)),
        ] {
            let mut schema = json!({"type": "number", "multipleOf": multiple});
            prepare(&mut schema).unwrap();
            let stand_in = schema["multipleOf"].as_f64().unwrap();
            assert_eq!(llguidance_decimal(stand_in), Some(expected), "{multiple}");
            assert!(
                (stand_in - multiple).abs() <= multiple * 1e-14,
                "{multiple}"
            );
        }
        let mut schema = json!({"multipleOf": 1e10});
        let error = prepare(&mut schema).unwrap_err().0;
        assert!(error.contains("multipleOf 10000000000: past constrained decoding's limit"));
    }

    /// Bounds past 2^53 - 1 on the far side are narrowed to it; on the near side refused.
    #[test]
    fn far_bounds_are_narrowed_and_near_ones_refused() {
        let mut schema = json!({"properties": {"n": {"type": "integer",
            "minimum": -9223372036854775808i64, "maximum": 9223372036854775807i64}},
            "items": {"exclusiveMaximum": 1e308, "exclusiveMinimum": -1e308, "maximum": 5}});
        prepare(&mut schema).unwrap();
        let limit = BOUND_LIMIT as i64;
        assert_eq!(schema["properties"]["n"]["minimum"], -limit);
        assert_eq!(schema["properties"]["n"]["maximum"], limit);
        assert_eq!(schema["items"]["exclusiveMaximum"], limit);
        assert_eq!(schema["items"]["exclusiveMinimum"], -limit);
        assert_eq!(schema["items"]["maximum"], 5);
        for (schema, expected) in [
            (
                json!({"minimum": 1e20}),
                "at the schema's root: minimum 100000000000000000000",
            ),
            (
                json!({"properties": {"a/b": {"maximum": -1e300}}}),
                "at /properties/a~1b: maximum -1",
            ),
        ] {
            let error = prepare(&mut schema.clone()).unwrap_err().0;
            assert!(error.starts_with(expected), "{error}");
        }
    }

    /// Data is not a schema: `const`, `enum` and `default` are left as they are.
    #[test]
    fn data_keywords_are_not_schemas() {
        let data = json!({"format": "date", "minimum": 1e300, "multipleOf": 0.07});
        let mut schema = json!({"const": data, "enum": [data], "default": data,
                                "properties": {"d": {"format": "date", "pattern": "^2"}}});
        prepare(&mut schema).unwrap();
        assert_eq!(schema["const"], data);
        assert_eq!(schema["enum"][0], data);
        assert_eq!(schema["properties"]["d"]["pattern"], "^2");
        assert_eq!(
            schema["properties"]["d"]["allOf"][0]["pattern"],
            format!("^{FULL_DATE}$")
        );
    }
}
