//! Numbers for people.

use std::time::Duration;

use spot_worker_primes::PrimesJob;

use super::Saved;

/// `part` as a percentage of `whole` (100 for an empty whole).
pub(super) fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        100.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// Milliseconds, with a decimal below 10 ms (a drain can take less than one).
pub(super) fn millis(duration: Duration) -> String {
    if duration < Duration::from_millis(10) {
        format!("{:.1} ms", duration.as_secs_f64() * 1000.0)
    } else {
        format!("{} ms", duration.as_millis())
    }
}

/// `1234567` as `1,234,567`.
pub(super) fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// What a checkpoint says, for people.
pub(super) fn describe(job: &PrimesJob, saved: Saved) -> String {
    let size = job.end - job.start;
    match saved {
        Saved::Nothing => "no checkpoint: not started".to_owned(),
        Saved::InProgress { cursor, primes } => format!(
            "checkpointed at {:.1} % (cursor {}, {} primes so far)",
            percent(cursor - job.start, size),
            grouped(cursor),
            grouped(primes)
        ),
        Saved::Completed { primes } => format!("completed: {} primes", grouped(primes)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_grouped_by_thousands() {
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(1_000), "1,000");
        assert_eq!(grouped(2_000_000_000), "2,000,000,000");
    }
}
