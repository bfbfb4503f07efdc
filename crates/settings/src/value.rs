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

impl SettingValue for SocketAddr {
    fn parse(text: &str) -> Result<Self, String> {
        text.parse().map_err(|e| format!("{e} (use IP:PORT)"))
    }

    fn show(&self) -> String {
        self.to_string()
    }
}

/// Parses `1s`, `250ms`, `2m` or a bare number of seconds.
///
/// ```
/// use std::time::Duration;
/// use spot_worker_settings::parse_duration;
///
/// assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
/// assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
/// assert!(parse_duration("soon").is_err());
/// ```
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .map_or((text, "s"), |at| text.split_at(at));
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 1s, 250ms or 2m"))?;
    let seconds = match unit.trim() {
        "ms" => value / 1000.0,
        "s" | "" => value,
        "m" | "min" => value * 60.0,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {text:?} (use ms, s or m)"
            ));
        }
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("{text:?}: {e}"))
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
