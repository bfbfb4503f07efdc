//! The package of the example workers, `examples/primes.rs` and
//! `examples/stubborn.rs` (`cargo run --example primes`); this library is
//! empty. Why they are a package of their own is in `examples/Cargo.toml`.
