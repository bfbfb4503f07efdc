//! The terminal board: each job's progress as the workers report it, on
//! one redrawn status line (a terminal) or a line per 10 % (a pipe).

use std::io::Write;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use spot_worker_primes::{PrimesJob, Progress};
use tokio::sync::watch;

use super::Who;
use super::format::{grouped, percent};

/// The jobs' progress as the workers report it, shared with the progress
/// hook. It also owns stdout, so progress and messages never mix mid-line.
#[derive(Clone)]
pub(super) struct Tracker {
    pub(super) board: Arc<Mutex<Board>>,
    pub(super) totals: Arc<watch::Sender<Totals>>,
}

/// What the demo waits on.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Totals {
    /// Numbers counted (and checkpointed) by either worker.
    pub(super) counted: u64,
    /// Deliveries whose handler ran to the end (result written).
    pub(super) finished: u64,
}

/// The tracker's state, behind its lock.
pub(super) struct Board {
    pub(super) jobs: Vec<JobState>,
    pub(super) counted: [u64; 2],
    pub(super) finished: u64,
    /// Redraw one status line (stdout is a terminal) rather than print a
    /// line per job and 10 %.
    pub(super) tty: bool,
    /// The status line on screen, if any.
    pub(super) status: Option<String>,
}

/// One job, as far as the progress reports go.
pub(super) struct JobState {
    pub(super) id: String,
    pub(super) start: u64,
    pub(super) end: u64,
    pub(super) cursor: u64,
    /// The last multiple of 10 % printed.
    pub(super) shown_tenths: u64,
    /// Where each worker's first report on the job began.
    pub(super) first_report: [Option<u64>; 2],
}

impl JobState {
    /// How many tenths of the range are done.
    pub(super) fn tenths(&self) -> u64 {
        // An empty range is all done.
        ((self.cursor - self.start) * 10)
            .checked_div(self.end - self.start)
            .unwrap_or(10)
    }
}

impl Tracker {
    pub(super) fn new(jobs: &[PrimesJob], tty: bool) -> Tracker {
        let jobs = jobs
            .iter()
            .map(|job| JobState {
                id: job.job_id.clone(),
                start: job.start,
                end: job.end,
                cursor: job.start,
                shown_tenths: 0,
                first_report: [None, None],
            })
            .collect();
        Tracker {
            board: Arc::new(Mutex::new(Board {
                jobs,
                counted: [0, 0],
                finished: 0,
                tty,
                status: None,
            })),
            totals: Arc::new(watch::channel(Totals::default()).0),
        }
    }

    // Printing never panics while the lock is held, so a poisoned lock
    // still guards consistent data.
    pub(super) fn board(&self) -> MutexGuard<'_, Board> {
        self.board.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The progress hook: a chunk of `p.job_id` was counted and
    /// checkpointed by `who`.
    pub(super) fn chunk(&self, who: Who, p: &Progress) {
        let mut board = self.board();
        board.counted[who.index()] += p.cursor.saturating_sub(p.chunk_start);
        let tty = board.tty;
        let mut lines = Vec::new();
        if let Some(job) = board.jobs.iter_mut().find(|j| j.id == p.job_id) {
            if job.first_report[who.index()].is_none() {
                job.first_report[who.index()] = Some(p.chunk_start);
                if who == Who::B {
                    lines.push(if p.chunk_start == job.start {
                        format!("  {who}  {:<4} started at the beginning", job.id)
                    } else {
                        format!(
                            "  {who}  {:<4} resumed at {:.1} % ({}), where A's checkpoint was",
                            job.id,
                            percent(p.chunk_start - job.start, job.end - job.start),
                            grouped(p.chunk_start)
                        )
                    });
                }
            }
            job.cursor = p.cursor;
            let tenths = job.tenths();
            if tenths > job.shown_tenths {
                job.shown_tenths = tenths;
                if !tty {
                    lines.push(format!("  {who}  {:<4} {:>3} %", job.id, tenths * 10));
                }
            }
        }
        let status = tty.then(|| board.status_line(who));
        if !lines.is_empty() || (status.is_some() && status != board.status) {
            if status.is_some() {
                board.status = status;
            }
            board.print(&lines);
        }
        let totals = board.totals();
        drop(board);
        self.totals.send_replace(totals);
    }

    /// A delivery ran to the end.
    pub(super) fn finished(&self) {
        let totals = {
            let mut board = self.board();
            board.finished += 1;
            board.totals()
        };
        self.totals.send_replace(totals);
    }

    /// Prints a line (or several), above the status line if there is one.
    pub(super) fn say(&self, text: String) {
        self.board().print(&[text]);
    }

    /// Leaves the status line on screen as it is and starts a new line.
    pub(super) fn end_status(&self) {
        let mut board = self.board();
        if board.status.take().is_some() {
            // Nothing useful to do if stdout is gone.
            let _ = writeln!(std::io::stdout());
        }
    }

    /// The totals now.
    pub(super) fn totals(&self) -> Totals {
        *self.totals.borrow()
    }

    /// Resolves once `done` holds for the totals.
    pub(super) async fn wait_until(&self, done: impl FnMut(&Totals) -> bool) {
        let mut totals = self.totals.subscribe();
        // The sender lives as long as `self`, so this ends only when `done`
        // holds.
        let _ = totals.wait_for(done).await;
    }

    /// Numbers `who` counted and checkpointed.
    pub(super) fn counted(&self, who: Who) -> u64 {
        self.board().counted[who.index()]
    }

    /// Where `who`'s first report on the `job`-th job began: where it
    /// started or resumed.
    pub(super) fn first_report(&self, job: usize, who: Who) -> Option<u64> {
        self.board()
            .jobs
            .get(job)
            .and_then(|j| j.first_report[who.index()])
    }
}

impl Board {
    pub(super) fn totals(&self) -> Totals {
        Totals {
            counted: self.counted.iter().sum(),
            finished: self.finished,
        }
    }

    /// The status line for a terminal: each job's share done while `who`
    /// works.
    pub(super) fn status_line(&self, who: Who) -> String {
        // A line that wraps could not be redrawn in place: a few jobs only.
        const SHOWN: usize = 6;
        let mut line = format!("  {who}");
        for job in self.jobs.iter().take(SHOWN) {
            let done = percent(job.cursor - job.start, job.end - job.start);
            line.push_str(&format!(" | {} {done:>3.0} %", job.id));
        }
        if self.jobs.len() > SHOWN {
            line.push_str(&format!(" | +{} more", self.jobs.len() - SHOWN));
        }
        let done = self.jobs.iter().map(|j| j.cursor - j.start).sum();
        let size = self.jobs.iter().map(|j| j.end - j.start).sum();
        line.push_str(&format!(" | all {:.0} %", percent(done, size)));
        line
    }

    /// Writes `lines`, then redraws the status line below them.
    pub(super) fn print(&self, lines: &[String]) {
        let mut out = std::io::stdout().lock();
        // A closed stdout (`| head`) must not stop the demo halfway: the
        // workers would be left mid-drain. Write errors are ignored.
        if self.status.is_some() {
            let _ = write!(out, "\r\x1b[2K");
        }
        for line in lines {
            let _ = writeln!(out, "{line}");
        }
        if let Some(status) = &self.status {
            let _ = write!(out, "{status}");
        }
        let _ = out.flush();
    }
}
