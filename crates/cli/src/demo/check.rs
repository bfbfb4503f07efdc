//! After the run: every result against an independent count, nothing left
//! behind, and the summary.

use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde_json::Value;
use spot_worker_primes::{PrimesJob, expected_result};
use spot_worker_storage::Checkpoint;
use tokio::sync::oneshot;

use super::format::{grouped, millis};
use super::{Demo, Eviction, PREEMPT_NOTICE, Saved, Who};

impl Demo {
    /// Verifies the outcome, prints the summary, and fails unless every
    /// check holds.
    pub(super) async fn check(&self, eviction: &Eviction, started: Instant) -> Result<()> {
        let n = self.jobs.len() as u64;
        self.tracker.say(
            "\nverifying: counting every range again in one pass (no chunks, no checkpoints)..."
                .to_owned(),
        );
        let expected = tokio::select! {
            expected = expected_results(&self.jobs) => expected?,
            () = self.interrupted.cancelled() => bail!("interrupted while verifying the results"),
        };
        let mut done = 0;
        let mut verified = 0;
        for (job, expected) in self.jobs.iter().zip(&expected) {
            let name = job.result_name();
            let stored = self
                .storage
                .results
                .get(&name)
                .await
                .with_context(|| format!("reading result {name}"))?;
            if let Some(bytes) = stored {
                done += 1;
                if serde_json::from_slice::<Value>(&bytes).ok().as_ref() == Some(expected) {
                    verified += 1;
                }
            }
        }
        let (queued, poisoned) = self.storage.messages_left().await?;
        let finished = self.tracker.totals().finished;
        let duplicates = finished.saturating_sub(n);
        let drain = &eviction.report.drain;
        let drained_in_time = drain.met_deadline && drain.notice_to_drained < PREEMPT_NOTICE;
        let [counted_a, counted_b] = [Who::A, Who::B].map(|who| self.tracker.counted(who));
        let counted = counted_a + counted_b;
        let total = self.total_numbers();
        let interrupted_jobs = eviction
            .saved
            .iter()
            .filter(|s| matches!(s, Saved::InProgress { .. }))
            .count() as u64;
        let allowed = interrupted_jobs * self.chunk_size.get();
        let redone = counted.saturating_sub(total);
        let resumed_right = self.resumed_at_checkpoints(&eviction.saved);

        let mut failed = Vec::new();
        let mut check = |ok: bool, line: String| {
            if !ok {
                failed.push(line.clone());
            }
            self.tracker
                .say(format!("  {line}{}", if ok { "" } else { "   <-- FAILED" }));
        };
        self.tracker.say("\nsummary".to_owned());
        check(done == n, format!("jobs done {done}/{n}"));
        check(
            verified == n,
            format!("results verified {verified}/{n} (equal to count_primes over each range)"),
        );
        check(
            done == n && queued == 0 && poisoned == 0,
            format!(
                "lost {} ({queued} messages left in the queue, {poisoned} in the poison queue)",
                n - done + poisoned
            ),
        );
        check(
            duplicates == 0 && finished >= n,
            format!("duplicates {duplicates} ({finished} deliveries ran to the end for {n} jobs)"),
        );
        check(
            drained_in_time,
            format!(
                "drain {} from the notice to every message settled or released (Azure gives 30 s)",
                millis(drain.notice_to_drained)
            ),
        );
        check(
            resumed_right,
            "B resumed every job where its checkpoint was".to_owned(),
        );
        check(
            counted >= total && redone <= allowed,
            format!(
                "work redone after the eviction {} numbers (A counted {}, B {}, ranges {}; \
                 at most one chunk per interrupted job: {})",
                grouped(redone),
                grouped(counted_a),
                grouped(counted_b),
                grouped(total),
                grouped(allowed)
            ),
        );
        self.tracker.say(format!(
            "  wall time {:.1} s",
            started.elapsed().as_secs_f64()
        ));
        if failed.is_empty() {
            Ok(())
        } else {
            bail!("demo check failed: {}", failed.join("; "))
        }
    }

    /// Whether B's first report on each job started where A's checkpoint
    /// said (or at the start for jobs A never touched; B never reports on
    /// a job A completed).
    pub(super) fn resumed_at_checkpoints(&self, saved: &[Saved]) -> bool {
        self.jobs
            .iter()
            .zip(saved)
            .enumerate()
            .all(|(i, (job, saved))| {
                let first = self.tracker.first_report(i, Who::B);
                match *saved {
                    Saved::Nothing => first == Some(job.start) || job.start == job.end,
                    Saved::InProgress { cursor, .. } => first == Some(cursor) || cursor == job.end,
                    Saved::Completed { .. } => first.is_none(),
                }
            })
    }

    /// `job`'s state as the next worker will find it: its result (the
    /// job's completion marker; its checkpoint is removed once it is
    /// written), else its checkpoint.
    pub(super) async fn read_checkpoint(&self, job: &PrimesJob) -> Result<Saved> {
        let name = job.result_name();
        let result = self
            .storage
            .results
            .get(&name)
            .await
            .with_context(|| format!("reading result {name}"))?;
        if let Some(result) = result.and_then(|bytes| serde_json::from_slice::<Value>(&bytes).ok())
        {
            return Ok(Saved::Completed {
                primes: result.get("primes").and_then(Value::as_u64).unwrap_or(0),
            });
        }
        let read = self
            .storage
            .checkpoints
            .read(&job.job_id)
            .await
            .with_context(|| format!("reading the checkpoint of {}", job.job_id))?;
        let field = |value: &Value, name: &str| value.get(name).and_then(Value::as_u64);
        Ok(match read.map(|stored| stored.checkpoint) {
            None => Saved::Nothing,
            Some(Checkpoint::InProgress { progress }) => Saved::InProgress {
                cursor: field(&progress, "cursor").unwrap_or(job.start),
                primes: field(&progress, "primes").unwrap_or(0),
            },
            Some(Checkpoint::Completed { result }) => Saved::Completed {
                primes: field(&result, "primes").unwrap_or(0),
            },
        })
    }
}

/// Each job's correct result, from [`expected_result`] (one pass of
/// `count_primes` over the whole range). On plain threads, one per job,
/// rather than tokio's blocking pool, so that Ctrl-C need not wait for them.
pub(super) async fn expected_results(jobs: &[PrimesJob]) -> Result<Vec<Value>> {
    let mut pending = Vec::with_capacity(jobs.len());
    for job in jobs {
        let (send, receive) = oneshot::channel();
        let job = job.clone();
        std::thread::Builder::new()
            .name(format!("verify-{}", job.job_id))
            .spawn(move || {
                let _ = send.send(expected_result(&job));
            })
            .context("starting a verification thread")?;
        pending.push(receive);
    }
    let mut expected = Vec::with_capacity(pending.len());
    for receive in pending {
        expected.push(receive.await.context("a verification thread died")?);
    }
    Ok(expected)
}
