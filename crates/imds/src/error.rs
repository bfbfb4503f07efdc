//! What can go wrong talking to IMDS, with enough context to act on.
//!
//! Each message says what failed; the cause is left to `source()` so that
//! reporters printing the whole chain (`anyhow`'s `{:#}`, [`ImdsError::chain`])
//! do not repeat it.

use std::time::Duration;

use crate::model::EventId;

/// An error from the IMDS client.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ImdsError {
    /// The configured endpoint is not a usable `http://` URL.
    #[error("invalid IMDS endpoint {endpoint:?}: {reason}")]
    InvalidEndpoint {
        /// The endpoint as configured.
        endpoint: String,
        /// Why it was refused.
        reason: String,
    },
    /// The HTTP client could not be built.
    #[error("could not build the IMDS HTTP client")]
    Client(#[source] reqwest::Error),
    /// No connection, or the connection broke before a full response.
    #[error("IMDS request to {url} failed")]
    Transport {
        /// The URL requested.
        url: String,
        /// The underlying error.
        #[source]
        source: reqwest::Error,
    },
    /// No response within the timeout.
    #[error("IMDS request to {url} timed out after {after:?}")]
    Timeout {
        /// The URL requested.
        url: String,
        /// The timeout that ran out.
        after: Duration,
    },
    /// IMDS answered with a redirect. IMDS never redirects; one means
    /// something is intercepting the traffic, so it is not followed.
    #[error("IMDS answered {status} with a redirect to {location:?}; refusing to follow")]
    Redirect {
        /// The status code.
        status: u16,
        /// The `Location` header, if any.
        location: Option<String>,
    },
    /// IMDS refused the request as malformed (400): missing `Metadata` header,
    /// bad api-version, bad approval payload or unknown event id.
    #[error("IMDS rejected the request (400 Bad Request): {message}")]
    BadRequest {
        /// The error text from IMDS.
        message: String,
    },
    /// IMDS is throttling us (429): more than 5 requests per second.
    #[error("IMDS is throttling requests (429 Too Many Requests)")]
    Throttled,
    /// Any other unexpected status.
    #[error("IMDS answered {status}: {body}")]
    Status {
        /// The status code.
        status: u16,
        /// The start of the body.
        body: String,
    },
    /// The response was larger than the configured bound.
    #[error("IMDS response exceeded {limit} bytes")]
    TooLarge {
        /// The bound, in bytes.
        limit: usize,
    },
    /// The response was not the JSON document expected.
    #[error("malformed {what} from IMDS (body starts {excerpt:?})")]
    Malformed {
        /// Which document.
        what: &'static str,
        /// The parse error.
        #[source]
        source: serde_json::Error,
        /// The start of the body.
        excerpt: String,
    },
    /// Approval was asked for an event IMDS does not currently list.
    #[error("event {0} is not in the current Scheduled Events document")]
    EventNotFound(EventId),
    /// Approval was asked for an event that does not list this VM; approving
    /// it would let Azure proceed on other VMs.
    #[error(
        "event {event_id} concerns {resources:?}, not this VM ({vm_name}); refusing to approve"
    )]
    NotThisVm {
        /// The event.
        event_id: EventId,
        /// The VMs it lists.
        resources: Vec<String>,
        /// This VM's name.
        vm_name: String,
    },
    /// Approval was asked for an event that lists other VMs besides this
    /// one; approving it would start it for them too, cutting their notice.
    #[error(
        "event {event_id} also concerns other VMs ({resources:?}, this VM is {vm_name}); \
         approving it would start it for all of them, so it is not approved"
    )]
    SharedEvent {
        /// The event.
        event_id: EventId,
        /// The VMs it lists.
        resources: Vec<String>,
        /// This VM's name.
        vm_name: String,
    },
}

impl ImdsError {
    /// The message followed by every cause, `: `-separated, on one line.
    pub fn chain(&self) -> String {
        let mut text = self.to_string();
        let mut source = std::error::Error::source(self);
        while let Some(cause) = source {
            text.push_str(": ");
            text.push_str(&cause.to_string());
            source = cause.source();
        }
        text
    }

    /// Whether trying again later may succeed (as opposed to a configuration
    /// or programming error that will fail the same way every time).
    pub fn is_transient(&self) -> bool {
        match self {
            ImdsError::Transport { .. }
            | ImdsError::Timeout { .. }
            | ImdsError::Throttled
            | ImdsError::Malformed { .. }
            | ImdsError::TooLarge { .. } => true,
            ImdsError::Status { status, .. } => *status >= 500,
            _ => false,
        }
    }
}

/// The most characters of a body an error carries.
pub(crate) const EXCERPT_CHARS: usize = 200;

/// The start of a body, for error messages and logs: one line (every run of
/// whitespace, newlines included, becomes one space) of at most
/// [`EXCERPT_CHARS`] characters, `…` marking a cut. An HTML error page from
/// something that is not IMDS must not spread over a log.
pub(crate) fn excerpt(body: &[u8]) -> String {
    // Enough bytes for EXCERPT_CHARS characters even after whitespace runs
    // collapse; the rest is never looked at.
    const SCAN: usize = 16 * EXCERPT_CHARS;
    let text = String::from_utf8_lossy(&body[..body.len().min(SCAN)]);
    let mut words = text
        .split_whitespace()
        .flat_map(|word| std::iter::once(' ').chain(word.chars()));
    words.next(); // the space before the first word
    let mut line: String = words.by_ref().take(EXCERPT_CHARS).collect();
    if words.next().is_some() || (body.len() > SCAN && !line.is_empty()) {
        line.push('…');
    }
    line
}

/// Parses an IMDS response body as JSON; a body that is not what was
/// expected is [`ImdsError::Malformed`], with an excerpt of it.
pub(crate) fn parse_json<T: serde::de::DeserializeOwned>(
    what: &'static str,
    body: &[u8],
) -> Result<T, ImdsError> {
    serde_json::from_slice(body).map_err(|source| ImdsError::Malformed {
        what,
        source,
        excerpt: excerpt(body),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::check_status;
    use reqwest::StatusCode;

    #[test]
    fn excerpts_are_one_bounded_line() {
        let page = "<!doctype html>\n<html lang=en>\n<title>404 Not Found</title>\n\
                    <h1>Not Found</h1>\n<p>The requested URL was not found on the server.</p>\n";
        let x200 = "x".repeat(200);
        // (body, excerpt)
        let table: [(&[u8], String); 7] = [
            (b"", String::new()),
            (b"  busy \r\n", "busy".to_owned()),
            (
                page.as_bytes(),
                "<!doctype html> <html lang=en> <title>404 Not Found</title> <h1>Not Found</h1> \
                 <p>The requested URL was not found on the server.</p>"
                    .to_owned(),
            ),
            (x200.as_bytes(), x200.clone()),
            (&[b'x'; 1000], format!("{x200}…")),
            (&[b' '; 100_000], String::new()),
            (b"a\tb\n\n\nc", "a b c".to_owned()),
        ];
        for (body, expected) in table {
            let got = excerpt(body);
            assert_eq!(got, expected, "{:?}", String::from_utf8_lossy(body));
            assert!(!got.contains('\n') && got.chars().count() <= EXCERPT_CHARS + 1);
        }
        // A long page, with lines, is still one short line.
        let long = page.repeat(50);
        let got = excerpt(long.as_bytes());
        assert_eq!(got.chars().count(), EXCERPT_CHARS + 1, "{got}");
        assert!(!got.contains('\n') && got.ends_with('…'));
        // So is the error a 404 page turns into, and a 400's message.
        let error = check_status(StatusCode::NOT_FOUND, long.as_bytes()).unwrap_err();
        assert!(!error.chain().contains('\n'), "{error}");
        assert!(
            error.chain().chars().count() < EXCERPT_CHARS + 40,
            "{error}"
        );
        let body = serde_json::json!({ "error": format!("bad\n{}", "y".repeat(500)) });
        let error = check_status(StatusCode::BAD_REQUEST, body.to_string().as_bytes()).unwrap_err();
        assert!(!error.chain().contains('\n'), "{error}");
        assert!(
            error.chain().chars().count() < EXCERPT_CHARS + 60,
            "{error}"
        );
    }
}
