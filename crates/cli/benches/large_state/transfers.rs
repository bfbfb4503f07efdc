//! Part 1: save and restore throughput of the runner's chunked path
//! against a raw SDK block upload and ranged download of the same file,
//! with the same concurrency, round by round on one Azurite.

use std::fs::File;
use std::io::{Read as _, Write as _};
use std::num::NonZero;
use std::os::unix::fs::FileExt as _;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use azure_core::Bytes;
use azure_core::credentials::Secret;
use azure_core::http::{RequestContent, Url};
use azure_storage_blob::BlobContainerClient;
use azure_storage_blob::models::{BlobClientDownloadOptions, BlockLookupList};
use futures_util::{StreamExt as _, TryStreamExt as _};
use spot_worker_azure::{AccountSasScope, AzureStorage, StorageConfig, sign_account_sas};
use spot_worker_storage::files::{CheckpointFiles, TransferLimits};
use spot_worker_storage::{CheckpointStore, JobCheckpoint};
use spot_worker_testkit::bench::bounded;
use spot_worker_testkit::procfs::{Process, cpu_time};
use spot_worker_testkit::{ACCOUNT_KEY, ACCOUNT_NAME, Azurite};

use crate::{Options, mb_per_s};

/// The raw baseline's block (and range) size.
const BLOCK: u64 = 4 << 20;
/// Bound on one transfer.
const PATIENCE: Duration = Duration::from_secs(600);

/// One timed transfer: how long, and Azurite's CPU meanwhile.
#[derive(Clone, Copy, Debug, Default)]
struct Timed {
    took: Duration,
    azurite_cpu: Duration,
}

/// One of a round's transfers.
type Pick = fn(&Round) -> Timed;

/// One round: the four transfers.
#[derive(Clone, Copy, Debug, Default)]
struct Round {
    save: Timed,
    upload: Timed,
    restore: Timed,
    download: Timed,
}

pub async fn run(options: &Options) -> Result<()> {
    let azurite = tokio::task::spawn_blocking(Azurite::start)
        .await?
        .context("azurite starts")?;
    let pid = azurite.processes().first().context("azurite runs")?.pid;
    let storage = AzureStorage::new(StorageConfig::from_connection_string(
        &azurite.connection_string(),
    )?)?;
    let store: Arc<dyn CheckpointStore> = Arc::new(storage.checkpoint_store("bench")?);
    store.prepare().await?;
    let raw = raw_container(&azurite)?;
    raw.create(None).await?;
    let scratch = tempfile::tempdir()?;
    let source = scratch.path().join("source");
    write_random(&source, options.size)?;
    let limits = TransferLimits::DEFAULT;

    let mut rounds = Vec::new();
    for round in 0..options.rounds {
        let target = scratch.path().join("restored");
        let mut done = Round::default();
        // Turns: the runner first in even rounds, the raw SDK in odd ones.
        for runner_first in [round % 2 == 0, round % 2 != 0] {
            let key = format!("bench-{round}");
            if runner_first {
                done.save = timed(pid, save(&store, &key, &source, limits)).await?;
                done.restore = timed(pid, restore(&store, &key, &target, limits)).await?;
            } else {
                let name = format!("raw-{round}");
                done.upload = timed(pid, upload(&raw, &name, &source, limits)).await?;
                std::fs::remove_file(&target).ok();
                done.download =
                    timed(pid, download(&raw, &name, &target, options.size, limits)).await?;
            }
            ensure!(
                same_bytes(&source, &target)?,
                "a restore differs from its source"
            );
            std::fs::remove_file(&target)?;
        }
        rounds.push(done);
    }
    report(options, &rounds);
    Ok(())
}

/// A client of the container `raw` on the same Azurite, with an account
/// SAS in its URL: the SDK as an application would use it.
fn raw_container(azurite: &Azurite) -> Result<BlobContainerClient> {
    let expiry = time::OffsetDateTime::now_utc() + time::Duration::hours(2);
    let scope = AccountSasScope::OPERATOR.allowing_http();
    let sas = sign_account_sas(ACCOUNT_NAME, &Secret::new(ACCOUNT_KEY), &scope, expiry)?;
    let mut url = Url::parse(&format!("{}/raw", azurite.blob_endpoint()))?;
    url.set_query(Some(sas.secret()));
    Ok(BlobContainerClient::new(url, None, None)?)
}

async fn timed(pid: u32, transfer: impl Future<Output = Result<()>>) -> Result<Timed> {
    let cpu = cpu_time(Process::Id(pid))?;
    let started = Instant::now();
    bounded("a transfer", PATIENCE, transfer).await?;
    Ok(Timed {
        took: started.elapsed(),
        azurite_cpu: cpu_time(Process::Id(pid))? - cpu,
    })
}

async fn save(
    store: &Arc<dyn CheckpointStore>,
    key: &str,
    source: &Path,
    limits: TransferLimits,
) -> Result<()> {
    let mut job = JobCheckpoint::load(Arc::clone(store), key)
        .await?
        .with_transfer_limits(limits);
    let stats = job.save_files(&CheckpointFiles::file(source)).await?;
    ensure!(
        stats.sent_bytes >= stats.bytes,
        "a fresh job sent {stats:?}"
    );
    Ok(())
}

async fn restore(
    store: &Arc<dyn CheckpointStore>,
    key: &str,
    target: &Path,
    limits: TransferLimits,
) -> Result<()> {
    let mut job = JobCheckpoint::load(Arc::clone(store), key)
        .await?
        .with_transfer_limits(limits);
    job.restore_files(&CheckpointFiles::file(target))
        .await?
        .context("nothing to restore")?;
    Ok(())
}

/// The baseline upload: the file read in 4 MiB blocks, each staged as it
/// is read, `limits.concurrency` at once, then the block list committed.
async fn upload(
    container: &BlobContainerClient,
    name: &str,
    source: &Path,
    limits: TransferLimits,
) -> Result<()> {
    let file = Arc::new(File::open(source)?);
    let size = file.metadata()?.len();
    let client = container.blob_client(name).block_blob_client();
    let ids: Vec<Vec<u8>> = (0..size.div_ceil(BLOCK))
        .map(|i| format!("{i:010}").into_bytes())
        .collect();
    futures_util::stream::iter(ids.iter().enumerate())
        .map(|(index, id)| {
            let (client, file) = (&client, Arc::clone(&file));
            async move {
                let offset = index as u64 * BLOCK;
                let len = BLOCK.min(size - offset);
                let bytes = tokio::task::spawn_blocking(move || {
                    let mut buffer = vec![0u8; len as usize];
                    file.read_exact_at(&mut buffer, offset).map(|()| buffer)
                })
                .await??;
                let content: RequestContent<Bytes, _> = Bytes::from(bytes).into();
                client.stage_block(id, len, content, None).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(limits.concurrency)
        .try_collect::<()>()
        .await?;
    let list = BlockLookupList {
        latest: Some(ids),
        ..Default::default()
    };
    client.commit_block_list(list.try_into()?, None).await?;
    Ok(())
}

/// The baseline download: 4 MiB ranges, `limits.concurrency` at once,
/// each written at its offset.
async fn download(
    container: &BlobContainerClient,
    name: &str,
    target: &Path,
    size: u64,
    limits: TransferLimits,
) -> Result<()> {
    let file = Arc::new(File::create(target)?);
    let blob = container.blob_client(name);
    futures_util::stream::iter(0..size.div_ceil(BLOCK))
        .map(|index| {
            let (blob, file) = (&blob, Arc::clone(&file));
            async move {
                let offset = index * BLOCK;
                let len = BLOCK.min(size - offset);
                let mut buffer = vec![0u8; len as usize];
                let options = BlobClientDownloadOptions {
                    range: Some((offset..offset + len).into()),
                    parallel: Some(NonZero::<usize>::MIN),
                    partition_size: NonZero::new(len as usize),
                    ..Default::default()
                };
                blob.download_into(&mut buffer, Some(options)).await?;
                tokio::task::spawn_blocking(move || file.write_all_at(&buffer, offset)).await??;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(limits.concurrency)
        .try_collect::<()>()
        .await
}

/// `size` bytes that no chunk of repeats (xorshift), so nothing is sent
/// once for two places.
fn write_random(path: &Path, size: u64) -> Result<()> {
    let mut out = std::io::BufWriter::with_capacity(8 << 20, File::create(path)?);
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut block = vec![0u8; 8 << 20];
    let mut left = size;
    while left > 0 {
        for word in block.chunks_exact_mut(8) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            word.copy_from_slice(&state.to_le_bytes());
        }
        let n = left.min(block.len() as u64) as usize;
        out.write_all(&block[..n])?;
        left -= n as u64;
    }
    out.flush()?;
    Ok(())
}

/// Whether two files hold the same bytes.
fn same_bytes(a: &Path, b: &Path) -> Result<bool> {
    let (mut a, mut b) = (File::open(a)?, File::open(b)?);
    if a.metadata()?.len() != b.metadata()?.len() {
        return Ok(false);
    }
    let (mut x, mut y) = (vec![0u8; 8 << 20], vec![0u8; 8 << 20]);
    loop {
        let n = a.read(&mut x)?;
        if n == 0 {
            return Ok(true);
        }
        b.read_exact(&mut y[..n])?;
        if x[..n] != y[..n] {
            return Ok(false);
        }
    }
}

fn report(options: &Options, rounds: &[Round]) {
    let size = options.size;
    let gib = size as f64 / (1u64 << 30) as f64;
    let rate = |pick: Pick| {
        let rates: Vec<f64> = rounds
            .iter()
            .map(|r| mb_per_s(size, pick(r).took.as_secs_f64()))
            .collect();
        let cpu: Vec<f64> = rounds
            .iter()
            .map(|r| pick(r).azurite_cpu.as_secs_f64() / gib)
            .collect();
        (median(rates), median(cpu))
    };
    let ratio = |mine: Pick, raw: Pick| {
        median(
            rounds
                .iter()
                .map(|r| raw(r).took.as_secs_f64() / mine(r).took.as_secs_f64())
                .collect(),
        )
    };
    println!(
        "\n1. save and restore, {} MiB, {} round(s), 8 transfers at once",
        size >> 20,
        rounds.len()
    );
    println!("| transfer | MB/s | ratio to raw SDK | Azurite CPU s per GiB |");
    println!("|---|---|---|---|");
    let rows: [(&str, Pick, Option<Pick>); 4] = [
        (
            "save: `JobCheckpoint::save_files` (chunks of ~1 MiB)",
            |r| r.save,
            Some(|r| r.upload),
        ),
        (
            "upload: raw SDK, 4 MiB blocks (baseline)",
            |r| r.upload,
            None,
        ),
        (
            "restore: `JobCheckpoint::restore_files`",
            |r| r.restore,
            Some(|r| r.download),
        ),
        (
            "download: raw SDK, 4 MiB ranges (baseline)",
            |r| r.download,
            None,
        ),
    ];
    for (label, pick, baseline) in rows {
        let (mb, cpu) = rate(pick);
        let ratio = baseline.map_or(1.0, |raw| ratio(pick, raw));
        println!("| {label} | {mb:.0} | {ratio:.2} | {cpu:.2} |");
    }
    let save_seconds = median(
        rounds
            .iter()
            .map(|r| r.save.took.as_secs_f64() / gib)
            .collect(),
    );
    println!(
        "   a save of new content costs {save_seconds:.2} s per GiB (median); goal ratio ≥ 0.9"
    );
}

/// The median of `values` (the lower middle one for an even count).
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values
        .get((values.len().saturating_sub(1)) / 2)
        .copied()
        .unwrap_or(0.0)
}
