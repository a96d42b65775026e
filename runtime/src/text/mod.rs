//! Text in and out of the model, as token ids: the tokenizer and the chat request built from
//! the model's template ([`tokenizer`], [`chat`]), grammars that constrain generation
//! ([`grammar`]), tool calls and a thinking model's reasoning read back from the text
//! ([`tools`], [`reasoning`]).
//!
//! Uses only [`crate::util`] and no Burn type, so it can be used and tested without a model
//! (a vocabulary size is all it needs to know of one).

pub mod chat;
pub mod grammar;
pub mod reasoning;
pub mod tokenizer;
pub mod tools;
mod trim;
