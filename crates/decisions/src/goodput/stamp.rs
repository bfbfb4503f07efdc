//! The ledger as a checkpoint write's stamp carries it: appended to the
//! stamp's own part (`writer:sequence`, which fences conflicts) after a
//! `|`, as `u=…,r=…,c=…,w=…,d=…,s=…` (milliseconds, deliveries, saves).
//!
//! Two fields follow only when they have something to say, so that the
//! stamp of a job without a deadline is exactly what it always was:
//! `g=…`, the milliseconds on regular capacity ([`Ledger::regular_ms`]),
//! when there are any; and `f=…`, the share of its work the job reported
//! done as of the save ([`stamp_with_progress`]), for the lane rule of a
//! job with a deadline.

use super::Ledger;

/// What separates a write stamp's own part (`writer:sequence`) from the
/// ledger stamped with it.
const LEDGER_SEPARATOR: char = '|';

/// `stamp` with `ledger` appended, as a save stores it.
pub fn stamp_with(stamp: &str, ledger: &Ledger) -> String {
    stamp_with_progress(stamp, ledger, None)
}

/// `stamp` with `ledger` appended and, if there is one, the share of its
/// work the job reported done (0 to 1; clamped), as the save of a job with
/// a deadline stores it.
///
/// ```
/// use spot_worker_decisions::goodput::{Ledger, split_stamp, stamp_progress, stamp_with_progress};
///
/// let ledger = Ledger { useful_ms: 9_000, deliveries: 1, ..Ledger::default() };
/// let stamp = stamp_with_progress("w:3", &ledger, Some(0.25));
/// assert_eq!(stamp, "w:3|u=9000,r=0,c=0,w=0,d=1,s=0,f=0.250000");
/// assert_eq!(split_stamp(&stamp), ("w:3", Some(ledger)));
/// assert_eq!(stamp_progress(&stamp), Some(0.25));
/// ```
pub fn stamp_with_progress(stamp: &str, ledger: &Ledger, progress: Option<f64>) -> String {
    let mut text = format!(
        "{stamp}{LEDGER_SEPARATOR}u={},r={},c={},w={},d={},s={}",
        ledger.useful_ms,
        ledger.redone_ms,
        ledger.checkpointing_ms,
        ledger.waiting_ms,
        ledger.deliveries,
        ledger.saves
    );
    if ledger.regular_ms > 0 {
        text.push_str(&format!(",g={}", ledger.regular_ms));
    }
    if let Some(progress) = progress.filter(|p| p.is_finite()) {
        text.push_str(&format!(",f={:.6}", progress.clamp(0.0, 1.0)));
    }
    text
}

/// A stored stamp split into its own part and its ledger (`None` if it has
/// none, or one that does not parse: a stamp from an older writer, or
/// another program's).
pub fn split_stamp(stored: &str) -> (&str, Option<Ledger>) {
    let Some((own, ledger)) = stored.split_once(LEDGER_SEPARATOR) else {
        return (stored, None);
    };
    (own, parse_ledger(ledger))
}

/// The share of its work the job reported done as of the save that
/// stored `stored` (`f=…`), if the stamp carries one and a ledger that
/// parses.
pub fn stamp_progress(stored: &str) -> Option<f64> {
    let (_, fields) = stored.split_once(LEDGER_SEPARATOR)?;
    parse_ledger(fields)?;
    fields
        .split(',')
        .find_map(|field| field.strip_prefix("f="))
        .and_then(|value| value.parse::<f64>().ok())
        .filter(|value| (0.0..=1.0).contains(value))
}

fn parse_ledger(text: &str) -> Option<Ledger> {
    let mut ledger = Ledger::default();
    let mut seen = 0u8;
    for field in text.split(',') {
        let (name, value) = field.split_once('=')?;
        let (slot, bit) = match name {
            "u" => (&mut ledger.useful_ms, 1),
            "r" => (&mut ledger.redone_ms, 2),
            "c" => (&mut ledger.checkpointing_ms, 4),
            "w" => (&mut ledger.waiting_ms, 8),
            "g" => (&mut ledger.regular_ms, 64),
            "d" => {
                ledger.deliveries = value.parse().ok()?;
                seen |= 16;
                continue;
            }
            "s" => {
                ledger.saves = value.parse().ok()?;
                seen |= 32;
                continue;
            }
            "f" => {
                value.parse::<f64>().ok()?;
                continue;
            }
            _ => return None,
        };
        *slot = value.parse().ok()?;
        seen |= bit;
    }
    // `g` is optional; every other field is required.
    (seen & 63 == 63).then_some(ledger)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::goodput::tests::ledger;

    #[test]
    fn stamps_carry_their_ledger_and_odd_ones_carry_none() {
        let carried = Ledger {
            saves: 9,
            ..ledger(1500, 20, 90, 30, 2)
        };
        let stamp = stamp_with("abc:7", &carried);
        assert_eq!(stamp, "abc:7|u=1500,r=20,c=90,w=30,d=2,s=9");
        assert_eq!(split_stamp(&stamp), ("abc:7", Some(carried)));
        // (stored stamp, own part, ledger parsed)
        let rows = [
            ("abc:7", "abc:7", false),
            ("abc:7|", "abc:7", false),
            ("abc:7|u=1,r=2,c=3,w=4,d=1", "abc:7", false),
            ("abc:7|u=1,r=2,c=3,w=4,d=x,s=0", "abc:7", false),
            ("abc:7|u=1,r=2,c=3,w=4,d=1,s=0,z=0", "abc:7", false),
            ("abc:7|u=-1,r=2,c=3,w=4,d=1,s=0", "abc:7", false),
            ("abc:7|s=0,w=4,d=1,c=3,r=2,u=1", "abc:7", true),
            ("abc:7|u=1,r=2,c=3,w=4,d=1,s=0,g=5", "abc:7", true),
            ("abc:7|u=1,r=2,c=3,w=4,d=1,s=0,g=x", "abc:7", false),
            ("abc:7|u=1,r=2,c=3,w=4,d=1,s=0,f=0.5", "abc:7", true),
            ("abc:7|u=1,r=2,c=3,w=4,d=1,s=0,f=half", "abc:7", false),
        ];
        for (stored, own, parsed) in rows {
            let (got_own, ledger) = split_stamp(stored);
            assert_eq!((got_own, ledger.is_some()), (own, parsed), "{stored}");
        }
    }

    #[test]
    fn regular_time_and_progress_are_stamped_only_when_there_are_some() {
        let spot = ledger(1500, 20, 90, 30, 2);
        assert_eq!(
            stamp_with_progress("w:1", &spot, None),
            stamp_with("w:1", &spot)
        );
        let regular = Ledger {
            regular_ms: 400,
            ..spot
        };
        let stamp = stamp_with_progress("w:1", &regular, Some(1.7));
        assert_eq!(stamp, "w:1|u=1500,r=20,c=90,w=30,d=2,s=0,g=400,f=1.000000");
        assert_eq!(split_stamp(&stamp).1, Some(regular));
        assert_eq!(stamp_progress(&stamp), Some(1.0));
        // (stored, progress read)
        let rows = [
            ("w:1", None),
            ("w:1|u=1,r=2,c=3,w=4,d=1,s=0", None),
            ("w:1|u=1,r=2,c=3,w=4,d=1,s=0,f=0.42", Some(0.42)),
            // A ledger that does not parse carries no progress either.
            ("w:1|u=1,r=2,c=3,d=1,s=0,f=0.42", None),
            ("w:1|u=1,r=2,c=3,w=4,d=1,s=0,f=1.5", None),
            ("w:1|u=1,r=2,c=3,w=4,d=1,s=0,f=NaN", None),
        ];
        for (stored, progress) in rows {
            assert_eq!(stamp_progress(stored), progress, "{stored}");
        }
        assert_eq!(
            stamp_with_progress("w:1", &spot, Some(f64::NAN)),
            stamp_with("w:1", &spot)
        );
    }
}
