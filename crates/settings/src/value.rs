//! How a setting's text becomes a value, and back.

use std::borrow::Cow;
use std::net::SocketAddr;
use std::time::Duration;

/// A type a setting can be read as.
pub trait SettingValue: Sized + Clone + Sync {
    /// Parses a value given as text (the environment, a flag, or the file).
    fn parse(text: &str) -> Result<Self, String>;
    /// The value as it would be written (for the docs).
    fn show(&self) -> String;
}

impl SettingValue for Cow<'static, str> {
    fn parse(text: &str) -> Result<Self, String> {
        Ok(Cow::Owned(text.to_owned()))
    }

    fn show(&self) -> String {
        self.to_string()
    }
}

/// A setting with no default value: `None` unless given.
impl<T: SettingValue> SettingValue for Option<T> {
    fn parse(text: &str) -> Result<Self, String> {
        T::parse(text).map(Some)
    }

    fn show(&self) -> String {
        self.as_ref().map(T::show).unwrap_or_default()
    }
}

impl SettingValue for Duration {
    fn parse(text: &str) -> Result<Self, String> {
        parse_duration(text)
    }

    fn show(&self) -> String {
        show_duration(*self)
    }
}

impl SettingValue for bool {
    fn parse(text: &str) -> Result<Self, String> {
        parse_switch(text)
    }

    fn show(&self) -> String {
        if *self { "on" } else { "off" }.to_owned()
    }
}

impl SettingValue for u32 {
    fn parse(text: &str) -> Result<Self, String> {
        text.parse().map_err(|e| format!("{e}"))
    }

    fn show(&self) -> String {
        self.to_string()
    }
}

impl SettingValue for u64 {
    fn parse(text: &str) -> Result<Self, String> {
        text.parse().map_err(|e| format!("{e}"))
    }

    fn show(&self) -> String {
        self.to_string()
    }
}

impl SettingValue for usize {
    fn parse(text: &str) -> Result<Self, String> {
        text.parse().map_err(|e| format!("{e}"))
    }

    fn show(&self) -> String {
        self.to_string()
    }
}

/// A rate or another quantity: a finite number, not negative.
impl SettingValue for f64 {
    fn parse(text: &str) -> Result<Self, String> {
        let value: f64 = text
            .parse()
            .map_err(|e| format!("{e} (use a number such as 0.05)"))?;
        if !value.is_finite() || value < 0.0 {
            return Err("must be a finite number, not negative".to_owned());
        }
        Ok(value)
    }

    fn show(&self) -> String {
        self.to_string()
    }
}

impl SettingValue for SocketAddr {
    fn parse(text: &str) -> Result<Self, String> {
        text.parse().map_err(|e| format!("{e} (use IP:PORT)"))
    }

    fn show(&self) -> String {
        self.to_string()
    }
}

/// Parses a duration: a number (digits, with at most one `.`) and a unit,
/// `ms`, `s`, `m` or `min`, `h` or `d`; a bare number is seconds. Spaces
/// around the unit are allowed (`2 s`); nothing else is (`1h30m`, `-1s`,
/// `1e3s`). docs/configuration.md ("Durations") says the same.
///
/// ```
/// use std::time::Duration;
/// use spot_worker_settings::parse_duration;
///
/// assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
/// assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
/// assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
/// assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
/// assert!(parse_duration("soon").is_err());
/// ```
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .map_or((text, "s"), |at| text.split_at(at));
    let unit_nanos: u128 = match unit.trim() {
        "ms" => 1_000_000,
        "s" | "" => 1_000_000_000,
        "m" | "min" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        "d" => 86_400_000_000_000,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {text:?} (use ms, s, m, h or d)"
            ));
        }
    };
    let too_long = || format!("{text:?} is too long for a duration");
    let nanos = match decimal_times(number, unit_nanos) {
        Ok(nanos) => nanos,
        Err(Decimal::NotANumber) => {
            return Err(format!(
                "{text:?} is not a duration like 250ms, 30s, 2m, 1h or 7d"
            ));
        }
        Err(Decimal::Overflow) => return Err(too_long()),
    };
    let seconds = u64::try_from(nanos / 1_000_000_000).map_err(|_| too_long())?;
    // The remainder is below 10^9, so it fits.
    let subsec = (nanos % 1_000_000_000) as u32;
    Ok(Duration::new(seconds, subsec))
}

/// Why [`decimal_times`] has no answer.
enum Decimal {
    NotANumber,
    Overflow,
}

/// `number` (digits with at most one `.`) times `unit`, in whole units,
/// computed in decimal so that `0.3s` or `9007256742ms` is exact (through
/// `f64` it was not); digits below one unit are dropped.
fn decimal_times(number: &str, unit: u128) -> Result<u128, Decimal> {
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let digits = |part: &str| part.bytes().all(|b| b.is_ascii_digit());
    if (whole.is_empty() && fraction.is_empty()) || !digits(whole) || !digits(fraction) {
        return Err(Decimal::NotANumber);
    }
    let mut total: u128 = 0;
    for digit in whole.bytes() {
        total = total
            .checked_mul(10)
            .and_then(|t| t.checked_add(u128::from(digit - b'0')))
            .ok_or(Decimal::Overflow)?;
    }
    total = total.checked_mul(unit).ok_or(Decimal::Overflow)?;
    let mut place = unit;
    for digit in fraction.bytes() {
        place /= 10;
        // At most `unit` in all, added to a total that did not overflow
        // with the whole part; checked all the same.
        total = total
            .checked_add(place * u128::from(digit - b'0'))
            .ok_or(Decimal::Overflow)?;
    }
    Ok(total)
}

/// A duration as [`parse_duration`] reads it: `25s`, `250ms`, `1.5s`.
pub fn show_duration(duration: Duration) -> String {
    if duration.subsec_nanos() == 0 {
        format!("{}s", duration.as_secs())
    } else if duration < Duration::from_secs(1) && duration.subsec_nanos().is_multiple_of(1_000_000)
    {
        format!("{}ms", duration.as_millis())
    } else {
        format!("{}s", duration.as_secs_f64())
    }
}

/// Parses an on/off switch: `on`/`off`, `true`/`false`, `yes`/`no`, `1`/`0`.
pub fn parse_switch(text: &str) -> Result<bool, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "1" | "on" | "true" | "yes" => Ok(true),
        "0" | "off" | "false" | "no" => Ok(false),
        _ => Err("use on or off".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_finite_numbers_not_negative() {
        for (text, expected) in [("0.05", Some(0.05)), ("0", Some(0.0)), ("2", Some(2.0))] {
            assert_eq!(f64::parse(text).ok(), expected, "{text}");
        }
        for text in ["-0.1", "NaN", "inf", "soon", ""] {
            assert!(f64::parse(text).is_err(), "{text}");
        }
        assert_eq!(f64::parse(&0.05_f64.show()), Ok(0.05));
    }

    #[test]
    fn durations_show_as_they_parse() {
        for (duration, text) in [
            (Duration::from_secs(25), "25s"),
            (Duration::from_millis(250), "250ms"),
            (Duration::from_millis(1500), "1.5s"),
            (Duration::ZERO, "0s"),
        ] {
            assert_eq!(show_duration(duration), text);
            assert_eq!(parse_duration(text), Ok(duration));
        }
    }

    /// Every unit docs/configuration.md names, as people write them: `1h`
    /// (`run --help`'s `--timeout` example) and `7d` (the lease's longest)
    /// were refused before.
    #[test]
    fn durations_take_every_documented_unit() {
        let rows = [
            ("250ms", Duration::from_millis(250)),
            ("30", Duration::from_secs(30)),
            ("30s", Duration::from_secs(30)),
            ("2 s", Duration::from_secs(2)),
            ("2m", Duration::from_secs(120)),
            ("2min", Duration::from_secs(120)),
            ("1h", Duration::from_secs(3600)),
            ("1.5h", Duration::from_secs(5400)),
            ("24h", Duration::from_secs(86_400)),
            ("1d", Duration::from_secs(86_400)),
            ("7d", Duration::from_secs(7 * 86_400)),
            ("0.5d", Duration::from_secs(43_200)),
            (" 1h ", Duration::from_secs(3600)),
        ];
        for (text, expected) in rows {
            assert_eq!(parse_duration(text), Ok(expected), "{text}");
        }
        for bad in ["1h30m", "1 h 30 m", "1H", "1hr", "1 day", "d", "1w", "-1h"] {
            let error = parse_duration(bad).unwrap_err();
            assert!(
                error.contains("ms, s, m, h or d") || error.contains("1h or 7d"),
                "{bad}: {error}"
            );
        }
        let huge = format!("{}d", "9".repeat(20));
        assert!(parse_duration(&huge).unwrap_err().contains("too long"));
    }

    /// Through `f64`, `9007256742ms` read as 9007256.742000001 s (found by
    /// the property test `durations_read_exactly` in tests/it/bad_input.rs).
    #[test]
    fn durations_read_exactly_in_decimal() {
        for (text, duration) in [
            ("9007256742ms", Duration::from_millis(9_007_256_742)),
            ("9007256.742s", Duration::from_millis(9_007_256_742)),
            ("0.3s", Duration::from_millis(300)),
            ("1.1m", Duration::from_secs(66)),
            (".5", Duration::from_millis(500)),
            ("1.", Duration::from_secs(1)),
            ("0.0000000019s", Duration::from_nanos(1)),
        ] {
            assert_eq!(parse_duration(text), Ok(duration), "{text}");
        }
        for bad in [".", "1.5.5s", "", "s", "-1s", "1e3s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        let huge = format!("{}s", "9".repeat(30));
        assert!(parse_duration(&huge).unwrap_err().contains("too long"));
    }

    #[test]
    fn switches() {
        for on in ["on", "TRUE", " yes ", "1"] {
            assert_eq!(parse_switch(on), Ok(true), "{on}");
        }
        for off in ["off", "false", "no", "0"] {
            assert_eq!(parse_switch(off), Ok(false), "{off}");
        }
        assert!(parse_switch("maybe").is_err());
    }
}
