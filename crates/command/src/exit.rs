//! How a program's end becomes a delivery's outcome: ordered rules, first
//! match wins (like Kubernetes' `podFailurePolicy` and AWS Batch's
//! `evaluateOnExit`).

use std::fmt;

/// How the program's process ended, as `wait` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitStatus {
    /// It exited with this status.
    Code(i32),
    /// A signal ended it.
    Signal(i32),
}

impl fmt::Display for ExitStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExitStatus::Code(code) => write!(f, "exited with status {code}"),
            ExitStatus::Signal(signal) => write!(f, "was killed by {}", signal_name(*signal)),
        }
    }
}

/// Why the runner ended the program itself, if it did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunnerEnded {
    /// The runner did not signal it: it ended on its own (or someone else
    /// killed it).
    No,
    /// A notice or a shutdown: the job is handed back, never counted.
    ForNotice,
    /// It ran longer than `--timeout`.
    ForTimeout,
    /// Its checkpoint file broke a rule (over the size limit): the reason.
    ForFault(String),
}

/// What becomes of the delivery.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Done: store the result, complete the job, delete the message.
    Done,
    /// Handed back uncounted (the consumer releases the message).
    Released,
    /// Poisoned at once: retrying cannot help.
    Permanent(String),
    /// A counted failure: retried, poisoned after `max_failures`.
    Failed(String),
}

/// The ordered exit rules of docs/command.md:
///
/// 1. ended by the runner for a notice or shutdown: released, never
///    counted, whatever the status;
/// 2. ended by the runner for `--timeout` or a checkpoint-file fault: a
///    counted failure;
/// 3. status 0: done;
/// 4. a status in `permanent_codes`: poisoned at once;
/// 5. any other status, or a signal the runner did not send (an
///    out-of-memory kill): a counted failure.
pub fn verdict(status: ExitStatus, ended: &RunnerEnded, permanent_codes: &[i32]) -> Verdict {
    match (ended, status) {
        (RunnerEnded::ForNotice, _) => Verdict::Released,
        (RunnerEnded::ForTimeout, _) => {
            Verdict::Failed("the program ran longer than --timeout and was killed".to_owned())
        }
        (RunnerEnded::ForFault(reason), _) => Verdict::Failed(reason.clone()),
        (RunnerEnded::No, ExitStatus::Code(0)) => Verdict::Done,
        (RunnerEnded::No, ExitStatus::Code(code)) if permanent_codes.contains(&code) => {
            Verdict::Permanent(format!(
                "the program {status}, a permanent failure (--permanent-exit-codes)"
            ))
        }
        (RunnerEnded::No, ExitStatus::Code(_)) => Verdict::Failed(format!("the program {status}")),
        (RunnerEnded::No, ExitStatus::Signal(signal)) => {
            let hint = if signal == libc::SIGKILL {
                " (not sent by the runner: out of memory, or killed from outside)"
            } else {
                " (not sent by the runner)"
            };
            Verdict::Failed(format!("the program {status}{hint}"))
        }
    }
}

/// `SIGTERM` for 15, and so on; the number for others.
pub fn signal_name(signal: i32) -> String {
    SIGNALS
        .iter()
        .find(|(_, number)| *number == signal)
        .map_or_else(
            || format!("signal {signal}"),
            |(name, _)| (*name).to_owned(),
        )
}

/// The signals `--stop-signal` may name.
const SIGNALS: [(&str, i32); 9] = [
    ("SIGTERM", libc::SIGTERM),
    ("SIGINT", libc::SIGINT),
    ("SIGHUP", libc::SIGHUP),
    ("SIGQUIT", libc::SIGQUIT),
    ("SIGUSR1", libc::SIGUSR1),
    ("SIGUSR2", libc::SIGUSR2),
    ("SIGKILL", libc::SIGKILL),
    ("SIGSEGV", libc::SIGSEGV),
    ("SIGABRT", libc::SIGABRT),
];

/// Parses `SIGTERM`, `TERM` or `15` (case-insensitive).
pub fn parse_signal(text: &str) -> Result<i32, String> {
    let text = text.trim();
    if let Ok(number) = text.parse::<i32>() {
        return if (1..=64).contains(&number) {
            Ok(number)
        } else {
            Err(format!("{number} is not a signal number (1 to 64)"))
        };
    }
    let upper = text.to_ascii_uppercase();
    let name = if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    };
    SIGNALS
        .iter()
        .find(|(known, _)| *known == name)
        .map(|(_, number)| *number)
        .ok_or_else(|| {
            format!("{text:?} is not a signal (SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2 or a number)")
        })
}

/// Parses `65` or `65,75,78` (exit statuses 1 to 255).
pub fn parse_exit_codes(text: &str) -> Result<Vec<i32>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .map(|part| match part.parse::<i32>() {
            Ok(code) if (1..=255).contains(&code) => Ok(code),
            _ => Err(format!("{part:?} is not an exit status from 1 to 255")),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_rules_in_order() {
        use ExitStatus::{Code, Signal};
        let fault = RunnerEnded::ForFault("checkpoint too big".to_owned());
        let failed = |text: &str| Verdict::Failed(text.to_owned());
        // (status, ended by the runner, expected)
        let rows: Vec<(ExitStatus, RunnerEnded, Verdict)> = vec![
            (Code(0), RunnerEnded::No, Verdict::Done),
            (
                Code(65),
                RunnerEnded::No,
                Verdict::Permanent(
                    "the program exited with status 65, a permanent failure (--permanent-exit-codes)"
                        .to_owned(),
                ),
            ),
            (Code(1), RunnerEnded::No, failed("the program exited with status 1")),
            (Code(143), RunnerEnded::No, failed("the program exited with status 143")),
            (
                Signal(libc::SIGKILL),
                RunnerEnded::No,
                failed("the program was killed by SIGKILL (not sent by the runner: out of memory, or killed from outside)"),
            ),
            (
                Signal(libc::SIGSEGV),
                RunnerEnded::No,
                failed("the program was killed by SIGSEGV (not sent by the runner)"),
            ),
            // A notice wins over everything, even a clean exit or a
            // permanent status: the job is handed back uncounted.
            (Code(0), RunnerEnded::ForNotice, Verdict::Released),
            (Code(65), RunnerEnded::ForNotice, Verdict::Released),
            (Code(1), RunnerEnded::ForNotice, Verdict::Released),
            (Signal(libc::SIGKILL), RunnerEnded::ForNotice, Verdict::Released),
            (Signal(libc::SIGTERM), RunnerEnded::ForNotice, Verdict::Released),
            // The runner's own kills for a fault are counted, whatever the
            // status the program managed to return.
            (
                Signal(libc::SIGKILL),
                RunnerEnded::ForTimeout,
                failed("the program ran longer than --timeout and was killed"),
            ),
            (
                Code(0),
                RunnerEnded::ForTimeout,
                failed("the program ran longer than --timeout and was killed"),
            ),
            (Code(0), fault.clone(), failed("checkpoint too big")),
            (Code(65), fault, failed("checkpoint too big")),
        ];
        for (status, ended, expected) in rows {
            assert_eq!(
                verdict(status, &ended, &[65]),
                expected,
                "{status:?} {ended:?}"
            );
        }
        // Without permanent codes, 65 is an ordinary failure.
        assert_eq!(
            verdict(Code(65), &RunnerEnded::No, &[]),
            failed("the program exited with status 65")
        );
    }

    #[test]
    fn signals_and_codes_parse() {
        assert_eq!(parse_signal("SIGTERM"), Ok(libc::SIGTERM));
        assert_eq!(parse_signal("int"), Ok(libc::SIGINT));
        assert_eq!(parse_signal(" 10 "), Ok(10));
        assert!(parse_signal("SIGFOO").unwrap_err().contains("not a signal"));
        assert!(parse_signal("0").is_err());
        assert_eq!(parse_exit_codes("65"), Ok(vec![65]));
        assert_eq!(parse_exit_codes("65, 78"), Ok(vec![65, 78]));
        assert_eq!(parse_exit_codes(""), Ok(vec![]));
        assert!(parse_exit_codes("0").is_err());
        assert!(parse_exit_codes("x").is_err());
        assert_eq!(signal_name(libc::SIGKILL), "SIGKILL");
        assert_eq!(signal_name(40), "signal 40");
    }
}
