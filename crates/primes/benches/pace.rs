//! How long the `primes` job's work takes, by where its range lies: what the
//! docs quote when they size jobs (docs/deploying.md's walkthrough) or say
//! how long a chunk takes (docs/benchmarks.md, the handler's
//! `DEFAULT_CHUNK_SIZE`).
//!
//! `cargo bench -p spot-worker-primes --bench pace [-- --runs N --job-size N]`
//!
//! Release build, one thread, nothing else: the sieve alone, as one of the
//! handler's blocking-pool tasks runs it. Each figure is the time the
//! thread spent on a CPU (`CLOCK_THREAD_CPUTIME_ID`), with the wall time
//! beside it: on a machine shared with other work only the
//! first is the job's own. It times
//!
//! 1. one default chunk (`DEFAULT_CHUNK_SIZE`, 10^6 numbers) at several
//!    offsets up to `MAX_END` (a run of 16 chunks, divided by 16, since a
//!    job finds its base primes once), the median of N runs each, with its
//!    ratio to the chunk at offset 0 measured in the same run (a sieve's
//!    segments cost more as the base primes below √end grow);
//! 2. whole jobs as a walkthrough enqueues them: the first and the last of
//!    20 back-to-back ranges of a given size (`--job-size N`, repeatable;
//!    by default 2·10^8, the walkthrough's old size, and 5·10^10, its size
//!    now, whose 20 jobs end at `MAX_END`: docs/deploying.md, step 2), each
//!    counted once.
//!
//! Under `cargo test` (no `--bench` flag) it runs a smoke version (two
//! offsets, one small job; half a second in a debug build), so the bench
//! cannot rot unnoticed.

use std::hint::black_box;
use std::time::{Duration, Instant};

use spot_worker_primes::{DEFAULT_CHUNK_SIZE, MAX_END, count_primes};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let bench = args.iter().any(|a| a == "--bench");
    let runs = args
        .windows(2)
        .find(|pair| pair[0] == "--runs")
        .and_then(|pair| pair[1].parse::<usize>().ok())
        .unwrap_or(if bench { 9 } else { 1 });
    let chunk = DEFAULT_CHUNK_SIZE.get();
    let offsets: &[u64] = if bench {
        &[
            0,
            2_000_000_000,
            10_000_000_000,
            100_000_000_000,
            500_000_000_000,
            MAX_END,
        ]
    } else {
        &[0, 1_000_000]
    };
    // A job finds its base primes once, then counts chunk after chunk: a
    // run of CHUNKS chunks, divided, puts the base primes' share (about 1 ms
    // for the last offset) where the job has it.
    const CHUNKS: u64 = 16;
    println!(
        "one chunk of {chunk} numbers (a run of {CHUNKS}, divided), on a CPU (wall), median of {runs} runs:"
    );
    println!("| offset | median | min | max | × offset 0 |");
    println!("|---|---|---|---|---|");
    let mut baseline = None;
    for &offset in offsets {
        let offset = offset.min(MAX_END - CHUNKS * chunk);
        let times: Vec<Timing> = timed(runs, || count_primes(offset, offset + CHUNKS * chunk))
            .into_iter()
            .map(|t| Timing {
                on_cpu: t.on_cpu / CHUNKS as u32,
                wall: t.wall / CHUNKS as u32,
            })
            .collect();
        let median = median(&times);
        let base = *baseline.get_or_insert(median);
        println!(
            "| {offset} | {} ({}) | {} | {} | {:.2} |",
            ms(median.on_cpu),
            ms(median.wall),
            ms(times[0].on_cpu),
            ms(times[times.len() - 1].on_cpu),
            median.on_cpu.as_secs_f64() / base.on_cpu.as_secs_f64()
        );
    }
    let mut sizes: Vec<u64> = args
        .windows(2)
        .filter(|pair| pair[0] == "--job-size")
        .filter_map(|pair| pair[1].replace('_', "").parse().ok())
        .collect();
    if sizes.is_empty() {
        sizes = if bench {
            vec![200_000_000, MAX_END / 20]
        } else {
            vec![1_000_000]
        };
    }
    println!();
    println!("jobs of 20 back-to-back ranges [i·size, (i+1)·size), on a CPU (wall), one run each:");
    println!("| job size | first job (from 0) | last job (the 20th) |");
    println!("|---|---|---|");
    for size in sizes {
        let last = 19 * size;
        let first = median(&timed(1, || count_primes(0, size)));
        let twentieth = median(&timed(1, || count_primes(last, last + size)));
        println!("| {size} | {} | {} |", seconds(first), seconds(twentieth));
    }
}

/// One timing: the wall time, and the time this thread was on a CPU (what
/// a machine shared with other work does not inflate).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Timing {
    on_cpu: Duration,
    wall: Duration,
}

/// `runs` timings of `work`, sorted by their time on a CPU.
fn timed(runs: usize, work: impl Fn() -> u64) -> Vec<Timing> {
    let mut times: Vec<Timing> = (0..runs.max(1))
        .map(|_| {
            let (started, cpu) = (Instant::now(), on_cpu());
            black_box(work());
            Timing {
                on_cpu: on_cpu().saturating_sub(cpu),
                wall: started.elapsed(),
            }
        })
        .collect();
    times.sort();
    times
}

/// This thread's time on a CPU so far (`CLOCK_THREAD_CPUTIME_ID`, to the
/// nanosecond; `/proc`'s figures move in scheduler ticks).
fn on_cpu() -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the one we pass.
    let ok = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) } == 0;
    if !ok {
        return Duration::ZERO;
    }
    Duration::new(
        u64::try_from(now.tv_sec).unwrap_or(0),
        u32::try_from(now.tv_nsec).unwrap_or(0),
    )
}

fn median(sorted: &[Timing]) -> Timing {
    sorted[sorted.len() / 2]
}

fn seconds(timing: Timing) -> String {
    format!(
        "{:.2} s ({:.2} s)",
        timing.on_cpu.as_secs_f64(),
        timing.wall.as_secs_f64()
    )
}

fn ms(duration: Duration) -> String {
    format!("{:.2} ms", duration.as_secs_f64() * 1e3)
}
