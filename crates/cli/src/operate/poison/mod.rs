//! `spot-worker poison list|show|requeue|purge`: the records in the work
//! queue's poison queue (`<queue>-poison`, see
//! [`PoisonRecord`](spot_worker_consumer::PoisonRecord)), read, replayed or
//! removed.

mod record;
mod settle;

use anyhow::{Context as _, Result, bail};
use clap::{Args, Subcommand};
use spot_worker_storage::StorageError;

use record::{Entry, Selection, original_size, original_text, short_reason};

use super::scan::Scan;
use super::terminal::{shown, shown_json};
use super::{Fleet, age, encoding_name, rfc3339, seconds_since};

/// Read, requeue or purge the poison queue's records.
#[derive(Debug, Args)]
#[command(after_help = "\
Examples:
  spot-worker poison list
  spot-worker poison show ID
  spot-worker poison requeue --reason-contains timeout
  spot-worker poison purge --all --yes

The poison queue is `<SPOT_WORKER_QUEUE>-poison`, reached with the worker's
own settings (AZURE_STORAGE_CONNECTION_STRING, or SPOT_WORKER_STORAGE_ACCOUNT_URL
with a managed identity or `az login`).")]
pub struct PoisonArgs {
    #[command(subcommand)]
    command: PoisonCommand,
}

#[derive(Debug, Subcommand)]
enum PoisonCommand {
    /// One line per record: id, failures, deliveries, age, size, reason.
    #[command(after_help = "\
Examples:
  spot-worker poison list              # the first 32 records, read without touching them
  spot-worker poison list --all        # every record (each is briefly received, then released)
  spot-worker poison list --json | jq '.[].record.last_error'")]
    List {
        /// Every record, not only the 32 a peek shows.
        #[arg(long)]
        all: bool,
        /// One JSON array: `{"id": ..., "record": {...}}` (or `"error"`).
        #[arg(long)]
        json: bool,
    },
    /// One record in full, with its original message.
    #[command(after_help = "\
Examples:
  spot-worker poison show 4f6d...          # by its id in the poison queue (from `list`)
  spot-worker poison show --raw ID > original.txt   # only the original, byte for byte

A claim-check original (stored as a blob) is downloaded and checked against
the length and SHA-256 in the record. On a terminal, control characters in
the reason (a program's stderr) and the original are shown escaped, as
\\u{1b}; redirected or piped, they are exact.")]
    Show {
        /// The record's id in the poison queue, or the original message id.
        id: String,
        /// Print only the original message text, exactly as it was queued.
        #[arg(long)]
        raw: bool,
    },
    /// Send originals back to the work queue, then delete their records.
    #[command(after_help = "\
Examples:
  spot-worker poison requeue 4f6d...                  # one record
  spot-worker poison requeue --reason-contains timeout
  spot-worker poison requeue --all

Each original goes back byte for byte (the record's body, or its claim-check
blob after checking its SHA-256) as a new message, with a new id and so a
fresh attempt record. The record (and its blob) is deleted only after the
send succeeded.")]
    Requeue(Filter),
    /// Delete records (and their claim-check blobs) for good.
    #[command(after_help = "\
Examples:
  spot-worker poison purge 4f6d...
  spot-worker poison purge --reason-contains 'not valid JSON' --yes
  spot-worker poison purge --all --yes     # in scripts: --yes is required without a terminal")]
    Purge {
        #[command(flatten)]
        filter: Filter,
        /// Do not ask for confirmation (required when stdin is no terminal).
        #[arg(long)]
        yes: bool,
    },
}

/// Which records `requeue` and `purge` act on: ids, a filter, or all.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
struct Filter {
    /// Records by id (poison message id, or original message id).
    ids: Vec<String>,
    /// Records whose reason (`last_error`) contains this text.
    #[arg(long, value_name = "TEXT")]
    reason_contains: Option<String>,
    /// Every record.
    #[arg(long)]
    all: bool,
}

impl Filter {
    fn selection(self) -> Selection {
        match (self.all, self.reason_contains) {
            (true, _) => Selection::All,
            (false, Some(text)) => Selection::ReasonContains(text),
            (false, None) => Selection::Ids(self.ids),
        }
    }
}

pub async fn run(args: PoisonArgs) -> Result<()> {
    let fleet = Fleet::from_env()?;
    match args.command {
        PoisonCommand::List { all, json } => list(&fleet, all, json).await,
        PoisonCommand::Show { id, raw } => show(&fleet, &id, raw).await,
        PoisonCommand::Requeue(filter) => settle::requeue(&fleet, &filter.selection()).await,
        PoisonCommand::Purge { filter, yes } => {
            settle::purge(&fleet, &filter.selection(), yes).await
        }
    }
}

/// The records: peeked (at most 32, untouched), or all by a scan.
async fn entries(fleet: &Fleet, all: bool) -> Result<Vec<Entry>> {
    let poison = fleet.poison_queue()?;
    if !all {
        let peeked = match poison.peek(32).await {
            Ok(peeked) => peeked,
            // No poison queue yet: nothing was ever poisoned.
            Err(StorageError::NotFound { .. }) => Vec::new(),
            Err(e) => return Err(e).context("peeking at the poison queue"),
        };
        return Ok(peeked
            .into_iter()
            .map(|m| Entry::new(m.id, &m.body))
            .collect());
    }
    let mut scan = Scan::new(&poison);
    let mut entries = Vec::new();
    while let Some(batch) = scan.next_batch().await? {
        for message in batch {
            entries.push(Entry::new(message.id.clone(), &message.body));
            scan.keep(message);
        }
    }
    scan.finish().await?;
    Ok(entries)
}

async fn list(fleet: &Fleet, all: bool, json: bool) -> Result<()> {
    let entries = entries(fleet, all).await?;
    if json {
        let documents: Vec<serde_json::Value> = entries
            .iter()
            .map(|entry| match &entry.record {
                Ok(record) => serde_json::json!({"id": entry.id.as_str(), "record": record}),
                Err(e) => serde_json::json!({"id": entry.id.as_str(), "error": e}),
            })
            .collect();
        println!("{}", shown_json(&serde_json::to_string_pretty(&documents)?));
        return Ok(());
    }
    println!(
        "{:<36}  {:>8}  {:>10}  {:>5}  {:>8}  {:<6}  REASON",
        "ID", "FAILURES", "DELIVERIES", "AGE", "SIZE", "WHERE"
    );
    for entry in &entries {
        println!("{}", shown(&table_row(entry)));
    }
    let total = fleet.poison_queue()?.approximate_message_count().await.ok();
    let more = match total {
        Some(total) if !all && total > entries.len() as u64 => {
            format!(" of about {total} (a peek shows at most 32; --all reads every record)")
        }
        _ => String::new(),
    };
    println!("{} record(s){more}", entries.len());
    Ok(())
}

fn table_row(entry: &Entry) -> String {
    match &entry.record {
        Ok(record) => {
            let (size, place) = original_size(record);
            format!(
                "{:<36}  {:>8}  {:>10}  {:>5}  {:>8}  {:<6}  {}",
                entry.id.as_str(),
                record.failures,
                record.dequeue_count,
                age(seconds_since(record.poisoned_at)),
                size,
                place,
                short_reason(&record.last_error, 100)
            )
        }
        Err(e) => format!("{:<36}  not a poison record: {e}", entry.id.as_str()),
    }
}

/// Finds record `id`: among the first 32 without touching anything, else
/// by a scan.
async fn find(fleet: &Fleet, id: &str) -> Result<Entry> {
    let selection = Selection::Ids(vec![id.to_owned()]);
    for all in [false, true] {
        if let Some(entry) = entries(fleet, all)
            .await?
            .into_iter()
            .find(|entry| selection.matches(entry))
        {
            return Ok(entry);
        }
    }
    bail!(
        "no record {id:?} in poison queue {}-poison (ids are those `spot-worker poison list` shows, \
         or the original message id)",
        fleet.config.queue
    )
}

async fn show(fleet: &Fleet, id: &str, raw: bool) -> Result<()> {
    let entry = find(fleet, id).await?;
    let record = match entry.record {
        Ok(record) => record,
        Err(e) => bail!("message {} is not a poison record: {e}", entry.id),
    };
    let original = original_text(fleet, &record).await?;
    if raw {
        // Exact when piped or redirected; escaped on a terminal.
        print!("{}", shown(&original));
        return Ok(());
    }
    let (size, place) = original_size(&record);
    let place = match &record.body_blob {
        Some(blob) => format!(
            "{place} {}/{} (sha256 {} verified)",
            blob.container, blob.name, blob.sha256
        ),
        None => place.to_owned(),
    };
    let mut out = format!(
        "id:            {}\nqueue:         {}\noriginal id:   {}\nfailures:      {} (deliveries {})\n",
        entry.id, record.queue, record.original_id, record.failures, record.dequeue_count
    );
    if let Some(inserted) = record.inserted_at {
        out.push_str(&format!(
            "first sent:    {} ({} ago)\n",
            rfc3339(inserted),
            age(seconds_since(inserted))
        ));
    }
    out.push_str(&format!(
        "poisoned:      {} ({} ago)\n",
        rfc3339(record.poisoned_at),
        age(seconds_since(record.poisoned_at))
    ));
    let truncated = if record.last_error_truncated {
        " [truncated]"
    } else {
        ""
    };
    out.push_str(&format!(
        "reason:        {}{truncated}\n",
        record.last_error
    ));
    out.push_str(&format!(
        "original:      {size} bytes, {}, {place}\n{original}\n",
        encoding_name(record.encoding)
    ));
    // A program's stderr and a message body: escaped on a terminal.
    print!("{}", shown(&out));
    Ok(())
}
