//! `poison requeue` and `poison purge`: a scan of the poison queue that
//! settles each selected record and leaves every other one in place.
//!
//! Order matters so that nothing is lost: a requeued original is sent
//! first, its record deleted only after the send succeeded, and its
//! claim-check blob only after the record is gone (a failure in between
//! leaves a record that can be requeued again, never a record without its
//! original).

use anyhow::{Context as _, Result, bail};
use spot_worker_lanes::requeue_text;
use spot_worker_storage::{MessageQueue as _, QueueMessage};

use super::record::{Entry, Selection, original_text};
use crate::operate::scan::Scan;
use crate::operate::{Fleet, confirm};

/// Counts for the closing line.
#[derive(Default)]
struct Tally {
    done: u64,
    kept: u64,
    failed: u64,
}

/// What to do with one selected record.
#[derive(Clone, Copy)]
enum Action {
    Requeue,
    Purge,
}

pub async fn requeue(fleet: &Fleet, selection: &Selection) -> Result<()> {
    let tally = settle_selected(fleet, selection, Action::Requeue).await?;
    finish(tally, "requeued", selection)
}

pub async fn purge(fleet: &Fleet, selection: &Selection, yes: bool) -> Result<()> {
    let question = match selection {
        Selection::All => format!(
            "delete EVERY record of poison queue {}-poison for good",
            fleet.config.queue
        ),
        Selection::ReasonContains(text) => {
            format!("delete every poison record whose reason contains {text:?} for good")
        }
        Selection::Ids(ids) => format!("delete poison record(s) {} for good", ids.join(", ")),
    };
    if !confirm(&question, yes)? {
        bail!("not confirmed: nothing was deleted");
    }
    let tally = settle_selected(fleet, selection, Action::Purge).await?;
    finish(tally, "purged", selection)
}

fn finish(tally: Tally, verb: &str, selection: &Selection) -> Result<()> {
    println!(
        "{} {verb}, {} left in place, {} failed",
        tally.done, tally.kept, tally.failed
    );
    if tally.failed > 0 {
        bail!(
            "{} record(s) could not be {verb} (listed above); they are still in the poison queue",
            tally.failed
        );
    }
    if let Selection::Ids(ids) = selection
        && tally.done < ids.len() as u64
    {
        bail!(
            "{} of {} id(s) matched no record (see `spot-worker poison list --all`)",
            ids.len() as u64 - tally.done,
            ids.len()
        );
    }
    Ok(())
}

async fn settle_selected(fleet: &Fleet, selection: &Selection, action: Action) -> Result<Tally> {
    let poison = fleet.poison_queue()?;
    let mut scan = Scan::new(&poison);
    let mut tally = Tally::default();
    while let Some(batch) = scan.next_batch().await? {
        for message in batch {
            let entry = Entry::new(message.id.clone(), &message.body);
            if !selection.matches(&entry) {
                tally.kept += 1;
                scan.keep(message);
                continue;
            }
            let settled = match action {
                Action::Requeue => requeue_one(fleet, &scan, &entry, &message).await,
                Action::Purge => purge_one(fleet, &scan, &entry, &message).await,
            };
            match settled {
                Ok(line) => {
                    tally.done += 1;
                    println!("{line}");
                }
                Err(e) => {
                    tally.failed += 1;
                    eprintln!("record {}: {e:#}", entry.id);
                    scan.keep(message);
                }
            }
        }
    }
    scan.finish().await?;
    Ok(tally)
}

/// Sends the original back to its queue, then deletes the record and its
/// blob. Returns the line to print.
async fn requeue_one(
    fleet: &Fleet,
    scan: &Scan<'_>,
    entry: &Entry,
    message: &QueueMessage,
) -> Result<String> {
    let record = match &entry.record {
        Ok(record) => record,
        Err(e) => bail!("not a poison record ({e}); nothing to requeue"),
    };
    // A job with a deadline goes back marked as moved from the poisoned
    // message: its lane record's tombstone then tells it from the copies a
    // move left behind, which stay unrun.
    let original = requeue_text(
        record.encoding,
        &original_text(fleet, record).await?,
        &record.original_id,
    )
    .context("re-encoding the original's envelope")?;
    let queue = fleet.queue_named(&record.queue)?;
    let new_id = queue
        .send(&original, std::time::Duration::ZERO)
        .await
        .with_context(|| format!("sending the original back to queue {}", record.queue))?;
    scan.delete(message).await.with_context(|| {
        format!(
            "the original is back on {} as {new_id}, but its record stays (requeueing it again \
             would send a duplicate)",
            record.queue
        )
    })?;
    delete_blob(fleet, entry).await;
    Ok(format!(
        "requeued {} (original {}) to {} as {new_id}",
        entry.id, record.original_id, record.queue
    ))
}

/// Deletes the record, then its blob.
async fn purge_one(
    fleet: &Fleet,
    scan: &Scan<'_>,
    entry: &Entry,
    message: &QueueMessage,
) -> Result<String> {
    scan.delete(message).await?;
    delete_blob(fleet, entry).await;
    Ok(format!("purged {}", entry.id))
}

/// Deletes the record's claim-check blob, if it has one. The record is
/// already gone, so a failure only leaves a blob over: a warning, not a
/// failed requeue or purge.
async fn delete_blob(fleet: &Fleet, entry: &Entry) {
    let Some(blob) = entry
        .record
        .as_ref()
        .ok()
        .and_then(|record| record.body_blob.as_ref())
    else {
        return;
    };
    let deleted = match fleet.blobs(&blob.container) {
        Ok(store) => store.delete(&blob.name).await.map_err(anyhow::Error::from),
        Err(e) => Err(e),
    };
    if let Err(e) = deleted {
        eprintln!(
            "warning: record {} is settled, but its claim-check blob {}/{} is left over: {e:#}",
            entry.id, blob.container, blob.name
        );
    }
}
