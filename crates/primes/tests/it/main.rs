//! The integration tests of `spot-worker-primes`: one test binary, a module per
//! concern (each was its own binary), so the crate links one binary.
//! `cargo test -p spot-worker-primes --test it MODULE::` runs one module.

mod consumer;
