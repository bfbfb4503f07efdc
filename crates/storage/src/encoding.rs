//! How message bodies are encoded on the queue: plain text, or base64 (what
//! Azure Functions, WebJobs and the Python SDK's base64 policy send).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Serialize};

use crate::error::StorageError;

/// The encoding of message text on the queue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MessageEncoding {
    /// The message text is the body (must be UTF-8).
    #[default]
    Text,
    /// The message text is the standard base64 of the body.
    Base64,
}

/// A message body that does not decode under the configured encoding.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("message body is not valid {encoding:?}: {reason}")]
pub struct DecodeError {
    /// The encoding that was expected.
    pub encoding: MessageEncoding,
    /// Why decoding failed.
    pub reason: String,
}

impl MessageEncoding {
    /// Turns a body into message text.
    ///
    /// ```
    /// use spot_worker_storage::MessageEncoding;
    /// assert_eq!(MessageEncoding::Base64.encode(b"hi").unwrap(), "aGk=");
    /// assert_eq!(MessageEncoding::Text.encode(b"hi").unwrap(), "hi");
    /// ```
    pub fn encode(self, body: &[u8]) -> Result<String, StorageError> {
        match self {
            MessageEncoding::Text => std::str::from_utf8(body).map(str::to_owned).map_err(|e| {
                StorageError::InvalidArgument(format!("text message body is not UTF-8: {e}"))
            }),
            MessageEncoding::Base64 => Ok(STANDARD.encode(body)),
        }
    }

    /// Turns message text back into the body.
    pub fn decode(self, text: &str) -> Result<Vec<u8>, DecodeError> {
        match self {
            MessageEncoding::Text => Ok(text.as_bytes().to_vec()),
            // Senders sometimes wrap long base64 lines; whitespace is never
            // part of the payload, so ignore it rather than poison the message.
            MessageEncoding::Base64 => {
                let compact: String = text.chars().filter(|c| !c.is_whitespace()).collect();
                STANDARD.decode(compact).map_err(|e| DecodeError {
                    encoding: self,
                    reason: e.to_string(),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips_binary() {
        let body = [0u8, 159, 146, 150, 255];
        let text = MessageEncoding::Base64.encode(&body).unwrap();
        assert_eq!(MessageEncoding::Base64.decode(&text).unwrap(), body);
    }

    #[test]
    fn invalid_base64_is_an_error_not_a_panic() {
        let err = MessageEncoding::Base64.decode("not base64!").unwrap_err();
        assert!(err.to_string().contains("Base64"), "{err}");
    }

    #[test]
    fn text_rejects_non_utf8_bodies() {
        assert!(MessageEncoding::Text.encode(&[0xff, 0xfe]).is_err());
    }
}
