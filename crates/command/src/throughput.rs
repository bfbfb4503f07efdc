//! The measured throughput of the worker's checkpoint saves, which a final
//! save is planned by against the time left.

use spot_worker_storage::files::SaveStats;

/// The throughput of the worker's checkpoint saves (bytes of checkpoint
/// read and saved per second, unchanged chunks included), for planning a
/// final save against the time left.
#[derive(Debug, Default)]
pub(crate) struct Throughput(std::sync::Mutex<Option<f64>>);

impl Throughput {
    /// Takes in a save of `stats`: the latest measurement weighs half.
    pub(crate) fn record(&self, stats: &SaveStats) {
        let seconds = stats.took.as_secs_f64();
        // Small saves say little about a large one.
        if stats.bytes < 16 * 1024 * 1024 || seconds <= 0.0 {
            return;
        }
        let rate = stats.bytes as f64 / seconds;
        let mut kept = self.0.lock().unwrap_or_else(|p| p.into_inner());
        *kept = Some(kept.map_or(rate, |old| (old + rate) / 2.0));
    }

    /// The measured rate, if any.
    pub(crate) fn bytes_per_second(&self) -> Option<f64> {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}
