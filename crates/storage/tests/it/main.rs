//! The store's integration tests, in one binary (each test binary links the
//! whole dependency graph again): the in-memory stores against the
//! contracts every backend meets, chunked checkpoint files under faults and
//! at their limits, and the systematic fault search.
//!
//! Run one room with a filter: `cargo test -p spot-worker-storage --test it
//! fault_search`.

mod common;

mod chunk_faults;
mod contract;
mod dir_limits;
mod fault_search;
