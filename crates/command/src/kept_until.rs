//! Up to when a saved version keeps the program's work, which is what the
//! job's goodput ledger counts as useful and, after it, as redone.
//!
//! A version keeps the work up to when it was written (its files'
//! modification time, `write_time.rs`). One exception: the runner's last
//! save, once the program has ended, of a version the program wrote after
//! its stop signal (it saved on the signal). That version is the program's
//! last state: what the program did after writing it was only its exit
//! (closing files, an interpreter's teardown), and no next delivery does
//! any of it again, so none of it is redone.

use tokio::time::Instant;

/// Up to when saving a version keeps the program's work: `now` (the save's
/// call, after the program ended) if the program has `ended` and wrote the
/// version `after_stop` (new since its stop signal); else when it was
/// `written` (`None`: a time the clock cannot tell, and the save keeps the
/// work up to its call).
///
/// | program ended | written after the stop signal | kept until |
/// |---|---|---|
/// | yes | yes | `now` |
/// | yes | no (an older version: the program died on the signal) | `written` |
/// | no (a save while it runs) | either | `written` |
pub(crate) fn kept_until(
    ended: bool,
    after_stop: bool,
    written: Option<Instant>,
    now: Instant,
) -> Option<Instant> {
    if ended && after_stop {
        Some(now)
    } else {
        written
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_version_saved_on_the_signal_keeps_the_work_up_to_the_programs_end() {
        let now = Instant::now();
        let written = Some(now - Duration::from_millis(400));
        // (ended, written after the stop signal, written, kept until)
        let rows = [
            (true, true, written, Some(now)),
            (true, true, None, Some(now)),
            (true, false, written, written),
            (true, false, None, None),
            (false, true, written, written),
            (false, false, written, written),
            (false, false, None, None),
        ];
        for (ended, after_stop, written, expected) in rows {
            assert_eq!(
                kept_until(ended, after_stop, written, now),
                expected,
                "ended {ended}, after the stop {after_stop}, written {written:?}"
            );
        }
    }
}
