//! The program's stdout and stderr: record by record into the worker's log
//! at the level `--program-output` chooses (or not at all), and the last
//! few KiB of stderr, exactly as written, kept for the failure reason.
//!
//! Real programs draw progress with carriage returns (ffmpeg, curl, pip,
//! rsync, tqdm), so a `\r` ends a record as a `\n` does: an error written
//! after a progress line is a record of its own. Progress records (ended by
//! a lone `\r`) are logged at most every [`PROGRESS_EVERY`] per stream; the
//! latest one held back is logged before the next ordinary line and at the
//! end, so the last progress state is never lost.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::time::Instant;
use tracing::Level;

/// The longest record logged; a longer one keeps its first and last
/// halves, with how much was left out in between.
pub const MAX_LINE: usize = 4096;

/// How much of stderr's end a failure reason quotes: 3 KiB, so that the
/// reason with it fits a poison record's `last_error` (4 KiB).
pub const STDERR_TAIL: usize = 3 * 1024;

/// The least time between two progress records (ended by `\r`) logged
/// from one stream.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// Which stream a record came from.
#[derive(Clone, Copy, Debug)]
pub enum Stream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

impl Stream {
    fn name(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// The last [`STDERR_TAIL`] bytes a stream carried, exactly as written,
/// shared with its reader.
#[derive(Clone, Debug, Default)]
pub struct Tail(Arc<Mutex<VecDeque<u8>>>);

impl Tail {
    fn push(&self, bytes: &[u8]) {
        let mut tail = self.0.lock().unwrap_or_else(|p| p.into_inner());
        tail.extend(bytes);
        let excess = tail.len().saturating_sub(STDERR_TAIL);
        tail.drain(..excess);
    }

    /// The kept text, lossily decoded, carriage returns shown as line
    /// ends, without trailing white space.
    pub fn text(&self) -> String {
        let tail = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let bytes: Vec<u8> = tail.iter().copied().collect();
        String::from_utf8_lossy(&bytes)
            .replace("\r\n", "\n")
            .replace('\r', "\n")
            .trim_end()
            .to_owned()
    }
}

/// How a record ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// `\n` (or `\r\n`): an ordinary line.
    Newline,
    /// A lone `\r`: a progress line the next one overwrites.
    Return,
    /// The stream ended without a line end.
    Eof,
}

/// One record of a stream: its text, how many bytes of its middle were
/// left out, and how it ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The kept bytes, lossily decoded (with a note of the cut, if any).
    pub text: String,
    /// Bytes left out of the middle.
    pub cut: usize,
    /// How it ended.
    pub end: End,
}

/// Cuts a byte stream into [`Record`]s at `\n`, `\r\n` and `\r`, keeping
/// the first and last `max / 2` bytes of a longer record.
#[derive(Debug)]
pub struct Splitter {
    max: usize,
    head: Vec<u8>,
    tail: VecDeque<u8>,
    cut: usize,
    /// A `\r` was the last byte seen: a `\n` next makes it one line end.
    after_return: bool,
}

impl Splitter {
    /// A splitter keeping records of up to `max` bytes whole.
    pub fn new(max: usize) -> Self {
        Splitter {
            max,
            head: Vec::new(),
            tail: VecDeque::new(),
            cut: 0,
            after_return: false,
        }
    }

    /// Feeds `bytes`; the records they complete go to `out`.
    pub fn push(&mut self, bytes: &[u8], out: &mut Vec<Record>) {
        for &byte in bytes {
            if self.after_return {
                self.after_return = false;
                if byte == b'\n' {
                    self.emit(End::Newline, out);
                    continue;
                }
                self.emit(End::Return, out);
            }
            match byte {
                b'\n' => self.emit(End::Newline, out),
                b'\r' => self.after_return = true,
                _ => self.keep(byte),
            }
        }
    }

    /// The stream ended: what is left becomes a last record.
    pub fn finish(&mut self, out: &mut Vec<Record>) {
        if self.after_return {
            self.after_return = false;
            self.emit(End::Return, out);
        }
        self.emit(End::Eof, out);
    }

    fn keep(&mut self, byte: u8) {
        let half = self.max / 2;
        if self.head.len() < self.max - half {
            self.head.push(byte);
            return;
        }
        self.tail.push_back(byte);
        if self.tail.len() > half {
            self.tail.pop_front();
            self.cut += 1;
        }
    }

    /// Ends the current record; empty records (a blank line, the space
    /// between two line ends) are not records.
    fn emit(&mut self, end: End, out: &mut Vec<Record>) {
        if self.head.is_empty() {
            return;
        }
        let head = String::from_utf8_lossy(&self.head);
        let tail: Vec<u8> = self.tail.drain(..).collect();
        let tail = String::from_utf8_lossy(&tail);
        let text = if self.cut > 0 {
            format!("{head}…[{} bytes left out]…{tail}", self.cut)
        } else {
            format!("{head}{tail}")
        };
        out.push(Record {
            text,
            cut: self.cut,
            end,
        });
        self.head.clear();
        self.cut = 0;
    }
}

/// Which records of a stream are logged: every ordinary line, and
/// progress lines at most every [`PROGRESS_EVERY`], the latest one held
/// back logged before the next ordinary line or at the end.
#[derive(Debug, Default)]
pub struct Pacing {
    last_progress: Option<Instant>,
    held: Option<Record>,
}

impl Pacing {
    /// The records to log now, at `now`, for `record`.
    pub fn admit(&mut self, record: Record, now: Instant) -> Vec<Record> {
        match record.end {
            End::Return => {
                let due = self
                    .last_progress
                    .is_none_or(|last| now.saturating_duration_since(last) >= PROGRESS_EVERY);
                if due {
                    self.last_progress = Some(now);
                    self.held = None;
                    vec![record]
                } else {
                    self.held = Some(record);
                    Vec::new()
                }
            }
            End::Newline | End::Eof => self.held.take().into_iter().chain([record]).collect(),
        }
    }

    /// The stream ended: the progress line held back, if any.
    pub fn finish(&mut self) -> Option<Record> {
        self.held.take()
    }
}

/// Logs the records of `reader` at `level` (`None`: not at all) with the
/// job's key and message id, until end of file or a read error; every
/// byte of stderr also goes to `tail`.
pub async fn forward(
    mut reader: impl AsyncRead + Unpin,
    stream: Stream,
    level: Option<Level>,
    job_key: String,
    message_id: String,
    tail: Option<Tail>,
) {
    let mut splitter = Splitter::new(MAX_LINE);
    let mut pacing = Pacing::default();
    let mut buffer = vec![0u8; 8192];
    let mut records = Vec::new();
    let log = |record: &Record| {
        if let Some(level) = level {
            log_record(level, stream, &job_key, &message_id, record);
        }
    };
    loop {
        let read = match reader.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        let bytes = &buffer[..read];
        if let Some(tail) = &tail {
            tail.push(bytes);
        }
        splitter.push(bytes, &mut records);
        let now = Instant::now();
        for record in records.drain(..) {
            pacing.admit(record, now).iter().for_each(log);
        }
    }
    splitter.finish(&mut records);
    let now = Instant::now();
    for record in records.drain(..) {
        pacing.admit(record, now).iter().for_each(log);
    }
    if let Some(held) = pacing.finish() {
        log(&held);
    }
}

/// One record as a log event (`tracing`'s macros need the level spelled
/// out).
fn log_record(level: Level, stream: Stream, job_key: &str, message_id: &str, record: &Record) {
    let (stream, cut, text) = (stream.name(), record.cut, record.text.as_str());
    let progress = record.end == End::Return;
    macro_rules! at {
        ($level:expr) => {
            tracing::event!($level, job_key, message_id, stream, cut, progress, "{text}")
        };
    }
    match level {
        Level::ERROR => at!(Level::ERROR),
        Level::WARN => at!(Level::WARN),
        Level::INFO => at!(Level::INFO),
        Level::DEBUG => at!(Level::DEBUG),
        Level::TRACE => at!(Level::TRACE),
    }
}

/// `--program-output`: a log level (`error`, `warn`, `info`, `debug`,
/// `trace`), or `off` for none.
pub fn parse_output_level(text: &str) -> Result<Option<Level>, String> {
    let text = text.trim();
    if text.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    text.parse::<Level>()
        .map(Some)
        .map_err(|_| format!("{text:?} is not a level: use error, warn, info, debug, trace or off"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record as (text, bytes left out, end).
    type Split = (String, usize, End);

    fn split(input: &[u8], max: usize, chunk: usize) -> Vec<Split> {
        let mut splitter = Splitter::new(max);
        let mut out = Vec::new();
        for piece in input.chunks(chunk) {
            splitter.push(piece, &mut out);
        }
        splitter.finish(&mut out);
        out.into_iter().map(|r| (r.text, r.cut, r.end)).collect()
    }

    #[test]
    fn carriage_returns_end_records_and_long_ones_keep_both_ends() {
        use End::*;
        let s = |text: &str| text.to_owned();
        // (input, longest record kept whole, records), whatever the chunking.
        let rows: [(&[u8], usize, Vec<Split>); 6] = [
            (
                b"a\nb\r\nc",
                64,
                vec![(s("a"), 0, Newline), (s("b"), 0, Newline), (s("c"), 0, Eof)],
            ),
            (
                b"frame=1\rframe=2\rerror: File too large\n",
                64,
                vec![
                    (s("frame=1"), 0, Return),
                    (s("frame=2"), 0, Return),
                    (s("error: File too large"), 0, Newline),
                ],
            ),
            (b"\n\n\r\r\n", 64, vec![]),
            (b"last\r", 64, vec![(s("last"), 0, Return)]),
            (
                b"0123456789\n",
                8,
                vec![(s("0123\u{2026}[2 bytes left out]\u{2026}6789"), 2, Newline)],
            ),
            (b"01234567", 8, vec![(s("01234567"), 0, Eof)]),
        ];
        for (input, max, expected) in rows {
            for chunk in [1, 3, 64] {
                assert_eq!(
                    split(input, max, chunk),
                    expected,
                    "{input:?} in chunks of {chunk}"
                );
            }
        }
    }

    #[test]
    fn progress_is_paced_and_its_last_state_kept() {
        let at = Instant::now();
        let record = |text: &str, end| Record {
            text: text.to_owned(),
            cut: 0,
            end,
        };
        let mut pacing = Pacing::default();
        let texts = |records: Vec<Record>| records.into_iter().map(|r| r.text).collect::<Vec<_>>();
        assert_eq!(texts(pacing.admit(record("p1", End::Return), at)), ["p1"]);
        let soon = at + Duration::from_millis(300);
        assert!(pacing.admit(record("p2", End::Return), soon).is_empty());
        assert!(pacing.admit(record("p3", End::Return), soon).is_empty());
        // An ordinary line brings the last progress state with it.
        assert_eq!(
            texts(pacing.admit(record("done", End::Newline), soon)),
            ["p3", "done"]
        );
        let later = at + PROGRESS_EVERY;
        assert_eq!(
            texts(pacing.admit(record("p4", End::Return), later)),
            ["p4"]
        );
        assert!(pacing.admit(record("p5", End::Return), later).is_empty());
        assert_eq!(pacing.finish().map(|r| r.text).as_deref(), Some("p5"));
    }

    #[test]
    fn the_tail_keeps_the_last_bytes_written() {
        let tail = Tail::default();
        for i in 0..2000 {
            tail.push(format!("frame={i}\r").as_bytes());
        }
        tail.push(b"av_interleaved_write_frame(): File too large\n");
        let text = tail.text();
        assert!(text.len() <= STDERR_TAIL, "{}", text.len());
        assert!(
            text.ends_with("frame=1999\nav_interleaved_write_frame(): File too large"),
            "{text}"
        );
    }

    #[test]
    fn output_levels() {
        assert_eq!(parse_output_level("info"), Ok(Some(Level::INFO)));
        assert_eq!(parse_output_level("DEBUG"), Ok(Some(Level::DEBUG)));
        assert_eq!(parse_output_level("off"), Ok(None));
        assert!(
            parse_output_level("loud")
                .unwrap_err()
                .contains("not a level")
        );
    }
}
