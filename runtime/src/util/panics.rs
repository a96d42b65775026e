//! Turning a panic inside a library we call into an error.
//!
//! Some libraries panic on input they should reject: the `tokenizers` crate when a
//! tokenizer.json's regex exceeds Oniguruma's backtracking limit.
//! Where input reaches such a call, it runs through [`catch_quietly`], so the user sees one
//! error line instead of a panic message and a backtrace.

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Once;

thread_local! {
    /// Set while this thread runs inside [`catch_quietly`].
    static QUIET: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f`, turning a panic into `Err(message)` without printing it. Panics elsewhere, on
/// other threads or outside such a call, are reported as usual.
pub fn catch_quietly<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.get() {
                previous(info);
            }
        }));
    });
    let was_quiet = QUIET.replace(true);
    let result = catch_unwind(AssertUnwindSafe(f));
    QUIET.set(was_quiet);
    result.map_err(|payload| {
        payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_its_message() {
        assert_eq!(catch_quietly(|| 7), Ok(7));
        let err = catch_quietly(|| -> u8 { panic!("bad input {}", 3) }).unwrap_err();
        assert_eq!(err, "bad input 3");
        assert!(!QUIET.get());
    }
}
