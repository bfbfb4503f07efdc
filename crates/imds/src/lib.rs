//! Azure IMDS Scheduled Events.
