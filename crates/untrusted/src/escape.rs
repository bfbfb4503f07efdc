//! Text someone else wrote, made harmless to show in a log or on a
//! terminal.
//!
//! A terminal acts on what it is sent: an ANSI escape sequence can clear
//! the screen, retitle the window or hide what follows; a carriage return
//! overwrites the line it ends; a line break inside a logged value forges a
//! record of its own; a bidirectional override shows text in another order
//! than it is ([CVE-2021-42574]). Every such character is written as
//! `\u{..}` (Rust's own notation for it) instead. A backslash is left as
//! it is, so ordinary text (a Windows path, a regular expression) reads
//! unchanged; the escaped form is for a person, not for parsing back.
//!
//! [CVE-2021-42574]: https://trojansource.codes

use std::borrow::Cow;
use std::fmt::Write as _;

/// Escapes every control character of `text`, line breaks and tabs
/// included, and every bidirectional control: for one line of a log.
///
/// ```
/// use spot_worker_untrusted::escape_line;
///
/// assert_eq!(escape_line("queue a\nlevel=ERROR forged"), "queue a\\u{a}level=ERROR forged");
/// assert_eq!(escape_line("plain C:\\text"), "plain C:\\text");
/// ```
pub fn escape_line(text: &str) -> Cow<'_, str> {
    escape(text, |_| true)
}

/// Escapes a name or path that need not be text (a file name is any
/// bytes but `/` and NUL) for one line of a log: as [`escape_line`], and
/// each byte that is not part of valid UTF-8 as `\x..`, so two names that
/// differ only there are shown differently.
///
/// ```
/// use std::ffi::OsStr;
/// use std::os::unix::ffi::OsStrExt;
/// use spot_worker_untrusted::escape_bytes;
///
/// let name = OsStr::from_bytes(b"caf\xe9\n.bin");
/// assert_eq!(escape_bytes(name.as_bytes()), "caf\\xe9\\u{a}.bin");
/// ```
pub fn escape_bytes(bytes: &[u8]) -> String {
    let mut shown = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        shown.push_str(&escape_line(chunk.valid()));
        for byte in chunk.invalid() {
            let _ = write!(shown, "\\x{byte:02x}");
        }
    }
    shown
}

/// Escapes the control characters of `text` except line breaks (`\n`) and
/// tabs, and every bidirectional control: for text shown on a terminal as
/// lines of its own (a checkpoint file, a program's stderr).
///
/// ```
/// use spot_worker_untrusted::escape_text;
///
/// assert_eq!(escape_text("line 1\n\tline 2\r\x1b]0;title\x07"), "line 1\n\tline 2\\u{d}\\u{1b}]0;title\\u{7}");
/// ```
pub fn escape_text(text: &str) -> Cow<'_, str> {
    escape(text, |c| c != '\n' && c != '\t')
}

/// Escapes, in JSON text (such as `serde_json` writes), every character
/// a terminal acts on but a line break as JSON's own `\uXXXX`: the text is
/// still the same JSON. (`serde_json` escapes the C0 controls already, but
/// not DEL, the C1 controls or the bidirectional ones; outside strings
/// JSON has none of them but the line breaks between values.)
///
/// ```
/// use spot_worker_untrusted::escape_json;
///
/// let json = "{\"a\": \"\u{9b}31m\u{202e}\"}";
/// assert_eq!(escape_json(json), "{\"a\": \"\\u009b31m\\u202e\"}");
/// ```
pub fn escape_json(text: &str) -> Cow<'_, str> {
    let escaped = |c: char| is_harmful(c) && c != '\n';
    if !text.chars().any(escaped) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if escaped(c) {
            // Every harmful character is in the Basic Multilingual Plane.
            let _ = write!(out, "\\u{:04x}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// `text` with every character that `is_harmful` and `also` escaped.
fn escape(text: &str, also: impl Fn(char) -> bool) -> Cow<'_, str> {
    let escaped = |c: char| is_harmful(c) && also(c);
    if !text.chars().any(escaped) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if escaped(c) {
            // Writing to a String cannot fail.
            let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// A character a terminal or a log reader acts on rather than shows: the
/// C0 and C1 controls and DEL (`char::is_control`), the line and paragraph
/// separators, and the bidirectional marks, embeddings, overrides and
/// isolates.
fn is_harmful(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}'
                | '\u{200e}'
                | '\u{200f}'
                | '\u{2028}'
                | '\u{2029}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_terminal_acts_on_is_escaped() {
        // (text, as one line, as text)
        let table = [
            (
                "plain text, ü, 日本",
                "plain text, ü, 日本",
                "plain text, ü, 日本",
            ),
            ("a\nb\tc", "a\\u{a}b\\u{9}c", "a\nb\tc"),
            (
                "\x1b[2J\x1b[H",
                "\\u{1b}[2J\\u{1b}[H",
                "\\u{1b}[2J\\u{1b}[H",
            ),
            ("over\rwritten", "over\\u{d}written", "over\\u{d}written"),
            (
                "nul\0 del\x7f",
                "nul\\u{0} del\\u{7f}",
                "nul\\u{0} del\\u{7f}",
            ),
            ("c1 \u{9b}31m", "c1 \\u{9b}31m", "c1 \\u{9b}31m"),
            (
                "rtl \u{202e}txt.exe",
                "rtl \\u{202e}txt.exe",
                "rtl \\u{202e}txt.exe",
            ),
            (
                "isolate \u{2066}x\u{2069}",
                "isolate \\u{2066}x\\u{2069}",
                "isolate \\u{2066}x\\u{2069}",
            ),
            ("sep\u{2028}x", "sep\\u{2028}x", "sep\\u{2028}x"),
            ("back\\slash", "back\\slash", "back\\slash"),
        ];
        for (text, line, shown) in table {
            assert_eq!(escape_line(text), line, "{text:?}");
            assert_eq!(escape_text(text), shown, "{text:?}");
        }
        assert!(matches!(escape_line("clean"), Cow::Borrowed("clean")));
        assert_eq!(
            escape_json("[\n  \"\u{7f}\u{85}\u{2066}\"\n]"),
            "[\n  \"\\u007f\\u0085\\u2066\"\n]"
        );
    }

    #[test]
    fn nothing_harmful_survives_any_text() {
        // Every character up to U+3000 and a few beyond, one at a time.
        for c in (0..0x3000u32)
            .chain([0xfeff, 0xfffe, 0xffff, 0x1f600])
            .filter_map(char::from_u32)
        {
            let text = format!("<{c}>");
            for escaped in [escape_line(&text), escape_text(&text)] {
                assert!(
                    escaped
                        .chars()
                        .all(|e| !is_harmful(e) || e == '\n' || e == '\t'),
                    "{c:?} -> {escaped:?}"
                );
            }
            assert!(!escape_line(&text).contains(['\n', '\t']), "{c:?}");
        }
    }
}
