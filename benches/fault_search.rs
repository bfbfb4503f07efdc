//! The systematic fault search (issue 37) over many more seeds than
//! `cargo test` runs: every scenario family for `--seeds N` seeds from
//! `--first S`, in `--rounds R` rounds, each round run one seed after
//! another (the baseline) and then on two threads a core (as `cargo
//! test` runs it, `search_threads`); per family it reports the median
//! seeds per second of each, their ratio, how many seeds held and the
//! first that broke an invariant.
//!
//! `cargo bench --bench fault_search [-- --seeds N --first S --rounds R]`
//!
//! Under `cargo test --all-targets` (no `--bench` flag) it runs 20 seeds
//! per family, so it cannot rot unnoticed. Families that find a bug not
//! fixed yet are reported, not failed: the tests in
//! crates/storage/tests/it/fault_search.rs are the gate.

use std::time::Instant;

use anyhow::{Result, ensure};
use spot_worker_testkit::bench::{self, BenchArgs};
use spot_worker_testkit::fault_search::scenarios::Family;
use spot_worker_testkit::fault_search::{Failure, search_threads};

/// What one way of running a family's seeds measured.
#[derive(Default)]
struct Measured {
    /// Seeds per second of each round.
    rates: Vec<f64>,
    /// Seeds that held.
    held: u64,
    /// The lowest seed that broke an invariant.
    broken: Option<Box<Failure>>,
}

impl Measured {
    fn median(&self) -> f64 {
        let mut rates = self.rates.clone();
        rates.sort_by(f64::total_cmp);
        rates.get(rates.len() / 2).copied().unwrap_or(0.0)
    }
}

/// Runs `count` seeds from `first` on `threads` threads, every seed even
/// after one breaks (so that both ways run the same seeds).
fn round(family: Family, threads: usize, first: u64, count: u64, into: &mut Measured) {
    let started = Instant::now();
    let mut seed = first;
    let end = first + count;
    while seed < end {
        match family.search_on(threads, seed, end - seed) {
            Ok(_) => {
                into.held += end - seed;
                seed = end;
            }
            Err(failure) => {
                into.held += failure.seed - seed;
                seed = failure.seed + 1;
                if into
                    .broken
                    .as_ref()
                    .is_none_or(|known| failure.seed < known.seed)
                {
                    into.broken = Some(failure);
                }
            }
        }
    }
    into.rates
        .push(count as f64 / started.elapsed().as_secs_f64().max(1e-9));
}

fn main() -> Result<()> {
    let args = BenchArgs::from_env();
    let mut seeds: u64 = if args.benchmarking() { 2_000 } else { 20 };
    let mut first: u64 = 0;
    let mut rounds: u64 = if args.benchmarking() { 5 } else { 1 };
    args.each_flag(|flag, value| {
        match flag {
            "--seeds" => seeds = value.parse()?,
            "--first" => first = value.parse()?,
            "--rounds" => rounds = value.parse()?,
            _ => {}
        }
        Ok(())
    })?;
    ensure!(rounds >= 1, "--rounds must be at least 1");
    ensure!(seeds >= rounds, "--seeds must be at least --rounds");
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let threads = search_threads();
    println!(
        "fault search on {}, {cores} core(s); all: {threads} threads, as cargo test runs it",
        bench::machine()
    );
    println!(
        "{:<28} {:>8} {:>14} {:>14} {:>6}",
        "family", "held", "seeds/s (1)", "seeds/s (all)", "ratio"
    );
    let per_round = seeds / rounds;
    for family in Family::ALL {
        let (mut one, mut all) = (Measured::default(), Measured::default());
        for r in 0..rounds {
            let from = first + r * per_round;
            round(family, 1, from, per_round, &mut one);
            round(family, threads, from, per_round, &mut all);
        }
        ensure!(
            one.held == all.held,
            "{}: {} seeds held one at a time, {} on {threads} threads: a seed's outcome depends on its thread",
            family.name(),
            one.held,
            all.held
        );
        println!(
            "{:<28} {:>8} {:>14.1} {:>14.1} {:>6.2}",
            family.name(),
            format!("{}/{}", all.held, per_round * rounds),
            one.median(),
            all.median(),
            all.median() / one.median().max(1e-9)
        );
        if let Some(failure) = all.broken {
            println!("  first broken: seed {}: {}", failure.seed, failure.broken);
            println!(
                "  replay: SPOT_WORKER_FAULT_SEED={} cargo test -p spot-worker-storage --test it fault_search::{} -- --include-ignored",
                failure.seed,
                family.name()
            );
        }
    }
    Ok(())
}
