//! The prose of the docs (everything outside fenced blocks): its code spans
//! (`` `...` ``), what follows each one in its sentence, and its tables, so
//! that what the sentences quote can be checked against the code.

use std::path::{Path, PathBuf};

/// One code span of a page's prose.
#[derive(Debug, Clone)]
pub struct Span {
    pub file: PathBuf,
    /// 1-based line where the span starts.
    pub line: usize,
    /// Its text, a line break inside it read as a space.
    pub text: String,
    /// The rest of its paragraph (line breaks as spaces), at most
    /// [`AFTER`] characters.
    pub after: String,
}

impl Span {
    pub fn at(&self) -> String {
        format!("{}:{}", self.file.display(), self.line)
    }
}

/// How much of the text after a span is kept.
const AFTER: usize = 80;

/// A page with its fenced blocks blanked out (their lines kept empty, so
/// line numbers stay), and the start of each line.
pub struct Prose {
    pub file: PathBuf,
    pub text: String,
    line_starts: Vec<usize>,
}

impl Prose {
    pub fn of(file: &Path, markdown: &str) -> Prose {
        let mut text = String::with_capacity(markdown.len());
        let mut fence: Option<usize> = None;
        for line in markdown.lines() {
            let trimmed = line.trim_start();
            let ticks = trimmed.len() - trimmed.trim_start_matches('`').len();
            // A fence's info string holds no backtick (````` ```sh ````` at
            // the start of a line is a code span).
            let opens = ticks >= 3 && !trimmed[ticks..].contains('`');
            match fence {
                None if opens => fence = Some(ticks),
                Some(open)
                    if ticks >= open && trimmed.trim_start_matches('`').trim().is_empty() =>
                {
                    fence = None;
                }
                None => text.push_str(line),
                Some(_) => {}
            }
            text.push('\n');
        }
        let line_starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(at, _)| at + 1))
            .collect();
        Prose {
            file: file.to_owned(),
            text,
            line_starts,
        }
    }

    /// The 1-based line of byte offset `at`.
    pub fn line_of(&self, at: usize) -> usize {
        self.line_starts.partition_point(|&start| start <= at)
    }

    /// Every code span, as CommonMark reads them: a run of backticks opens
    /// one, the next run of the same length closes it, within a paragraph.
    pub fn spans(&self) -> Vec<Span> {
        let bytes = self.text.as_bytes();
        let mut spans = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            if bytes[at] != b'`' {
                at += 1;
                continue;
            }
            let run = bytes[at..].iter().take_while(|&&b| b == b'`').count();
            let start = at + run;
            let Some(end) = closing(&self.text, start, run) else {
                at = start;
                continue;
            };
            let inner = self.text[start..end].replace('\n', " ");
            let inner = if run > 1 { inner.trim() } else { &inner[..] };
            let rest = &self.text[end + run..];
            let paragraph_end = rest.find("\n\n").unwrap_or(rest.len());
            let after: String = rest[..paragraph_end]
                .replace('\n', " ")
                .chars()
                .take(AFTER)
                .collect();
            spans.push(Span {
                file: self.file.clone(),
                line: self.line_of(at),
                text: inner.to_owned(),
                after,
            });
            at = end + run;
        }
        spans
    }

    /// The tables of the page: each row as its cells (trimmed), with the
    /// header row first and the row's line; the separator row left out.
    pub fn tables(&self) -> Vec<Vec<(usize, Vec<String>)>> {
        let mut tables = Vec::new();
        let mut current: Vec<(usize, Vec<String>)> = Vec::new();
        for (index, line) in self.text.lines().enumerate() {
            let trimmed = line.trim();
            if trimmed.starts_with('|') {
                let cells: Vec<String> = trimmed
                    .trim_matches('|')
                    .split('|')
                    .map(|cell| cell.trim().to_owned())
                    .collect();
                if !cells
                    .iter()
                    .all(|c| c.chars().all(|ch| ch == '-' || ch == ':'))
                {
                    current.push((index + 1, cells));
                }
            } else if !current.is_empty() {
                tables.push(std::mem::take(&mut current));
            }
        }
        if !current.is_empty() {
            tables.push(current);
        }
        tables
    }
}

/// Where the run of `run` backticks that closes a span opened before
/// `from` starts, if the paragraph has one.
fn closing(text: &str, from: usize, run: usize) -> Option<usize> {
    let bytes = text.as_bytes();
    let mut at = from;
    while at < bytes.len() {
        if bytes[at] == b'\n' && bytes.get(at + 1) == Some(&b'\n') {
            return None;
        }
        if bytes[at] == b'`' {
            let len = bytes[at..].iter().take_while(|&&b| b == b'`').count();
            if len == run {
                return Some(at);
            }
            at += len;
            continue;
        }
        at += 1;
    }
    None
}

/// A value a sentence states right after naming a setting: `` `x` `` or a
/// number with an optional unit (`30 s`, `1 MiB`, `0.05`), and how long
/// its text is.
fn value_at(text: &str) -> Option<(String, usize)> {
    if let Some(rest) = text.strip_prefix('`') {
        let end = rest.find('`')?;
        return Some((rest[..end].to_owned(), end + 2));
    }
    let digits = text
        .char_indices()
        .take_while(|(_, c)| c.is_ascii_digit() || matches!(c, '.' | '_' | ','))
        .last()
        .map(|(at, c)| at + c.len_utf8())?;
    let number = text[..digits].trim_end_matches([',', '.']);
    if number.is_empty() || !number.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    let rest = &text[number.len()..];
    let spaced = rest.strip_prefix(' ').unwrap_or(rest);
    for unit in ["ms", "min", "s", "m", "h", "d", "KiB", "MiB", "GiB"] {
        if let Some(after) = spaced.strip_prefix(unit)
            && !after.starts_with(|c: char| c.is_alphanumeric())
        {
            let len = text.len() - after.len();
            return Some((format!("{number}{unit}"), len));
        }
    }
    Some((number.to_owned(), number.len()))
}

/// The default a sentence states for the setting named just before
/// `after`, in one of the forms the docs use: `` `KEY` (default 30 s) ``,
/// `` `KEY`, default `x` ``, `` `KEY` (100) ``, `` (`KEY`, 2 s) ``,
/// `` `KEY`, `x` by default ``, `` `KEY`; by default `x` ``.
pub fn stated_default(after: &str) -> Option<String> {
    let text = after.trim_start();
    // `(default X`, `, default: X`, `; by default X`
    let opened = text
        .strip_prefix('(')
        .or_else(|| text.strip_prefix(','))
        .or_else(|| text.strip_prefix(';'))
        .map(str::trim_start);
    // `(what it is, default X)`: a default stated later in the parentheses.
    if let Some(inside) = text.strip_prefix('(') {
        let inside = &inside[..inside.find(')').unwrap_or(inside.len())];
        for (at, _) in inside.match_indices(", default ") {
            if let Some((value, _)) = value_at(&inside[at + ", default ".len()..]) {
                return Some(value);
            }
        }
    }
    if let Some(rest) = opened {
        let rest_default = rest
            .strip_prefix("by default")
            .or_else(|| rest.strip_prefix("default"))
            .map(|r| r.trim_start_matches([':', ' ']).trim_start_matches("is "));
        if let Some(value) = rest_default {
            return value_at(value).map(|(v, _)| v);
        }
        // `(30 s)`, `(30 s;`, `, 2 s)`, and `, `x` by default`; a code
        // span alone is the next item of a list, not a value.
        if let Some((value, len)) = value_at(rest) {
            let tail = &rest[len..];
            let quoted = rest.starts_with('`');
            if tail.starts_with(" by default") || (!quoted && tail.starts_with([')', ';'])) {
                return Some(value);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_and_what_follows_them() {
        let page = "intro `A` (default 30 s), and\n`B\nC` then.\n\n```sh\n`not prose`\n```\n\
                    ```` ```sh ```` and `` a`b ``.\n\n| x | `D` |\n|---|---|\n| 1 | 2 |\n";
        let prose = Prose::of(Path::new("p.md"), page);
        let spans = prose.spans();
        let texts: Vec<&str> = spans.iter().map(|s| s.text.as_str()).collect();
        assert_eq!(texts, ["A", "B C", "```sh", "a`b", "D"]);
        assert_eq!(spans[0].line, 1);
        assert_eq!(spans[0].after, " (default 30 s), and `B C` then.");
        assert_eq!(spans[1].line, 2);
        assert_eq!(spans[1].after, " then.");
        let tables = prose.tables();
        assert_eq!(tables.len(), 1);
        assert_eq!(tables[0][0].1, ["x", "`D`"]);
        assert_eq!(tables[0][1], (12, vec!["1".to_owned(), "2".to_owned()]));
    }

    #[test]
    fn defaults_as_sentences_state_them() {
        let rows = [
            (" (default 30 s) pauses", Some("30s")),
            (" (default: `jobs`)", Some("jobs")),
            (", default `results`, or", Some("results")),
            (" (100) deliveries", Some("100")),
            (", 2 s) before", Some("2s")),
            (" (30 s; zero pauses", Some("30s")),
            (", `127.0.0.1:8080` by default: two", Some("127.0.0.1:8080")),
            (
                "; by default `/run/spot-worker`, and",
                Some("/run/spot-worker"),
            ),
            (" (default 1 MiB) is", Some("1MiB")),
            (" (evictions per VM-hour, default 0.05).", Some("0.05")),
            (" (15 minutes in `worker.env`)", None),
            (" 2, one cancelled", None),
            (") sets what goes to stderr: by default `warn`", None),
            (" (default: the adaptive interval, ...)", None),
            (", `--checkpoint-every`)", None),
            (" (`handle`, `job_key`)", None),
        ];
        for (after, expected) in rows {
            assert_eq!(stated_default(after).as_deref(), expected, "{after:?}");
        }
    }
}
