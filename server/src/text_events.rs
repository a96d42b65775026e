//! The engine's events as the answers of the Messages and Responses APIs read them: the
//! text as it comes, then how the generation ended. (Chat completions read log-probabilities
//! and several choices too: `reply.rs`.) A stream also says once, in a comment, that its
//! request waits for a slot, and stops reading as soon as its client is gone, which drops
//! the events and so cancels the request.

use std::convert::Infallible;

use axum::http::StatusCode;
use axum::response::sse::Event as SseEvent;
use tokio::sync::mpsc as async_mpsc;

use crate::engine::{Event, Finished};
use crate::error::ApiError;
use crate::reply::WAITING;

/// What an answer reads next.
pub(crate) enum Read {
    Text(String),
    Done(Finished),
    /// The generation ended without `Done`.
    Failed(Failure),
}

/// Why a generation ended without `Done`.
pub(crate) enum Failure {
    /// The engine failed.
    Engine(String),
    /// The request's grammar went past llguidance's limits: the request's fault.
    Refused(String),
    /// The engine stopped (the events ended without a word).
    Stopped,
}

impl Failure {
    /// The error to answer with: the server's (500) for the engine's failure or stopping,
    /// what `refused` makes of a refused grammar's message (each protocol names the field
    /// the grammar came from).
    pub(crate) fn error(self, refused: impl FnOnce(String) -> ApiError) -> ApiError {
        let engine =
            |message: &str| ApiError::with_status(StatusCode::INTERNAL_SERVER_ERROR, message);
        match self {
            Failure::Engine(message) => engine(&message),
            Failure::Stopped => engine("the engine stopped"),
            Failure::Refused(message) => refused(message),
        }
    }
}

/// The next text or ending, for a whole answer: waiting and log-probabilities skipped.
pub(crate) async fn next(events: &mut async_mpsc::UnboundedReceiver<Event>) -> Read {
    loop {
        if let Some(read) = read(events.recv().await) {
            return read;
        }
    }
}

/// [`next`] for a stream into `out`: the request's first wait for a slot goes out as the
/// [`WAITING`] comment. `None` once the client is gone.
pub(crate) async fn next_streamed(
    events: &mut async_mpsc::UnboundedReceiver<Event>,
    out: &async_mpsc::UnboundedSender<Result<SseEvent, Infallible>>,
    told_waiting: &mut bool,
) -> Option<Read> {
    loop {
        let event = tokio::select! {
            event = events.recv() => event,
            () = out.closed() => return None,
        };
        if matches!(event, Some(Event::Waiting)) && !*told_waiting {
            *told_waiting = true;
            out.send(Ok(SseEvent::default().comment(WAITING))).ok()?;
        } else if let Some(read) = read(event) {
            return Some(read);
        }
    }
}

/// What `event` (`None`: the events ended) tells a text answer; `None` for what it does
/// not read.
fn read(event: Option<Event>) -> Option<Read> {
    match event {
        Some(Event::Waiting | Event::Logprobs(_)) => None,
        Some(Event::Text(piece)) => Some(Read::Text(piece)),
        Some(Event::Done(finished)) => Some(Read::Done(finished)),
        Some(Event::Failed(message)) => Some(Read::Failed(Failure::Engine(message))),
        Some(Event::Refused(message)) => Some(Read::Failed(Failure::Refused(message))),
        None => Some(Read::Failed(Failure::Stopped)),
    }
}

#[cfg(test)]
mod tests {
    use runtime::generate::StopReason;

    use super::*;

    fn block_on<F: std::future::Future>(future: F) -> F::Output {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(future)
    }

    fn finished() -> Finished {
        Finished {
            reason: StopReason::Eos,
            prompt_tokens: 5,
            cached_tokens: 2,
            completion_tokens: 1,
            stop_string: None,
        }
    }

    /// A stream reads text and the end; the first wait goes out as one comment, later
    /// ones and log-probabilities are skipped.
    #[test]
    fn a_stream_is_told_once_that_it_waits() {
        let (sender, mut events) = async_mpsc::unbounded_channel();
        for event in [Event::Waiting, Event::Waiting, Event::Logprobs(Vec::new())] {
            sender.send(event).unwrap();
        }
        sender.send(Event::Text("Hi".into())).unwrap();
        sender.send(Event::Done(finished())).unwrap();
        let (out, mut sent) = async_mpsc::unbounded_channel();
        let mut told = false;
        let read = block_on(next_streamed(&mut events, &out, &mut told));
        assert!(matches!(read, Some(Read::Text(text)) if text == "Hi"));
        assert!(told);
        assert!(sent.try_recv().is_ok(), "the comment");
        assert!(sent.try_recv().is_err(), "one comment only");
        let read = block_on(next_streamed(&mut events, &out, &mut told));
        assert!(matches!(read, Some(Read::Done(f)) if f == finished()));
    }

    /// A stream whose client is gone stops reading, though the request has said nothing
    /// yet; a whole answer whose events end without `Done` reads that the engine stopped.
    #[test]
    fn reading_stops_when_the_client_or_the_engine_is_gone() {
        let (sender, mut events) = async_mpsc::unbounded_channel::<Event>();
        let (out, sent) = async_mpsc::unbounded_channel();
        drop(sent);
        let read = block_on(next_streamed(&mut events, &out, &mut false));
        assert!(read.is_none());
        sender.send(Event::Failed("out of memory".into())).unwrap();
        drop(sender);
        let read = block_on(next(&mut events));
        assert!(matches!(read, Read::Failed(Failure::Engine(m)) if m == "out of memory"));
        let read = block_on(next(&mut events));
        assert!(matches!(read, Read::Failed(Failure::Stopped)));
    }
}
