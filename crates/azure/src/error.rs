//! Turns Azure SDK errors into [`StorageError`]s the consumer understands
//! (lease lost, conflict, not found, a missing container, transient,
//! refused, rejected), with every SAS
//! signature and account key redacted from the text: SDK errors quote the
//! request URL, which carries the SAS.

use std::error::Error as _;
use std::future::Future;
use std::time::Duration;

use azure_core::error::ErrorKind;
use azure_core::http::StatusCode;
use spot_worker_storage::{MessageId, StorageError};

use crate::redact::redact;

/// What was being done, for messages and for deciding what a 404 means.
pub(crate) enum Operation<'a> {
    /// A call on a received message (renew, delete): 404 and 400
    /// `PopReceiptMismatch` mean the lease is gone.
    Message(&'a MessageId),
    /// A write fenced by `If-Match` or `If-None-Match: *` (a checkpoint, a
    /// create-only result): 409/412 mean someone else wrote first.
    ConditionalWrite(&'a str),
    /// Anything else; `what` names the resource for `NotFound`.
    Other(&'a str),
}

/// Longest error text kept, in characters: enough for the service's code,
/// message and request id; a whole response body is never wanted in a log
/// line, a readiness reason or a poison record.
const MAX_DESCRIPTION_CHARS: usize = 1000;

/// The error's full text (all sources), redacted, on one bounded line: the
/// service's XML error bodies span lines, and every line of a log is one
/// event.
pub(crate) fn describe(error: &azure_core::Error) -> String {
    one_line(&full_text(error), MAX_DESCRIPTION_CHARS)
}

/// `text` with every run of whitespace (newlines too) made one space, cut
/// to `max` characters with `…`.
pub(crate) fn one_line(text: &str, max: usize) -> String {
    let mut line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if let Some((cut, _)) = line.char_indices().nth(max) {
        line.truncate(cut);
        line.push('…');
    }
    line
}

fn full_text(error: &azure_core::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    if let ErrorKind::HttpResponse {
        status,
        error_code: Some(code),
        ..
    } = error.kind()
        && !text.contains(code.as_str())
    {
        text = format!("{status} {code}: {text}");
    }
    redact(&text)
}

pub(crate) fn error_code(error: &azure_core::Error) -> Option<&str> {
    match error.kind() {
        ErrorKind::HttpResponse { error_code, .. } => error_code.as_deref(),
        _ => None,
    }
}

pub(crate) fn map_error(error: azure_core::Error, operation: Operation<'_>) -> StorageError {
    let message = describe(&error);
    let code = error_code(&error).unwrap_or_default().to_owned();
    let Some(status) = error.http_status() else {
        // No response at all: connection refused/reset, timeout, DNS.
        return match error.kind() {
            ErrorKind::Connection | ErrorKind::Io => StorageError::Unavailable { message },
            ErrorKind::DataConversion => StorageError::InvalidData {
                what: "storage response".to_owned(),
                reason: message,
            },
            _ => StorageError::Unavailable { message },
        };
    };
    match (status, &operation) {
        (StatusCode::NotFound, Operation::Message(id)) if code != "QueueNotFound" => {
            StorageError::LeaseLost {
                message_id: (*id).clone(),
            }
        }
        (StatusCode::BadRequest, Operation::Message(id)) if code == "PopReceiptMismatch" => {
            StorageError::LeaseLost {
                message_id: (*id).clone(),
            }
        }
        (
            StatusCode::Conflict | StatusCode::PreconditionFailed,
            Operation::ConditionalWrite(key),
        ) => StorageError::Conflict {
            key: (*key).to_owned(),
        },
        (StatusCode::NotFound, Operation::Other(what) | Operation::ConditionalWrite(what))
            if code == "ContainerNotFound" =>
        {
            StorageError::MissingContainer {
                what: (*what).to_owned(),
                message,
            }
        }
        (StatusCode::Unauthorized | StatusCode::Forbidden, _) => StorageError::Refused {
            status: u16::from(status),
            message,
        },
        (StatusCode::NotFound, _) => StorageError::NotFound {
            what: match operation {
                Operation::Other(what) | Operation::ConditionalWrite(what) => {
                    format!("{what} ({code})")
                }
                Operation::Message(id) => format!("message {id} ({code})"),
            },
        },
        (StatusCode::RequestTimeout | StatusCode::TooManyRequests, _) => {
            StorageError::Unavailable { message }
        }
        (status, _) if u16::from(status) >= 500 => StorageError::Unavailable { message },
        (status, _) => StorageError::Rejected {
            status: u16::from(status),
            message,
        },
    }
}

/// Runs one storage call (retries included) with a total deadline. The SDK
/// transport allows 20 s to connect and 60 s per read, and its retry policy
/// only checks the elapsed time between tries, so a blackholed connection
/// would otherwise hold a receive, a renewal or a checkpoint read for a
/// minute or more. Dropping the call on timeout also drops its connection,
/// so the next call starts on a fresh one. A timeout is transient
/// ([`StorageError::Unavailable`]): the request may or may not have been
/// carried out, exactly as with a reset connection.
pub(crate) async fn bounded<T>(
    deadline: Duration,
    what: &str,
    call: impl Future<Output = Result<T, StorageError>>,
) -> Result<T, StorageError> {
    match tokio::time::timeout(deadline, call).await {
        Ok(result) => result,
        Err(_elapsed) => Err(StorageError::Unavailable {
            message: redact(&format!(
                "{what}: no answer within the call deadline of {deadline:?}"
            )),
        }),
    }
}

/// An error response with `status` and the service's `code`, as tests
/// of the mapping need one.
#[cfg(test)]
pub(crate) fn http(status: StatusCode, code: &str) -> azure_core::Error {
    azure_core::Error::with_message(
        ErrorKind::HttpResponse {
            status,
            error_code: Some(code.to_owned()),
            raw_response: None,
        },
        "the service said no",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_body_is_one_bounded_line() {
        let body = "404: <?xml version=\"1.0\"?>\n<Error>\n  <Code>ContainerNotFound</Code>\n  \
                    <Message>The specified container does not exist.\nRequestId:1</Message>\n</Error>";
        let error = azure_core::Error::with_message(ErrorKind::Other, body.to_owned());
        let text = describe(&error);
        assert_eq!(
            text,
            "404: <?xml version=\"1.0\"?> <Error> <Code>ContainerNotFound</Code> \
             <Message>The specified container does not exist. RequestId:1</Message> </Error>"
        );
        let long = azure_core::Error::with_message(ErrorKind::Other, "é".repeat(5000));
        let text = describe(&long);
        assert_eq!(text.chars().count(), MAX_DESCRIPTION_CHARS + 1);
        assert!(text.ends_with('…') && !text.contains('\n'));
    }

    /// What each status and error code becomes, per kind of operation: the
    /// consumer pauses on `Refused` and `MissingContainer` once they
    /// persist, waits out `Unavailable`, and never counts either.
    #[test]
    fn statuses_map_to_the_kinds_the_consumer_decides_by() {
        let id = MessageId::new("m1");
        let kind = |error: StorageError| match error {
            StorageError::LeaseLost { .. } => "lease lost",
            StorageError::Conflict { .. } => "conflict",
            StorageError::NotFound { .. } => "not found",
            StorageError::MissingContainer { .. } => "missing container",
            StorageError::Refused {
                status: 401 | 403, ..
            } => "refused",
            StorageError::Unavailable { .. } => "unavailable",
            StorageError::Rejected { .. } => "rejected",
            _ => "other",
        };
        use Operation::{ConditionalWrite, Message, Other};
        use StatusCode::{
            BadRequest, Forbidden, InternalServerError, NotFound, PreconditionFailed,
            ServiceUnavailable, TooManyRequests, Unauthorized,
        };
        // By the kind expected: the statuses and codes that map to it.
        let cases = [
            (
                "refused",
                vec![
                    (
                        Forbidden,
                        "AuthorizationPermissionMismatch",
                        Other("checkpoint c/k"),
                    ),
                    (Forbidden, "AuthenticationFailed", ConditionalWrite("k")),
                    (Forbidden, "AuthorizationFailure", Message(&id)),
                    (Unauthorized, "InvalidAuthenticationInfo", Other("queue q")),
                ],
            ),
            (
                "missing container",
                vec![
                    (NotFound, "ContainerNotFound", Other("checkpoint c/k")),
                    (NotFound, "ContainerNotFound", ConditionalWrite("k")),
                ],
            ),
            (
                "not found",
                vec![(NotFound, "QueueNotFound", Other("queue q"))],
            ),
            (
                "lease lost",
                vec![(NotFound, "MessageNotFound", Message(&id))],
            ),
            (
                "conflict",
                vec![(PreconditionFailed, "ConditionNotMet", ConditionalWrite("k"))],
            ),
            (
                "unavailable",
                vec![
                    (ServiceUnavailable, "ServerBusy", Other("queue q")),
                    (InternalServerError, "InternalError", ConditionalWrite("k")),
                    (TooManyRequests, "", Other("queue q")),
                ],
            ),
            (
                "rejected",
                vec![(BadRequest, "InvalidHeaderValue", Other("queue q"))],
            ),
        ];
        for (expected, rows) in cases {
            for (status, code, operation) in rows {
                let mapped = map_error(http(status, code), operation);
                assert_eq!(
                    kind(mapped.clone()),
                    expected,
                    "{status} {code}: {mapped:?}"
                );
            }
        }
    }
}
