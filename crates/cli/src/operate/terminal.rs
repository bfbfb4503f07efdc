//! What the operator's commands print is often someone else's text: a
//! program's checkpoint file, its stderr in a poison record, a message
//! body, a job key. On a terminal, an escape sequence in it would act (clear
//! the screen, retitle the window, hide a line); so there, control
//! characters and bidirectional overrides are shown escaped
//! (`spot-worker-untrusted`). Piped or redirected, the bytes are written as
//! they are, for scripts and files.

use std::borrow::Cow;
use std::io::IsTerminal as _;

/// `text` as it may be written to stdout: escaped on a terminal (line
/// breaks and tabs kept), as it is otherwise.
pub fn shown(text: &str) -> Cow<'_, str> {
    shown_on(text, std::io::stdout().is_terminal())
}

/// JSON text as it may be written to stdout: on a terminal, what would
/// act on it as JSON's own `\uXXXX` escapes (the same JSON).
pub fn shown_json(text: &str) -> Cow<'_, str> {
    if std::io::stdout().is_terminal() {
        spot_worker_untrusted::escape_json(text)
    } else {
        Cow::Borrowed(text)
    }
}

/// Bytes as they may be written to stdout: on a terminal, as text with
/// what would act on it escaped (bytes that are not UTF-8 as U+FFFD);
/// exactly otherwise.
pub fn shown_bytes(bytes: &[u8]) -> Cow<'_, [u8]> {
    if !std::io::stdout().is_terminal() {
        return Cow::Borrowed(bytes);
    }
    let text = String::from_utf8_lossy(bytes);
    Cow::Owned(
        spot_worker_untrusted::escape_text(&text)
            .into_owned()
            .into_bytes(),
    )
}

fn shown_on(text: &str, terminal: bool) -> Cow<'_, str> {
    if terminal {
        spot_worker_untrusted::escape_text(text)
    } else {
        Cow::Borrowed(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaped_on_a_terminal_only() {
        let text = "cursor=1\n\x1b]0;owned\x07\r";
        assert_eq!(shown_on(text, false), text);
        assert_eq!(
            shown_on(text, true),
            "cursor=1\n\\u{1b}]0;owned\\u{7}\\u{d}"
        );
    }
}
