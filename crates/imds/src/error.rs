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
