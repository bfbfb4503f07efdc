//! How a primes job runs: its chunk size, how often it saves, and the
//! progress it reports after each chunk ([`Progress`], [`ProgressHook`]).

use std::fmt;
use std::num::NonZeroU64;
use std::sync::Arc;
use std::time::Duration;

/// Numbers per chunk unless configured otherwise: about 1.3 ms of one core
/// in a release build near 0 and 5.5 ms near `MAX_END` (10^12; `cargo
/// bench -p spot-worker-primes --bench pace`, docs/benchmarks.md): how
/// often the job reports progress and asks whether a save is due (it sees
/// a cancellation sooner, at the next 256 Ki-number segment).
pub const DEFAULT_CHUNK_SIZE: NonZeroU64 = match NonZeroU64::new(1_000_000) {
    Some(n) => n,
    None => NonZeroU64::MIN,
};

/// Called after each computed chunk (also for the part of a chunk counted
/// before a cancellation), whether or not its progress was checkpointed:
/// work reported twice is work redone.
pub type ProgressHook = Arc<dyn Fn(&Progress) + Send + Sync>;

/// Where a job stands after a chunk, for progress reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Progress {
    /// The job.
    pub job_id: String,
    /// The job's range start.
    pub start: u64,
    /// The job's range end.
    pub end: u64,
    /// Where the numbers just counted began: `[chunk_start, cursor)` is the
    /// work this report adds (a whole chunk, or the part of one counted
    /// before a cancellation).
    pub chunk_start: u64,
    /// Where the saved progress ends and the next chunk begins; the job is
    /// done when it reaches `end`.
    pub cursor: u64,
    /// Primes found in `[start, cursor)`.
    pub primes: u64,
}

impl Progress {
    /// The share of the range done, from 0.0 to 1.0 (1.0 for an empty range).
    pub fn fraction(&self) -> f64 {
        let total = self.end.saturating_sub(self.start);
        if total == 0 {
            return 1.0;
        }
        self.cursor.saturating_sub(self.start) as f64 / total as f64
    }
}

/// The fixed interval the job saved its progress at before it followed the
/// worker's checkpoint interval ([`JobCheckpoint::is_due_before_end`]), for a caller
/// that wants it back: `with_checkpoint_every(DEFAULT_CHECKPOINT_EVERY)`.
pub const DEFAULT_CHECKPOINT_EVERY: Duration = Duration::from_secs(10);

/// How the job runs.
#[derive(Clone)]
pub struct PrimesConfig {
    /// Numbers per chunk: the unit of work between cancellation checks and
    /// progress reports.
    pub chunk_size: NonZeroU64,
    /// When to save progress after a chunk. `None` (the default): when the
    /// job's checkpoint says a save is due
    /// ([`JobCheckpoint::is_due_before_end`]: the worker's checkpoint
    /// interval, adapted to what a save costs and how often interruptions
    /// lose work, and spread over the time the rest of the range takes at
    /// this delivery's pace; docs/checkpoint-interval.md).
    /// `Some(every)`: if this long has passed since the last save
    /// (`Duration::ZERO`: after every chunk). Progress is also saved when
    /// the job is cancelled, and a finished job writes its result instead.
    pub checkpoint_every: Option<Duration>,
    /// Called after every chunk (for progress bars).
    pub on_progress: Option<ProgressHook>,
}

impl Default for PrimesConfig {
    fn default() -> Self {
        PrimesConfig {
            chunk_size: DEFAULT_CHUNK_SIZE,
            checkpoint_every: None,
            on_progress: None,
        }
    }
}

impl fmt::Debug for PrimesConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrimesConfig")
            .field("chunk_size", &self.chunk_size)
            .field("checkpoint_every", &self.checkpoint_every)
            .field("on_progress", &self.on_progress.as_ref().map(|_| "set"))
            .finish()
    }
}

impl PrimesConfig {
    /// Sets the chunk size.
    pub fn with_chunk_size(mut self, chunk_size: NonZeroU64) -> Self {
        self.chunk_size = chunk_size;
        self
    }

    /// Saves progress at a fixed interval instead of the worker's.
    pub fn with_checkpoint_every(mut self, every: Duration) -> Self {
        self.checkpoint_every = Some(every);
        self
    }

    /// Sets the progress hook.
    pub fn with_progress(mut self, hook: impl Fn(&Progress) + Send + Sync + 'static) -> Self {
        self.on_progress = Some(Arc::new(hook));
        self
    }
}
