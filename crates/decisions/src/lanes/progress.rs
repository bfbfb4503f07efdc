//! [`job_progress`]: the one rule for how much of its work a job has done,
//! from every source a job's progress can come from, best first. The
//! runner's save (what the checkpoint stamp keeps), the lane rule at a
//! release and in the keeper, `status` and the completion record all ask
//! this function, so that each shows the same figure for the same job.

use std::time::Duration;

/// What is known about a job's progress at one moment, by source.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProgressReadings {
    /// The job finished (its handler succeeded): all its work is done,
    /// whatever it last reported.
    pub finished: bool,
    /// The program's progress file (`SPOT_WORKER_PROGRESS`), read as the
    /// save began: the freshest word of a program run by the runner.
    pub file: Option<f64>,
    /// The share the handler last reported (`Job::report_progress`, the
    /// runner's earlier readings of the progress file), else the share the
    /// checkpoint it resumed from was stamped with. A stamp keeps the share
    /// its save resolved from the two sources above; a reader of a stamp
    /// gives it here.
    pub reported: Option<f64>,
    /// The job's useful time as of the same save (its goodput ledger): the
    /// fallback for a job that reports nothing.
    pub useful: Option<Duration>,
}

/// Where [`job_progress`] took a job's progress from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProgressSource {
    /// The job finished.
    Finished,
    /// The program's progress file, read at the save.
    File,
    /// What the handler reported (or a stamp kept).
    Reported,
    /// Useful time over the job's work.
    UsefulTime,
    /// Nothing: no progress.
    Nothing,
}

/// A job's progress: the share of its work done (0 to 1) when the job
/// says it, the work done as a duration, and where it came from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct JobProgress {
    /// The share done, when the job finished or reported one.
    pub share: Option<f64>,
    /// The work done: the share times the job's work, else its useful time.
    pub done: Duration,
    /// Which source gave it.
    pub source: ProgressSource,
}

impl JobProgress {
    /// The share done for people: the reported share, else the work done
    /// over `work` (none for a job without an estimate of its work).
    pub fn fraction_of(&self, work: Duration) -> Option<f64> {
        self.share.or_else(|| {
            (!work.is_zero()).then(|| (self.done.as_secs_f64() / work.as_secs_f64()).min(1.0))
        })
    }
}

/// A usable share: finite, clamped to 0..=1 (`parse` takes "NaN").
fn usable(share: Option<f64>) -> Option<f64> {
    share
        .filter(|share| share.is_finite())
        .map(|share| share.clamp(0.0, 1.0))
}

/// The share a job reports: its progress file read at the save, else what
/// its handler reported; `None` if neither said a usable number. This is
/// what a save stamps.
pub fn reported_share(file: Option<f64>, reported: Option<f64>) -> Option<f64> {
    usable(file).or_else(|| usable(reported))
}

/// A job's progress against `work` (its estimated work), by precedence:
/// finished (all of it); the progress file read at the save; the handler's
/// reported share (or a stamp's); the useful time; nothing.
///
/// ```
/// use std::time::Duration;
/// use spot_worker_decisions::lanes::{ProgressReadings, ProgressSource, job_progress};
///
/// let readings = ProgressReadings {
///     file: Some(0.375),
///     reported: Some(0.1),
///     useful: Some(Duration::from_secs(2)),
///     ..ProgressReadings::default()
/// };
/// let progress = job_progress(&readings, Duration::from_secs(80));
/// assert_eq!(progress.done, Duration::from_secs(30));
/// assert_eq!(progress.source, ProgressSource::File);
/// ```
pub fn job_progress(readings: &ProgressReadings, work: Duration) -> JobProgress {
    let of_work = |share: f64, source| JobProgress {
        share: Some(share),
        done: work.mul_f64(share),
        source,
    };
    if readings.finished {
        return of_work(1.0, ProgressSource::Finished);
    }
    if let Some(share) = usable(readings.file) {
        return of_work(share, ProgressSource::File);
    }
    if let Some(share) = usable(readings.reported) {
        return of_work(share, ProgressSource::Reported);
    }
    match readings.useful {
        Some(useful) => JobProgress {
            share: None,
            done: useful,
            source: ProgressSource::UsefulTime,
        },
        None => JobProgress {
            share: None,
            done: Duration::ZERO,
            source: ProgressSource::Nothing,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_precedence_finished_file_reported_useful_time() {
        let secs = Duration::from_secs;
        let work = secs(80);
        use ProgressSource::*;
        // (finished, file, reported, useful s, done s, share, source)
        let rows = [
            (
                true,
                Some(0.2),
                Some(0.3),
                Some(5),
                80.0,
                Some(1.0),
                Finished,
            ),
            (true, None, None, None, 80.0, Some(1.0), Finished),
            (false, Some(0.5), Some(0.25), Some(5), 40.0, Some(0.5), File),
            (false, Some(1.5), None, None, 80.0, Some(1.0), File),
            (false, Some(-1.0), None, None, 0.0, Some(0.0), File),
            (
                false,
                Some(f64::NAN),
                Some(0.25),
                Some(5),
                20.0,
                Some(0.25),
                Reported,
            ),
            (false, None, Some(0.25), Some(5), 20.0, Some(0.25), Reported),
            (
                false,
                None,
                Some(f64::INFINITY),
                Some(5),
                5.0,
                None,
                UsefulTime,
            ),
            (false, None, None, Some(30), 30.0, None, UsefulTime),
            (false, None, None, None, 0.0, None, Nothing),
        ];
        for (finished, file, reported, useful, done, share, source) in rows {
            let readings = ProgressReadings {
                finished,
                file,
                reported,
                useful: useful.map(secs),
            };
            let progress = job_progress(&readings, work);
            assert_eq!(progress.done.as_secs_f64(), done, "{readings:?}");
            assert_eq!(progress.share, share, "{readings:?}");
            assert_eq!(progress.source, source, "{readings:?}");
        }
    }

    #[test]
    fn what_a_save_stamps_is_the_file_else_the_handler() {
        // (file, reported, stamped)
        let rows = [
            (Some(0.375), Some(0.1), Some(0.375)),
            (None, Some(0.1), Some(0.1)),
            (Some(f64::NAN), Some(0.1), Some(0.1)),
            (None, None, None),
        ];
        for (file, reported, stamped) in rows {
            assert_eq!(
                reported_share(file, reported),
                stamped,
                "{file:?} {reported:?}"
            );
        }
    }

    #[test]
    fn the_share_for_people() {
        let secs = Duration::from_secs;
        let useful = |s| ProgressReadings {
            useful: Some(secs(s)),
            ..ProgressReadings::default()
        };
        // A reported share is shown as such, whatever the work.
        let reported = ProgressReadings {
            reported: Some(0.375),
            ..ProgressReadings::default()
        };
        assert_eq!(
            job_progress(&reported, secs(1000)).fraction_of(secs(1000)),
            Some(0.375)
        );
        assert_eq!(
            job_progress(&useful(20), secs(80)).fraction_of(secs(80)),
            Some(0.25)
        );
        assert_eq!(
            job_progress(&useful(200), secs(80)).fraction_of(secs(80)),
            Some(1.0)
        );
        assert_eq!(
            job_progress(&useful(20), Duration::ZERO).fraction_of(Duration::ZERO),
            None
        );
    }
}
