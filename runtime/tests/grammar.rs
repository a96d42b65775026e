//! Constrained decoding on the real model (SmolLM2-135M-Instruct): every answer to 32 JSON
//! Schemas of our own (tests/data/schemas.json), greedy and sampled, validates against its
//! schema with an independent validator (the `jsonschema` crate, formats checked); an
//! answer cut at its length is a prefix the grammar still accepts; a grammar that admits
//! every text changes no token; the vocabulary's bytes spell what the tokenizer encodes.
//!
//! Skipped when the artifact is missing (`REQUIRE_MODEL=1`, set by `just test`, makes that
//! a failure).
//!
//! Without a model, over a tiny vocabulary: schemas llguidance refuses or misreads as
//! written (`multipleOf: 0.07`, bounds at the int64 range and ±1e308, February 29th of any
//! year) compile and mean what they say, and those past what any rewriting can save are
//! refused naming the keyword and the limit (issue 42).

mod tiny_vocabulary;

use std::path::PathBuf;

use runtime::FlexBackend;
use runtime::generate::sampling::SamplingParams;
use runtime::generate::{GenerateOptions, Generator, StopReason};
use runtime::text::grammar::{Grammar, Grammars};
use runtime::text::tokenizer::Tokenizer;
use serde::Deserialize;
use serde_json::{Value, json};
use tiny_vocabulary::Tiny;

#[derive(Deserialize)]
struct Schemas {
    schemas: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    prompt: String,
    schema: Value,
}

fn model() -> Option<(Generator<FlexBackend>, Tokenizer)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../artifacts/smollm2-135m-instruct");
    if !dir.join("model.mpk").exists() {
        assert!(
            std::env::var_os("REQUIRE_MODEL").is_none(),
            "{} has no model.mpk: run `just fetch convert`",
            dir.display()
        );
        eprintln!("skipped: no converted model in {}", dir.display());
        return None;
    }
    let generator = Generator::load(&dir, &Default::default()).unwrap();
    let tokenizer = Tokenizer::from_dir(&dir).unwrap();
    Some((generator, tokenizer))
}

fn options(grammar: Option<Grammar>, temperature: f32, seed: u64, max: usize) -> GenerateOptions {
    GenerateOptions {
        max_new_tokens: max,
        sampling: SamplingParams {
            temperature,
            seed,
            ..Default::default()
        },
        stop: Vec::new(),
        grammar,
    }
}

/// A chat prompt asking for JSON.
fn prompt(tokenizer: &Tokenizer, text: &str) -> Vec<u32> {
    let messages = vec![runtime::text::chat::Message::new(
        "user",
        format!("{text} Answer in JSON."),
    )];
    let render = |request: &runtime::text::chat::ChatRequest| request.render();
    tokenizer
        .encode_messages(messages, &render, Default::default())
        .unwrap()
}

/// Every answer at temperature 0, greedy.
#[test]
fn every_greedy_answer_validates_against_its_schema() {
    answers_validate_against_their_schemas(0.0, 0);
}

/// Every answer sampled at temperature 0.8.
#[test]
fn every_sampled_answer_validates_against_its_schema() {
    answers_validate_against_their_schemas(0.8, 1);
}

/// Every answer sampled at temperature 1.3, where unlikely tokens are often drawn.
#[test]
fn every_hot_answer_validates_against_its_schema() {
    answers_validate_against_their_schemas(1.3, 2);
}

/// Every answer to the 32 schemas at `temperature` validates against its schema, or, cut at
/// its length, is a prefix the grammar still accepts; at least three quarters end. The
/// answers are decoded together ([`Generator::step_each`]: each sequence gets the tokens it
/// would get alone), one pass over the weights per step rather than one per answer.
fn answers_validate_against_their_schemas(temperature: f32, seed: u64) {
    let Some((generator, tokenizer)) = model() else {
        return;
    };
    let cases: Schemas = serde_json::from_str(include_str!("data/schemas.json")).unwrap();
    assert!(cases.schemas.len() >= 30);
    let grammars =
        Grammars::new(&tokenizer, generator.config.vocab_size, generator.eos_ids()).unwrap();
    let grammar = |case: &Case| Grammar::JsonSchema(case.schema.clone());
    let mut sequences: Vec<_> = (cases.schemas.iter())
        .map(|case| {
            let ids = prompt(&tokenizer, &case.prompt);
            let options = options(Some(grammar(case)), temperature, seed, 120);
            (generator.start(&tokenizer, &ids, options))
                .unwrap_or_else(|e| panic!("{}: {e}", case.name))
        })
        .collect();
    loop {
        let mut all: Vec<_> = sequences.iter_mut().collect();
        let results = generator.step_each(&mut all, |_, _| ());
        let mut running = false;
        for (result, case) in results.into_iter().zip(&cases.schemas) {
            let reason = result.unwrap_or_else(|e| panic!("{}: {e}", case.name));
            running |= reason.is_none();
        }
        if !running {
            break;
        }
    }
    let (mut ended, mut cut) = (0, 0);
    for (case, sequence) in cases.schemas.iter().zip(sequences) {
        let generation = sequence.finish(&mut |_| ());
        let context = format!("{} at T={temperature}: {:?}", case.name, generation.text);
        match generation.stop_reason {
            StopReason::Eos => {
                let validator = jsonschema::options()
                    .should_validate_formats(true)
                    .build(&case.schema)
                    .unwrap_or_else(|e| panic!("{}: {e}", case.name));
                let value: Value = serde_json::from_str(&generation.text)
                    .unwrap_or_else(|e| panic!("{context}: not JSON: {e}"));
                let errors: Vec<String> = validator
                    .iter_errors(&value)
                    .map(|e| e.to_string())
                    .collect();
                assert!(errors.is_empty(), "{context}: {errors:?}");
                ended += 1;
            }
            StopReason::Length => {
                // Cut short: still a prefix of an answer the grammar accepts.
                let mut constraint = grammars.constraint(&grammar(case)).unwrap();
                for &token in &generation.tokens {
                    constraint
                        .consume(token)
                        .unwrap_or_else(|e| panic!("{context}: {e}"));
                }
                cut += 1;
            }
            StopReason::Stop => unreachable!("no stop strings"),
        }
    }
    eprintln!("T={temperature}: {ended} answers ended and validated, {cut} cut at their length");
    assert!(
        ended >= cases.schemas.len() * 3 / 4,
        "T={temperature}: {ended} of {} ended",
        cases.schemas.len()
    );
}

/// A grammar every text satisfies masks nothing a greedy answer would take: the same tokens.
#[test]
fn a_grammar_that_admits_everything_changes_nothing() {
    let Some((generator, tokenizer)) = model() else {
        return;
    };
    for text in ["Write a haiku about the sea.", "What is 12 times 12?"] {
        let ids = prompt(&tokenizer, text);
        let free = generator.generate(&tokenizer, &ids, &options(None, 0.0, 0, 40), |_| ());
        let everything = Grammar::Lark(r"start: /(.|\n)*/".into());
        let masked = generator.generate(
            &tokenizer,
            &ids,
            &options(Some(everything), 0.0, 0, 40),
            |_| (),
        );
        assert_eq!(masked.unwrap().tokens, free.unwrap().tokens, "{text}");
    }
}

/// The bytes llguidance sees for each token, concatenated over an encoding, are the text.
#[test]
fn vocabulary_bytes_spell_the_text() {
    let Some((_, tokenizer)) = model() else {
        return;
    };
    let words = tokenizer.vocabulary_bytes();
    for text in [
        "Hello, world!",
        " leading space and  two",
        "日本語のテキスト 🎉 émoji",
        "line one\nline two\ttab\r\n",
        "{\"key\": [1, 2.5, -3e4], \"nested\": {\"a\": null}}",
        "1234567890 digits 42",
    ] {
        let ids = tokenizer.encode(text).unwrap();
        let bytes: Vec<u8> = ids
            .iter()
            .flat_map(|&id| words[id as usize].clone())
            .collect();
        assert_eq!(String::from_utf8_lossy(&bytes), text);
    }
    let specials = (words.iter()).filter(|w| w.first() == Some(&0xFF)).count();
    assert!(specials > 0, "the special tokens are marked");
}

/// `schema` as a grammar.
fn schema(schema: Value) -> Grammar {
    Grammar::JsonSchema(schema)
}

/// Whether the decimal `text` is a whole multiple of 7/100.
fn is_multiple_of_seven_hundredths(text: &str) -> bool {
    let unsigned = text.trim_start_matches('-');
    let (whole, fraction) = unsigned.split_once('.').unwrap_or((unsigned, ""));
    let fraction = fraction.trim_end_matches('0');
    let hundredths = format!("{whole}{fraction:0<2}");
    let remainder = (hundredths.bytes()).try_fold(0u32, |rest, b| {
        b.is_ascii_digit()
            .then(|| (rest * 10 + u32::from(b - b'0')) % 7)
    });
    fraction.len() <= 2 && remainder == Some(0)
}

/// `multipleOf: 0.07` (not exact as a float) compiles and means multiples of 7/100, as
/// written in decimal: allowed and refused texts, and numbers drawn at random under it.
#[test]
fn multiples_of_inexact_decimals_are_decimal_multiples() {
    let tiny = Tiny::new();
    let grammar = schema(json!({"type": "number", "multipleOf": 0.07}));
    for (text, allowed) in [
        ("0.07", true),
        ("0.21", true),
        ("-0.14", true),
        ("7", true),
        ("0", true),
        ("0.1", false),
        ("0.05", false),
        ("1", false),
    ] {
        assert_eq!(tiny.allows(&grammar, text), allowed, "{text}");
    }
    let mut drawn = 0;
    for seed in 0..30 {
        if let Some(text) = tiny.walk(&grammar, seed, 40) {
            assert!(is_multiple_of_seven_hundredths(&text), "{text}");
            drawn += 1;
        }
    }
    assert!(drawn >= 10, "{drawn}");
}

/// Bounds at the int64 range and at ±1e308 compile (narrowed to ±(2^53 - 1), inside the
/// schema's range); what they allow is within both.
#[test]
fn bounds_at_the_int64_and_float_ranges_compile() {
    let tiny = Tiny::new();
    let int64 = schema(
        json!({"type": "integer", "minimum": -9223372036854775808i64, "maximum": 9223372036854775807i64}),
    );
    let double = schema(json!({"type": "number", "minimum": -1e308, "maximum": 1e308}));
    let open = schema(
        json!({"type": "number", "exclusiveMinimum": -1.7976931348623157e308, "exclusiveMaximum": 1.7976931348623157e308}),
    );
    for (grammar, text, allowed) in [
        (&int64, "9007199254740991", true),
        (&int64, "-9007199254740991", true),
        (&int64, "0", true),
        (&int64, "12345678901234567", false),
        (&int64, "1.5", false),
        (&double, "-2.25", true),
        (&double, "9007199254740991.5", false),
        (&open, "3.75", true),
    ] {
        assert_eq!(tiny.allows(grammar, text), allowed, "{text}");
    }
}

/// Dates follow the calendar: February 29th in leap years only, in `date` and `date-time`,
/// with a schema's own pattern kept beside it.
#[test]
fn dates_are_calendar_dates() {
    let tiny = Tiny::new();
    let date = schema(json!({"type": "string", "format": "date"}));
    let date_time = schema(json!({"type": "string", "format": "date-time"}));
    let patterned = schema(json!({"type": "string", "format": "date", "pattern": "^2023"}));
    for (grammar, text, allowed) in [
        (&date, "2024-02-29", true),
        (&date, "2000-02-29", true),
        (&date, "2023-02-28", true),
        (&date, "2023-02-29", false),
        (&date, "1900-02-29", false),
        (&date, "2023-04-31", false),
        (&date_time, "2024-02-29T12:00:00Z", true),
        (&date_time, "2023-02-29T12:00:00Z", false),
        (&patterned, "2023-02-28", true),
        (&patterned, "2023-02-29", false),
        (&patterned, "2024-02-29", false),
    ] {
        assert_eq!(
            tiny.allows(grammar, &format!("{text:?}")),
            allowed,
            "{text}"
        );
    }
}

/// What no rewriting saves is refused naming the keyword, where it is and the limit.
#[test]
fn schemas_past_the_limits_are_refused_by_name() {
    let tiny = Tiny::new();
    for (schema, expected) in [
        (
            json!({"type": "number", "multipleOf": 1e10}),
            "at the schema's root: multipleOf 10000000000: past constrained decoding's limit: a multiple must be a whole number below 2^32 divided by a power of ten",
        ),
        (
            json!({"properties": {"n": {"type": "number", "minimum": 1e20}}}),
            "at /properties/n: minimum 100000000000000000000 is past ±9007199254740991 (2^53 - 1)",
        ),
        (
            json!({"items": {"type": "integer", "maximum": -1e19}}),
            "at /items: maximum -10000000000000000000 is past ±9007199254740991",
        ),
    ] {
        let error = tiny
            .grammars
            .constraint(&Grammar::JsonSchema(schema))
            .err()
            .expect("refused")
            .0;
        assert!(error.starts_with(expected), "{error}");
    }
}
