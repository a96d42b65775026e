//! A chat request's `response_format`, or its `tools` and `tool_choice` (in the format the
//! first byte picks), as the server reads them (`server::api::chat`), then the grammar compiled over a small byte-level vocabulary (the tiny test checkpoints') and
//! followed for up to 32 tokens the input picks among those allowed: any request must be
//! refused with an error or give a grammar that masks and consumes, within llguidance's
//! limits (time and memory bounded by them).
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use runtime::text::grammar::Grammars;
use runtime::text::tokenizer::Tokenizer;
use runtime::text::tools::Format;

const TOKENIZER: &[u8] = include_bytes!("../../converter/tests/data/tiny-llama3/tokenizer.json");
const VOCAB: usize = 384;

fn grammars() -> &'static Grammars {
    static GRAMMARS: OnceLock<Grammars> = OnceLock::new();
    GRAMMARS.get_or_init(|| {
        let tokenizer = Tokenizer::from_json(TOKENIZER, None).expect("the fixture's tokenizer");
        Grammars::new(&tokenizer, VOCAB, &[1]).expect("its vocabulary")
    })
}

fuzz_target!(|data: &[u8]| {
    // The first bytes pick tokens; the rest is the request body.
    let (picks, body) = data.split_at(data.len().min(32));
    let Ok(request) = server::api::chat(body) else {
        return;
    };
    let format = match picks.first() {
        Some(pick) if pick % 2 == 1 => Format::Llama3,
        _ => Format::Hermes,
    };
    let tools = request.tools.and_then(|tools| tools.grammar(format));
    let Some(grammar) = request.grammar.or(tools) else {
        return;
    };
    let Ok(mut constraint) = grammars().constraint(&grammar) else {
        return;
    };
    let mut logits = vec![0.0f32; VOCAB];
    for &pick in picks {
        logits.fill(0.0);
        if constraint.mask(&mut logits).is_err() {
            return;
        }
        let allowed: Vec<u32> = (0..VOCAB as u32)
            .filter(|&id| logits[id as usize] == 0.0)
            .collect();
        let Some(&token) = allowed.get(pick as usize % allowed.len().max(1)) else {
            return;
        };
        if token == 1 || constraint.consume(token).is_err() {
            return;
        }
    }
});
