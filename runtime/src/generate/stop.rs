//! Stop strings: text held back while a stop string may still start in it.

/// Generated text that is released to the caller only once no stop string can still start
/// in it.
pub(super) struct StopText {
    pub(super) stops: Vec<String>,
    text: String,
    emitted: usize,
    /// The stop string that was reached, by its place in `stops`.
    matched: Option<usize>,
}

impl StopText {
    pub(super) fn new(stops: Vec<String>) -> Self {
        Self {
            stops,
            text: String::new(),
            emitted: 0,
            matched: None,
        }
    }

    /// Appends `piece`; emits what is safe; returns true if a stop string was reached (the
    /// text is then cut before it).
    pub(super) fn push(&mut self, piece: &str, emit: &mut impl FnMut(&str)) -> bool {
        // A stop string may span pieces: search from where the newest one could start.
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        let mut from = self.text.len().saturating_sub(longest);
        while !self.text.is_char_boundary(from) {
            from -= 1;
        }
        self.text.push_str(piece);
        // The earliest in the text; of several starting there, the first listed.
        let found = (self.stops.iter().enumerate())
            .filter(|(_, s)| !s.is_empty())
            .filter_map(|(k, s)| self.text[from..].find(s.as_str()).map(|i| (from + i, k)))
            .min();
        if let Some((cut, k)) = found {
            self.matched = Some(k);
            self.text.truncate(cut);
            self.finish(emit);
            return true;
        }
        // Hold back a tail that is the beginning of some stop string.
        let held = (1..=longest.min(self.text.len()))
            .rev()
            .filter(|&k| self.text.is_char_boundary(self.text.len() - k))
            .find(|&k| {
                let tail = &self.text[self.text.len() - k..];
                self.stops.iter().any(|s| s.starts_with(tail))
            })
            .unwrap_or(0);
        let safe = (self.text.len() - held).max(self.emitted);
        if safe > self.emitted {
            emit(&self.text[self.emitted..safe]);
            self.emitted = safe;
        }
        false
    }

    /// Emits whatever is still held back.
    pub(super) fn finish(&mut self, emit: &mut impl FnMut(&str)) {
        if self.text.len() > self.emitted {
            emit(&self.text[self.emitted..]);
            self.emitted = self.text.len();
        }
    }

    /// The stop string that ended the text, if one did.
    pub(super) fn matched(&self) -> Option<&str> {
        self.matched.map(|k| self.stops[k].as_str())
    }

    pub(super) fn into_text(self) -> String {
        self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, Vec<String>, bool) {
        let (text, emitted, matched) = run_matched(stops, pieces);
        (text, emitted, matched.is_some())
    }

    /// The text, what was emitted, and the stop string that ended it.
    fn run_matched(stops: &[&str], pieces: &[&str]) -> (String, Vec<String>, Option<String>) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut text = StopText::new(stops);
        let mut emitted = Vec::new();
        for piece in pieces {
            if text.push(piece, &mut |s: &str| emitted.push(s.to_string())) {
                break;
            }
        }
        text.finish(&mut |s: &str| emitted.push(s.to_string()));
        let matched = text.matched().map(str::to_string);
        (text.into_text(), emitted, matched)
    }

    /// The stop string reached is the one starting earliest; of two starting at the same
    /// place, the one listed first (Anthropic's `stop_sequence` names it).
    #[test]
    fn the_stop_string_reached_is_told() {
        let (text, _, matched) = run_matched(&["xyz", "b", "c"], &["a", "bc"]);
        assert_eq!((text.as_str(), matched.as_deref()), ("a", Some("b")));
        let (_, _, matched) = run_matched(&["ab", "abc"], &["x", "abc"]);
        assert_eq!(matched.as_deref(), Some("ab"));
        let (_, _, matched) = run_matched(&["abc", "ab"], &["x", "abc"]);
        assert_eq!(matched.as_deref(), Some("abc"));
        let (_, _, matched) = run_matched(&["q"], &["x", "abc"]);
        assert_eq!(matched, None);
    }

    #[test]
    fn stop_string_across_pieces_is_cut_and_never_emitted() {
        let (text, emitted, stopped) = run(&["\n\nUser"], &["Hi", " there", "\n", "\nUs", "er:"]);
        assert!(stopped);
        assert_eq!(text, "Hi there");
        assert_eq!(emitted.concat(), "Hi there");
    }

    #[test]
    fn held_back_prefix_is_released_when_it_does_not_match() {
        let (text, emitted, stopped) = run(&["END"], &["a E", "N", "x 日本"]);
        assert!(!stopped);
        assert_eq!(text, "a ENx 日本");
        assert_eq!(emitted.concat(), text);
        assert_eq!(emitted[0], "a ");
    }
}
