//! Shortening text that goes into a record of bounded size (an attempt
//! record's last error, a poison record's) without splitting a character.

/// Cuts `text` to at most `max` bytes without splitting a character.
pub fn truncate_at_char_boundary(text: &mut String, max: usize) {
    if text.len() <= max {
        return;
    }
    let mut cut = max;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text.truncate(cut);
}

/// Shortens `text` to at most `max` bytes by leaving out its middle: the
/// first quarter (what failed) and the rest from its end (how it ended: a
/// program's last stderr lines) are kept, with how much was left out
/// between them.
pub fn shorten_keeping_ends(text: &mut String, max: usize) {
    if text.len() <= max {
        return;
    }
    let marker = |cut: usize| format!("\n…[{cut} bytes left out]…\n");
    // The marker's length with the longest count it can show.
    let room = max.saturating_sub(marker(text.len()).len());
    let mut head = room / 4;
    while !text.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = text.len() - (room - head);
    while !text.is_char_boundary(tail) {
        tail += 1;
    }
    let shortened = format!("{}{}{}", &text[..head], marker(tail - head), &text[tail..]);
    *text = shortened;
    truncate_at_char_boundary(text, max);
}
