//! [`MessageId`]: a queue message's id, on its own so that both the queue
//! and the errors that name a message can use it without importing each
//! other.

use std::fmt;

/// A queue message's id, assigned by the queue when the message is sent.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageId(String);

impl MessageId {
    /// Wraps an id string.
    pub fn new(id: impl Into<String>) -> Self {
        MessageId(id.into())
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
