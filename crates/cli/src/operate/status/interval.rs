//! The checkpoint interval's part of `spot-worker status`: the fleet's
//! interruption counts (kept by the workers in the checkpoint container,
//! docs/checkpoint-interval.md), the rates estimated from them with this
//! environment's seed, the fleet's mean cost of a save, and the interval
//! those give. One read.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use serde::Serialize;
use spot_worker_decisions::cadence::{
    InterruptionCounts, IntervalSource, MIN_JOBS, RateEstimates, adaptive_interval,
};
use spot_worker_runtime::WorkerConfig;
use spot_worker_storage::{CheckpointStore, FleetLedger, StorageError};

#[derive(Debug, Serialize)]
pub(super) struct IntervalStatus {
    /// The fleet's counts as stored.
    counts: InterruptionCounts,
    /// The rates per job-hour, from the counts and the seed.
    estimates: RateEstimates,
    losing_per_hour: f64,
    /// The seed eviction rate (`SPOT_WORKER_EVICTION_RATE`).
    seed_evictions_per_hour: f64,
    /// The fleet's mean time a save blocked its job.
    mean_save_seconds: Option<f64>,
    /// The interval for a save of that cost, or the fixed one.
    interval_seconds: f64,
    /// Whether it is the fixed `SPOT_WORKER_CHECKPOINT_EVERY`.
    fixed: bool,
}

/// Reads the fleet's counts and works out the rest; a container not
/// created yet reads as no history.
pub(super) async fn interval_status(
    store: Arc<dyn CheckpointStore>,
    config: &WorkerConfig,
) -> Result<IntervalStatus> {
    let counts = match FleetLedger::for_queue(store, &config.queue).read().await {
        Ok(counts) => counts,
        Err(StorageError::NotFound { .. } | StorageError::MissingContainer { .. }) => {
            InterruptionCounts::default()
        }
        Err(error) => return Err(error).context("reading the fleet's interruption counts"),
    };
    Ok(status_of(
        counts,
        config.checkpoint_every,
        config.eviction_rate,
    ))
}

fn status_of(
    counts: InterruptionCounts,
    fixed: Option<Duration>,
    seed_evictions_per_hour: f64,
) -> IntervalStatus {
    let estimates = RateEstimates::from_counts(seed_evictions_per_hour, &counts);
    let mean_save_seconds = counts.mean_save_seconds();
    let interval = match fixed {
        Some(every) => IntervalSource::Explicit(every),
        None => IntervalSource::Adaptive {
            seed_evictions_per_hour,
        },
    };
    let interval = match interval {
        IntervalSource::Explicit(every) => every,
        IntervalSource::Adaptive { .. } => adaptive_interval(
            mean_save_seconds.map(Duration::from_secs_f64),
            estimates.losing_per_hour(),
        ),
    };
    IntervalStatus {
        counts,
        losing_per_hour: estimates.losing_per_hour(),
        estimates,
        seed_evictions_per_hour,
        mean_save_seconds,
        interval_seconds: interval.as_secs_f64(),
        fixed: fixed.is_some(),
    }
}

/// The lines `status` prints.
pub(super) fn lines(status: &IntervalStatus) -> Vec<String> {
    let c = &status.counts;
    let e = &status.estimates;
    let how = match (status.fixed, status.mean_save_seconds) {
        (true, _) => "fixed by SPOT_WORKER_CHECKPOINT_EVERY".to_owned(),
        (false, Some(cost)) => format!("Daly's, for the fleet's mean save of {cost:.3} s"),
        (false, None) => "no save measured yet: the least".to_owned(),
    };
    let jobs = match c.job_lengths.mean() {
        Some(mean) => {
            let finished = c.job_lengths.jobs();
            let when = if finished < MIN_JOBS {
                format!(" once {MIN_JOBS} have")
            } else {
                String::new()
            };
            format!(
                "; {finished} jobs finished, {:.1} s of work each on average (saves are spread over the rest a job is expected to need{when})",
                mean.as_secs_f64()
            )
        }
        None => String::new(),
    };
    vec![
        format!(
            "interval {:.0} s between checkpoints ({how})",
            status.interval_seconds
        ),
        format!(
            "  fleet: {:.1} job-hours; {} evictions saved at the notice, {} drained without a save after it, {} with a notice too late, {} deliveries with no outcome{jobs}",
            c.job_hours(),
            c.drained,
            c.unsaved,
            c.late,
            c.no_outcome
        ),
        format!(
            "  per job-hour: {:.4} evictions ({:.1} % losing work: {:.1} % too late, {:.1} % not saved at the notice), {:.4} no outcome: {:.4} losing work (seed {} evictions/h)",
            e.evictions_per_hour,
            e.losing_share() * 100.0,
            e.late_share * 100.0,
            e.unsaved_share * 100.0,
            e.no_outcome_per_hour,
            status.losing_per_hour,
            status.seed_evictions_per_hour
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_interval_follows_the_fleet_or_the_fixed_setting() {
        let counts = InterruptionCounts {
            drained: 99,
            late: 0,
            no_outcome: 9,
            job_seconds: 900.0 * 3600.0,
            saves: 10,
            save_seconds: 20.0,
            ..InterruptionCounts::default()
        };
        let adaptive = status_of(counts, None, 0.1);
        // (0.1·100 + 99)/1000 = 0.109 evictions/h, 1/101 of them losing
        // work; 9/1000 no outcome; a save of 2 s.
        let losing = 0.109 / 101.0 + 0.009;
        assert!((adaptive.losing_per_hour - losing).abs() < 1e-12);
        let expected = adaptive_interval(Some(Duration::from_secs(2)), losing);
        assert!((adaptive.interval_seconds - expected.as_secs_f64()).abs() < 1e-9);
        assert!(!adaptive.fixed);
        let text = lines(&adaptive).join("\n");
        assert!(text.contains("99 evictions saved at the notice"), "{text}");
        assert!(!text.contains("jobs finished"), "{text}");
        // The finished jobs' lengths, and whether they are used yet.
        let mut counts = counts;
        for n in 1..=10 {
            counts.job_lengths.add(Duration::from_secs(60));
            let text = lines(&status_of(counts, None, 0.1)).join("\n");
            let once = text.contains("expected to need once 10 have)");
            assert_eq!(once, n < 10, "{n}: {text}");
            assert!(
                text.contains(&format!("; {n} jobs finished, 60.0 s of work each")),
                "{text}"
            );
        }
        let fixed = status_of(counts, Some(Duration::from_secs(60)), 0.1);
        assert_eq!((fixed.interval_seconds, fixed.fixed), (60.0, true));
        assert!(lines(&fixed)[0].contains("fixed"));
    }
}
