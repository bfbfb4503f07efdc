//! IMDS emulator.
