//! What the run tells the operator: progress on stderr as it goes (a bar
//! on a terminal, plain lines otherwise) and the counts at its end.

use std::io::IsTerminal as _;

use indicatif::{ProgressBar, ProgressStyle};
use spot_worker_decisions::lanes::Lane;

use super::send::Outcome;

/// The counts printed at the end.
#[derive(Default)]
pub(super) struct Summary {
    pub(super) sent: u64,
    /// Of those, sent to the regular lane.
    pub(super) regular: u64,
    /// Of those, whose work no longer fits before the deadline.
    pub(super) late: u64,
    pub(super) skipped: u64,
    pub(super) blank: u64,
    pub(super) bad: u64,
    pub(super) failed: u64,
    /// Why reading stopped before the end of the input, if it did.
    pub(super) unread: Option<String>,
}

impl Summary {
    pub(super) fn count(&mut self, outcome: &Outcome) {
        match outcome {
            Outcome::Sent { lane, late } => {
                self.sent += 1;
                self.regular += u64::from(*lane == Lane::Regular);
                self.late += u64::from(*late);
            }
            Outcome::Skipped => self.skipped += 1,
            Outcome::Failed(_) => self.failed += 1,
        }
    }
}

/// Progress on stderr: a bar on a terminal, plain lines otherwise.
pub(super) struct Progress(Option<ProgressBar>);

impl Progress {
    pub(super) fn new(total_bytes: Option<u64>) -> Self {
        if !std::io::stderr().is_terminal() {
            return Progress(None);
        }
        let bar = match total_bytes {
            Some(total) => ProgressBar::new(total).with_style(
                ProgressStyle::with_template("{bar:40} {percent:>3}% {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            ),
            None => ProgressBar::new_spinner(),
        };
        Progress(Some(bar))
    }

    pub(super) fn report(&self, message: &str) {
        match &self.0 {
            Some(bar) => bar.println(message),
            None => eprintln!("{message}"),
        }
    }

    pub(super) fn update(&self, bytes: u64, summary: &Summary) {
        if let Some(bar) = &self.0 {
            bar.set_position(bytes);
            bar.set_message(format!("{} sent", summary.sent));
        }
    }

    pub(super) fn finish(&self) {
        if let Some(bar) = &self.0 {
            bar.finish_and_clear();
        }
    }
}
