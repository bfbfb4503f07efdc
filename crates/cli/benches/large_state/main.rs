//! Large checkpoints on a real Azurite, each figure set against a
//! baseline measured in the same run.
//!
//! `cargo bench -p spot-worker-cli --bench large_state [-- --size-mib N --rounds N --drains N]`
//!
//! Under `cargo test` (no `--bench` flag) it runs a smoke version with
//! small files (16 MiB), and asserts what must hold whatever the machine:
//! restores equal their source, an unchanged save sends no chunk, a
//! changed region about itself, the runner's peak memory stays under
//! 64 MB, every drain's program gets its stop signal.
//!
//! 1. **Save and restore throughput** ([`transfers`]): a file of
//!    `--size-mib` random bytes saved as a job's checkpoint through
//!    `JobCheckpoint::save_files` (what `spot-worker run` calls: content-
//!    defined chunks, 8 uploads at once, 16 MiB in flight) and restored by
//!    `restore_files`, against a raw SDK block upload of the same file
//!    (`stage_block` of 4 MiB blocks, 8 at once, `commit_block_list`) and
//!    a raw ranged download (4 MiB, 8 at once). The two take turns, round
//!    by round; Azurite's CPU per GiB comes from `/proc`.
//! 2. **The runner** ([`binary`]): the real `spot-worker run` (the release
//!    build under `cargo bench`) running `tests/large/train.py` on a
//!    checkpoint file of `--size-mib`: its peak RSS (VmHWM) over a first
//!    save, a save of the file rewritten unchanged, one with 1 % changed,
//!    and on a second runner, the restore; the bytes each save sent
//!    (counted at the store: chunk blobs that appeared) and took (the
//!    runner's log).
//! 3. **Drain → stop signal** ([`binary`]): `--drains` times each, a runner
//!    saving a 64 MiB checkpoint gets SIGTERM as a save starts, with the
//!    blob service stalled (SIGSTOP) or answering; the program's stop
//!    signal is timed from the SIGTERM, beside an idle process signalled
//!    at the same moment (what the machine takes to deliver a signal).

#[path = "../../tests/it/support/mod.rs"]
mod support;

mod binary;
mod transfers;

use anyhow::{Result, ensure};
use spot_worker_testkit::bench::{self, BenchArgs};

/// What one run measures.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// The checkpoint file of parts 1 and 2.
    pub size: u64,
    /// Rounds of part 1.
    pub rounds: usize,
    /// Drains of part 3, with storage stalled and answering each.
    pub drains: usize,
    /// The checkpoint file of part 3.
    pub drain_size: u64,
    /// Whether this is the smoke run (`cargo test`): assert, don't tabulate.
    pub smoke: bool,
}

fn main() -> Result<()> {
    let args = BenchArgs::from_env();
    let mut options = if args.benchmarking() {
        Options {
            size: 1 << 30,
            rounds: 3,
            drains: 5,
            drain_size: 64 << 20,
            smoke: false,
        }
    } else {
        Options {
            size: 16 << 20,
            rounds: 1,
            drains: 1,
            drain_size: 8 << 20,
            smoke: true,
        }
    };
    args.each_flag(|flag, value| {
        match flag {
            "--size-mib" => options.size = value.parse::<u64>()? << 20,
            "--rounds" => options.rounds = value.parse()?,
            "--drains" => options.drains = value.parse()?,
            _ => {}
        }
        Ok(())
    })?;
    ensure!(options.size >= 8 << 20 && options.rounds >= 1 && options.drains >= 1);
    bench::init_logs();
    bench::runtime()?.block_on(async {
        println!(
            "large-state benchmark on {}, {} MiB, {} round(s), {} drain(s) each way",
            bench::machine(),
            options.size >> 20,
            options.rounds,
            options.drains
        );
        transfers::run(&options).await?;
        binary::run(&options).await
    })
}

/// Megabytes (10^6 bytes) per second.
pub fn mb_per_s(bytes: u64, seconds: f64) -> f64 {
    bytes as f64 / 1e6 / seconds
}
