//! [`Standing`]: where a job with a deadline stands against the straight
//! line from its start to its deadline. All the lane rule's arithmetic is
//! here, once: the wall-clock instants (start, deadline, now) and the
//! durations of work (the whole job, its progress) become signed seconds
//! (`f64`) in [`Deadline::standing`], and every comparison the rule makes
//! is a method of the result. Nothing here panics: an instant before
//! another gives a negative number, not an error.

use std::time::{Duration, SystemTime};

/// A job's deadline and the work it needs: what a producer gives when it
/// enqueues a job that must finish by a date.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadline {
    /// When the job was enqueued: where the straight line starts.
    pub start: SystemTime,
    /// When the job must be done: where the line reaches all its work.
    pub due: SystemTime,
    /// The job's work, as the time it takes on one VM once started (the
    /// producer's estimate).
    pub work: Duration,
}

/// Where a job stands at one instant (see [`Deadline::standing`]). Every
/// figure is in seconds; "work" seconds are seconds of running on one VM.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Standing {
    /// Seconds from start to now; 0 before the start (a clock behind).
    elapsed: f64,
    /// Seconds from start to deadline; 0 or less for a deadline at or
    /// before the start.
    horizon: f64,
    /// Seconds from now to the deadline; negative once it has passed.
    time_left: f64,
    /// The job's work, seconds.
    work: f64,
    /// The work done, seconds (may exceed `work`: the estimate was short).
    progress: f64,
}

impl Deadline {
    /// Where a job that has done `progress` of its work stands at `now`.
    pub fn standing(&self, progress: Duration, now: SystemTime) -> Standing {
        Standing {
            elapsed: seconds_from(self.start, now).max(0.0),
            horizon: seconds_from(self.start, self.due),
            time_left: seconds_from(now, self.due),
            work: self.work.as_secs_f64(),
            progress: progress.as_secs_f64(),
        }
    }
}

impl Standing {
    /// The work the straight line expects done `later` seconds from now:
    /// the whole work times the share of the time from start to deadline
    /// gone by then, never more than the whole work. A deadline at or
    /// before the start expects all of it at once.
    fn line(&self, later: f64) -> f64 {
        if self.horizon <= 0.0 {
            return self.work;
        }
        self.work * ((self.elapsed + later) / self.horizon).clamp(0.0, 1.0)
    }

    /// How far ahead of the line the job is, in seconds of work: its
    /// progress less the line's; negative when it is behind.
    pub fn lead_secs(&self) -> f64 {
        self.progress - self.line(0.0)
    }

    /// Seconds from now to the deadline; negative once it has passed.
    pub fn time_left_secs(&self) -> f64 {
        self.time_left
    }

    /// Seconds of work left: the estimate less the progress, at least 0.
    pub fn work_left_secs(&self) -> f64 {
        (self.work - self.progress).max(0.0)
    }

    /// The time left less the work left, in seconds: what the job can
    /// still spend waiting and (re)starting; negative when even running
    /// from now on without a stop misses the deadline.
    pub fn slack_secs(&self) -> f64 {
        self.time_left - self.work_left_secs()
    }

    /// Whether the job's progress is below the line now.
    pub fn is_behind(&self) -> bool {
        self.progress < self.line(0.0)
    }

    /// Whether the job's progress is at least what the line expects
    /// `margin` from now: ahead by `margin` in time. The line reaches the
    /// whole work at the deadline, so near it only a finished job is.
    pub fn is_ahead_by(&self, margin: Duration) -> bool {
        self.progress >= self.line(margin.as_secs_f64())
    }

    /// Whether the slack is less than `margin`: the time left no longer
    /// covers the work left and `margin` more.
    pub fn slack_below(&self, margin: Duration) -> bool {
        self.slack_secs() < margin.as_secs_f64()
    }
}

/// Seconds from `from` to `to`, negative when `to` comes first.
fn seconds_from(from: SystemTime, to: SystemTime) -> f64 {
    match to.duration_since(from) {
        Ok(after) => after.as_secs_f64(),
        Err(before) => -before.duration().as_secs_f64(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::lanes::test_time::{H, at, hours};

    #[test]
    fn the_figures_of_a_standing() {
        let rows = [
            // (deadline h, work h, progress h, now h) → (lead h, slack h, behind)
            // 10 h of work by 20 h: at 8 h the line is at 4 h.
            ((20.0, 10.0, 5.0, 8.0), (1.0, 7.0, false)),
            ((20.0, 10.0, 3.0, 8.0), (-1.0, 5.0, true)),
            ((20.0, 10.0, 4.0, 8.0), (0.0, 6.0, false)),
            // Past the deadline: the line stays at all the work.
            ((20.0, 10.0, 9.0, 25.0), (-1.0, -6.0, true)),
            // More progress than the estimate: no work left, ahead.
            ((20.0, 10.0, 12.0, 8.0), (8.0, 12.0, false)),
            // No work: never behind.
            ((20.0, 0.0, 0.0, 8.0), (0.0, 12.0, false)),
            // Deadline before the start: all the work is due at once.
            ((-2.0, 10.0, 4.0, 1.0), (-6.0, -9.0, true)),
            // A clock behind the start: nothing is expected yet.
            ((20.0, 10.0, 0.0, -1.0), (0.0, 11.0, false)),
        ];
        for ((due, work, progress, now), (lead, slack, behind)) in rows {
            let deadline = Deadline {
                start: at(0.0),
                due: at(due),
                work: hours(work),
            };
            let standing = deadline.standing(hours(progress), at(now));
            let case = format!("due {due} h, work {work} h, progress {progress} h, now {now} h");
            assert!(
                (standing.lead_secs() - lead * H).abs() < 1e-3,
                "{case}: lead {}",
                standing.lead_secs() / H
            );
            assert!(
                (standing.slack_secs() - slack * H).abs() < 1e-3,
                "{case}: slack {}",
                standing.slack_secs() / H
            );
            assert_eq!(standing.is_behind(), behind, "{case}");
        }
    }

    #[test]
    fn ahead_by_a_margin_means_ahead_of_the_line_that_much_later() {
        // 10 h by 20 h: the line moves 0.5 h of work per hour. At 8 h it
        // is at 4 h; one hour later at 4.5 h.
        let deadline = Deadline {
            start: at(0.0),
            due: at(20.0),
            work: hours(10.0),
        };
        let margin = hours(1.0);
        assert!(deadline.standing(hours(4.5), at(8.0)).is_ahead_by(margin));
        assert!(!deadline.standing(hours(4.49), at(8.0)).is_ahead_by(margin));
        // Within the margin of the deadline only all the work is ahead.
        assert!(!deadline.standing(hours(9.99), at(19.5)).is_ahead_by(margin));
        assert!(deadline.standing(hours(10.0), at(19.5)).is_ahead_by(margin));
    }
}
