//! # spot-worker-primes
//!
//! The example job of spot-worker, shared by `examples/primes.rs` and the
//! `spot-worker demo` command so its logic lives in one place. A message
//! `{"job_id":"j1","start":0,"end":50000000}` means: count the primes in
//! `[start, end)` in chunks, checkpointing the cursor and partial count after
//! a chunk when a save is due (and when evicted), then write the result
//! `j1.json` = `{"job_id":"j1","start":0,"end":50000000,"primes":N}`
//! create-only. It is real CPU work (a segmented sieve of Eratosthenes, no
//! sleeps), resumable after an eviction, and its result can be checked
//! independently ([`expected_result`]).
//!
//! - [`count_primes`]: the arithmetic, in one call.
//! - [`PrimesJob`]: the message, parsed and validated.
//! - [`handler`]: the job as a [`MessageHandler`](spot_worker_consumer::MessageHandler)
//!   for the storage crate's `Consumer`, with a progress hook
//!   ([`PrimesConfig::on_progress`]).
//!
//! It depends only on `spot-worker-storage`'s traits: any queue, checkpoint
//! store and result store (in memory, Azure) will do.

mod config;
mod handler;
mod job;
mod sieve;

pub use config::{
    DEFAULT_CHECKPOINT_EVERY, DEFAULT_CHUNK_SIZE, PrimesConfig, Progress, ProgressHook,
};
pub use handler::{PrimesHandler, handler};
pub use job::{MAX_END, MAX_JOB_ID_LEN, PrimesError, PrimesJob, expected_result};
pub use sieve::count_primes;
