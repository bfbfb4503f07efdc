//! What the tests of the `spot-worker` binary (and its benches) share: a
//! child's log read line by line as it comes, bounded waits on it, and
//! the large-state harness ([`large`]).

#![allow(dead_code)] // Each test binary uses its own part of this.

pub mod large;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use spot_worker_imds_emulator::{Emulator, EmulatorConfig, RunningEmulator};
use spot_worker_testkit::{Azurite, HarnessError};
use tokio::io::{AsyncBufReadExt as _, AsyncRead, BufReader};

/// Bound on every wait for a log line.
pub const PATIENCE: Duration = Duration::from_secs(90);

/// An Azurite of the test's own, started by `start` (`Azurite::start`,
/// `Azurite::start_separate`) off the runtime's threads.
pub async fn azurite_from(start: fn() -> Result<Azurite, HarnessError>) -> Azurite {
    tokio::task::spawn_blocking(start)
        .await
        .unwrap()
        .expect("azurite starts (run `npm ci --prefix tools/azurite`)")
}

/// The IMDS emulator as the VM `vm` of a scale set sees it.
pub async fn imds_of(vm: &str) -> RunningEmulator {
    Emulator::start(EmulatorConfig::for_vm(vm)).await.unwrap()
}

/// A process's stderr, line by line: ANSI colours removed, and as written.
#[derive(Clone, Default)]
pub struct Log(Arc<Mutex<Vec<String>>>, Arc<Mutex<Vec<String>>>);

impl Log {
    /// Reads `stderr` into a log, on a task of its own, to its end.
    pub fn collect(stderr: impl AsyncRead + Unpin + Send + 'static) -> Log {
        let log = Log::default();
        let sink = log.clone();
        let mut lines = BufReader::new(stderr).lines();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                sink.push(line);
            }
        });
        log
    }

    fn push(&self, line: String) {
        self.0.lock().unwrap().push(without_colours(&line));
        self.1.lock().unwrap().push(line);
    }

    /// The lines exactly as written (colours and all).
    pub fn as_written(&self) -> impl Iterator<Item = String> {
        self.1.lock().unwrap().clone().into_iter()
    }

    /// Everything logged so far.
    pub fn text(&self) -> String {
        self.0.lock().unwrap().join("\n")
    }

    /// The first line containing every one of `parts`.
    pub fn line(&self, parts: &[&str]) -> Option<String> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .find(|line| parts.iter().all(|p| line.contains(p)))
            .cloned()
    }

    /// How many lines contain every one of `parts`.
    pub fn count(&self, parts: &[&str]) -> usize {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|line| parts.iter().all(|p| line.contains(p)))
            .count()
    }

    /// Waits (bounded) for a line containing every one of `parts`.
    pub async fn wait_for(&self, parts: &[&str]) -> String {
        let started = std::time::Instant::now();
        loop {
            if let Some(line) = self.line(parts) {
                return line;
            }
            assert!(
                started.elapsed() < PATIENCE,
                "no line with {parts:?}:\n{}",
                self.text()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn without_colours(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ ... final byte in @..~
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) && c != '[' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}
