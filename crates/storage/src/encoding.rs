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
            MessageEncoding::Text => {
                let text = std::str::from_utf8(body).map_err(|e| {
                    StorageError::InvalidArgument(format!("text message body is not UTF-8: {e}"))
                })?;
                check_sendable(text)?;
                Ok(text.to_owned())
            }
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

/// The first character of `text` (its byte offset, and itself) that a
/// queue message cannot carry: messages travel in XML 1.0 documents, whose
/// characters are tab, line feed, carriage return, U+0020 to U+D7FF,
/// U+E000 to U+FFFD and U+10000 up. Anything else in a message text makes
/// the message unreadable (Azurite accepts it, then answers every receive
/// of the queue with HTTP 500, so nothing queued after it runs).
///
/// ```
/// use spot_worker_storage::unsendable_char;
///
/// assert_eq!(unsendable_char("tab\tok\r\n"), None);
/// assert_eq!(unsendable_char("a\u{1}b"), Some((1, '\u{1}')));
/// assert_eq!(unsendable_char("\u{ffff}"), Some((0, '\u{ffff}')));
/// ```
pub fn unsendable_char(text: &str) -> Option<(usize, char)> {
    text.char_indices().find(|&(_, c)| {
        !matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{d7ff}' | '\u{e000}'..='\u{fffd}' | '\u{10000}'..)
    })
}

/// An error ([`StorageError::InvalidArgument`]) for a message text that
/// holds a character [`unsendable_char`] finds, naming it and where.
pub fn check_sendable(text: &str) -> Result<(), StorageError> {
    match unsendable_char(text) {
        None => Ok(()),
        Some((at, c)) => Err(StorageError::InvalidArgument(format!(
            "the message text holds U+{:04X} at byte {at}, which a queue message cannot carry (a \
             message travels as XML 1.0: no control character but tab, line feed and carriage \
             return, no U+FFFE or U+FFFF)",
            u32::from(c)
        ))),
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
        // (text, refused)
        for (text, refused) in [
            ("plain \t\r\n text <&> ü 日本 😀", None),
            ("nul \0", Some("U+0000 at byte 4")),
            ("\x01", Some("U+0001 at byte 0")),
            ("esc \x1b[31m", Some("U+001B at byte 4")),
            ("del \x7f and c1 \u{9b} are XML", None),
            ("ab\u{fffe}", Some("U+FFFE at byte 2")),
            ("\u{ffff}", Some("U+FFFF at byte 0")),
            ("\u{fffd} replacement", None),
        ] {
            match (MessageEncoding::Text.encode(text.as_bytes()), refused) {
                (Ok(sent), None) => assert_eq!(sent, text),
                (Err(error), Some(what)) => assert!(error.to_string().contains(what), "{error}"),
                (got, expected) => panic!("{text:?}: {got:?}, expected {expected:?}"),
            }
            // Base64 carries any byte.
            assert!(MessageEncoding::Base64.encode(text.as_bytes()).is_ok());
        }
    }
}
