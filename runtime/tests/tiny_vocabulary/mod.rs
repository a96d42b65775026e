//! Grammars over a small byte-level vocabulary, without a model: the tiny Llama 3
//! checkpoint's tokenizer (converter/tests/data/tiny-llama3, 384 ids, end id 1). A text is
//! checked against a grammar token by token, and answers are drawn at random among the
//! tokens a grammar allows.

use runtime::text::grammar::{Constraint, Grammar, Grammars};
use runtime::text::tokenizer::Tokenizer;

const TOKENIZER: &[u8] = include_bytes!("../../../converter/tests/data/tiny-llama3/tokenizer.json");
const VOCAB: usize = 384;
const END: u32 = 1;

pub struct Tiny {
    tokenizer: Tokenizer,
    pub grammars: Grammars,
}

impl Tiny {
    pub fn new() -> Self {
        let tokenizer = Tokenizer::from_json(TOKENIZER, None).unwrap();
        let grammars = Grammars::new(&tokenizer, VOCAB, &[END]).unwrap();
        Tiny {
            tokenizer,
            grammars,
        }
    }

    /// Whether `grammar` allows `text` as a whole answer: each of its tokens, then the end.
    pub fn allows(&self, grammar: &Grammar, text: &str) -> bool {
        let mut constraint = self.grammars.constraint(grammar).unwrap();
        for id in self.tokenizer.encode_rendered(text).unwrap() {
            if !allowed(&mut constraint).contains(&id) {
                return false;
            }
            constraint.consume(id).unwrap();
        }
        allowed(&mut constraint).contains(&END)
    }

    /// An answer drawn uniformly among the tokens `grammar` allows at each step (seeded),
    /// ended as soon as the end is allowed: its text, or `None` past `most` tokens.
    pub fn walk(&self, grammar: &Grammar, seed: u64, most: usize) -> Option<String> {
        let mut constraint = self.grammars.constraint(grammar).unwrap();
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut bytes = Vec::new();
        for _ in 0..most {
            let allowed = allowed(&mut constraint);
            if allowed.contains(&END) {
                return Some(String::from_utf8(bytes).unwrap());
            }
            // xorshift64: enough to spread the draws.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let id = allowed[(state % allowed.len() as u64) as usize];
            constraint.consume(id).unwrap();
            bytes.extend(self.tokenizer.token_bytes(id));
        }
        None
    }
}

/// The ids `constraint` allows next.
fn allowed(constraint: &mut Constraint) -> Vec<u32> {
    let mut logits = vec![0.0f32; VOCAB];
    constraint.mask(&mut logits).unwrap();
    (0..VOCAB as u32)
        .filter(|&id| logits[id as usize] == 0.0)
        .collect()
}
