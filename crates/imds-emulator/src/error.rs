//! The error type of the emulator's Rust API.

/// Why an operation on the emulator's events was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EmulatorError {
    /// No event with this id is currently in the events array.
    #[error("no event with id {0} is currently scheduled")]
    UnknownEvent(String),
    /// A scenario step names a key that no earlier step scheduled.
    #[error("no event was scheduled under the scenario key {0:?}")]
    UnknownKey(String),
    /// The event has started and can therefore no longer be cancelled.
    #[error("event {0} has already started and can no longer be cancelled")]
    AlreadyStarted(String),
    /// The event specification is not something the real service would send.
    #[error("invalid event: {0}")]
    InvalidSpec(String),
}
