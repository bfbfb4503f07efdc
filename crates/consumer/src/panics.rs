//! Handler code that panics, wherever it panics, is one more failed attempt.
//!
//! Left to unwind, a panic would end the delivery's task without settling:
//! its message would come back after every visibility timeout, for ever,
//! and never reach the poison queue. So every call into user code (the job
//! key, the completion marker, the completed-job check, the call that makes the handler's future
//! and the future itself) is caught, and the panic becomes an ordinary
//! failure whose text says where it happened.

use std::any::Any;
use std::fmt;
use std::panic::AssertUnwindSafe;

use super::handler::HandlerError;

/// Where in a [`MessageHandler`](super::MessageHandler) a panic happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum HandlerPart {
    JobKey,
    CompletionMarker,
    VerifyCompleted,
    /// The synchronous part of `handle`: before its future was returned.
    HandleStart,
    /// Inside the future `handle` returned.
    Handle,
}

impl fmt::Display for HandlerPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HandlerPart::JobKey => "job_key",
            HandlerPart::CompletionMarker => "completion_marker",
            HandlerPart::VerifyCompleted => "verify_completed",
            HandlerPart::HandleStart => "handle (before returning its future)",
            HandlerPart::Handle => "handle",
        })
    }
}

/// Runs `call`, one call into handler code; a panic in it comes back as the
/// failure it counts as. Nothing the handler shares with the consumer is
/// left half-updated by an unwind, hence the `AssertUnwindSafe`.
pub(super) fn catching<T>(part: HandlerPart, call: impl FnOnce() -> T) -> Result<T, HandlerError> {
    std::panic::catch_unwind(AssertUnwindSafe(call))
        .map_err(|payload| panic_error(part, payload.as_ref()))
}

/// The failure a panic in `part` counts as: `handler panicked in <part>:
/// <message>`.
pub(super) fn panic_error(part: HandlerPart, payload: &(dyn Any + Send)) -> HandlerError {
    let message = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic payload that is not text");
    format!("handler panicked in {part}: {message}").into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_a_failure_naming_where_and_why() {
        // (part, payload, expected text)
        let rows: [(HandlerPart, Box<dyn Any + Send>, &str); 4] = [
            (
                HandlerPart::JobKey,
                Box::new("no job field"),
                "handler panicked in job_key: no job field",
            ),
            (
                HandlerPart::VerifyCompleted,
                Box::new(String::from("index 3 out of range")),
                "handler panicked in verify_completed: index 3 out of range",
            ),
            (
                HandlerPart::HandleStart,
                Box::new(7_u32),
                "handler panicked in handle (before returning its future): a panic payload \
                 that is not text",
            ),
            (
                HandlerPart::Handle,
                Box::new("boom"),
                "handler panicked in handle: boom",
            ),
        ];
        for (part, payload, expected) in rows {
            assert_eq!(panic_error(part, payload.as_ref()).to_string(), expected);
        }
    }

    #[test]
    fn a_call_that_returns_is_passed_through() {
        assert_eq!(catching(HandlerPart::JobKey, || Some(3)).unwrap(), Some(3));
        let caught = catching(HandlerPart::JobKey, || -> Option<u8> { panic!("bad body") });
        assert_eq!(
            caught.unwrap_err().to_string(),
            "handler panicked in job_key: bad body"
        );
    }
}
