//! The ledger as a checkpoint write's stamp carries it: appended to the
//! stamp's own part (`writer:sequence`, which fences conflicts) after a
//! `|`, as `u=…,r=…,c=…,w=…,d=…,s=…` (milliseconds, deliveries, saves).

use super::Ledger;

/// What separates a write stamp's own part (`writer:sequence`) from the
/// ledger stamped with it.
const LEDGER_SEPARATOR: char = '|';

/// `stamp` with `ledger` appended, as a save stores it.
pub fn stamp_with(stamp: &str, ledger: &Ledger) -> String {
    format!(
        "{stamp}{LEDGER_SEPARATOR}u={},r={},c={},w={},d={},s={}",
        ledger.useful_ms,
        ledger.redone_ms,
        ledger.checkpointing_ms,
        ledger.waiting_ms,
        ledger.deliveries,
        ledger.saves
    )
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
            _ => return None,
        };
        *slot = value.parse().ok()?;
        seen |= bit;
    }
    (seen == 63).then_some(ledger)
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
        ];
        for (stored, own, parsed) in rows {
            let (got_own, ledger) = split_stamp(stored);
            assert_eq!((got_own, ledger.is_some()), (own, parsed), "{stored}");
        }
    }
}
