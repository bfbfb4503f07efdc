//! Turns Azure SDK errors into [`StorageError`]s the consumer understands
//! (lease lost, conflict, not found, transient, rejected), with every SAS
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

/// The error's full text (all sources), redacted.
pub(crate) fn describe(error: &azure_core::Error) -> String {
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
