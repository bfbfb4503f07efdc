//! The program's stdout and stderr: line by line into the worker's log
//! (each line bounded), and the last few KiB of stderr kept for the
//! failure reason.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// The longest line logged; the rest of a longer line is dropped and the
/// line marked as cut.
pub const MAX_LINE: usize = 4096;

/// How much of stderr's end a failure reason quotes: 3 KiB, so that the
/// reason with it fits a poison record's `last_error` (4 KiB).
pub const STDERR_TAIL: usize = 3 * 1024;

/// Which stream a line came from.
#[derive(Clone, Copy, Debug)]
pub enum Stream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// The last [`STDERR_TAIL`] bytes of a stream, shared with its reader.
#[derive(Clone, Debug, Default)]
pub struct Tail(Arc<Mutex<VecDeque<u8>>>);

impl Tail {
    fn push(&self, line: &[u8]) {
        let mut tail = self.0.lock().unwrap_or_else(|p| p.into_inner());
        tail.extend(line);
        tail.push_back(b'\n');
        let excess = tail.len().saturating_sub(STDERR_TAIL);
        tail.drain(..excess);
    }

    /// The kept text, lossily decoded, without a trailing newline.
    pub fn text(&self) -> String {
        let tail = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let bytes: Vec<u8> = tail.iter().copied().collect();
        String::from_utf8_lossy(&bytes).trim_end().to_owned()
    }
}

/// Logs every line of `reader` with the job's key and message id, until
/// end of file or a read error; stderr's lines also go to `tail`.
pub async fn forward(
    mut reader: impl AsyncBufRead + Unpin,
    stream: Stream,
    job_key: String,
    message_id: String,
    tail: Option<Tail>,
) {
    let mut line = Vec::new();
    loop {
        line.clear();
        let cut = match read_bounded_line(&mut reader, &mut line, MAX_LINE).await {
            Ok(Some(cut)) => cut,
            Ok(None) | Err(_) => return,
        };
        let text = String::from_utf8_lossy(&line);
        let text = text.trim_end_matches('\r');
        match stream {
            Stream::Stdout => {
                tracing::info!(job_key = %job_key, message_id = %message_id, stream = "stdout", cut, "{text}")
            }
            Stream::Stderr => {
                tracing::info!(job_key = %job_key, message_id = %message_id, stream = "stderr", cut, "{text}")
            }
        }
        if let Some(tail) = &tail {
            tail.push(&line);
        }
    }
}

/// Reads one line (without its newline) into `line`, keeping at most `max`
/// bytes of it and skipping the rest; `Some(true)` if it was cut, `None` at
/// end of file.
pub async fn read_bounded_line(
    reader: &mut (impl AsyncBufRead + Unpin),
    line: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<Option<bool>> {
    let mut cut = false;
    let mut read_any = false;
    loop {
        let buffer = reader.fill_buf().await?;
        if buffer.is_empty() {
            return Ok(read_any.then_some(cut));
        }
        read_any = true;
        let (chunk, used, ended) = match buffer.iter().position(|&b| b == b'\n') {
            Some(at) => (&buffer[..at], at + 1, true),
            None => (buffer, buffer.len(), false),
        };
        let room = max.saturating_sub(line.len());
        if chunk.len() > room {
            cut = true;
        }
        line.extend_from_slice(&chunk[..chunk.len().min(room)]);
        reader.consume(used);
        if ended {
            return Ok(Some(cut));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lines_are_bounded() {
        let input = format!("short\n{}\nlast", "x".repeat(10));
        let mut reader = tokio::io::BufReader::with_capacity(3, input.as_bytes());
        let mut lines = Vec::new();
        let mut line = Vec::new();
        for _ in 0..10 {
            line.clear();
            match read_bounded_line(&mut reader, &mut line, 4).await.unwrap() {
                Some(cut) => lines.push((String::from_utf8(line.clone()).unwrap(), cut)),
                None => break,
            }
        }
        assert_eq!(
            lines,
            [
                ("shor".to_owned(), true),
                ("xxxx".to_owned(), true),
                ("last".to_owned(), false)
            ]
        );
    }

    #[test]
    fn the_tail_keeps_the_end() {
        let tail = Tail::default();
        for i in 0..2000 {
            tail.push(format!("line {i}").as_bytes());
        }
        let text = tail.text();
        assert!(text.len() <= STDERR_TAIL, "{}", text.len());
        assert!(text.ends_with("line 1999"), "{text}");
    }
}
