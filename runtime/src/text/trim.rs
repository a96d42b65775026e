//! Text streamed piece by piece with its ends trimmed, and the held-back tail of a marker:
//! what the reasoning splitter and the tool-call parser share.

/// Text sent as it comes with the whitespace at its ends left out: whitespace at the start
/// is dropped, whitespace after text waits until more text follows it.
#[derive(Debug, Default)]
pub(crate) struct Trimmed {
    started: bool,
    space: String,
}

impl Trimmed {
    /// What of `text` can be sent now.
    pub(crate) fn push(&mut self, text: &str) -> Option<String> {
        let text = match self.started {
            true => text,
            false => text.trim_start(),
        };
        if text.is_empty() {
            return None;
        }
        self.started = true;
        let body = text.trim_end();
        if body.is_empty() {
            self.space.push_str(text);
            return None;
        }
        let space = std::mem::replace(&mut self.space, text[body.len()..].to_string());
        Some(space + body)
    }
}

/// The length of the longest end of `text` that is a start of `pattern` (shorter than it).
pub(crate) fn partial_suffix(text: &str, pattern: &str) -> usize {
    (1..pattern.len().min(text.len() + 1))
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n) && pattern.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}
