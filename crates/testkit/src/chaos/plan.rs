//! The seeded fault schedule: which faults hit the run, in which order,
//! after which pauses, on which worker slots. Every random parameter is
//! drawn here, up front, so a seed replays the same schedule.

use std::fmt;
use std::time::Duration;

use rand::Rng as _;
use rand::rngs::StdRng;
use rand::seq::SliceRandom as _;
use spot_worker_imds_emulator::{Fault, StatusCode};

use super::{Options, shared_reboot};

/// One planned fault. The random parameters are drawn when the schedule is
/// made, so a seed replays the same faults in the same order (their effect
/// still depends on timing: which jobs are in flight, for instance).
#[derive(Clone, Debug)]
pub(super) enum FaultKind {
    /// A Preempt notice (30 s) for one VM.
    Preempt,
    /// SIGKILL, no notice.
    Kill,
    /// A Freeze announced `notice` ahead, lasting `secs`: too short to drain.
    Freeze { notice: Duration, secs: i64 },
    /// Azurite stopped, then started again on the same data after `hold`.
    AzuriteOutage { hold: Duration },
    /// The VM's next `count` Scheduled Events GETs answered after `delay`.
    ImdsSlow { delay: Duration, count: u32 },
    /// The VM's next `count` Scheduled Events GETs fail with `fault`.
    ImdsFailing { fault: Fault, count: u32 },
    /// One Reboot listing this VM and the one in `peer`'s slot, posted to
    /// both, `notice` ahead; cancelled once both wait for it, or left to
    /// start at `NotBefore`.
    SharedReboot {
        peer: usize,
        notice: Duration,
        cancel: bool,
    },
}

impl FaultKind {
    pub(super) fn name(&self) -> &'static str {
        match self {
            FaultKind::Preempt => "preempt",
            FaultKind::Kill => "sigkill",
            FaultKind::Freeze { .. } => "freeze",
            FaultKind::AzuriteOutage { .. } => "azurite-outage",
            FaultKind::ImdsSlow { .. } => "imds-slow",
            FaultKind::ImdsFailing { .. } => "imds-failing",
            FaultKind::SharedReboot { cancel: true, .. } => "shared-reboot-cancelled",
            FaultKind::SharedReboot { cancel: false, .. } => "shared-reboot-started",
        }
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FaultKind::Preempt | FaultKind::Kill => f.write_str(self.name()),
            FaultKind::Freeze { notice, secs } => {
                write!(f, "freeze ({secs} s, notice {} s)", notice.as_secs())
            }
            FaultKind::AzuriteOutage { hold } => {
                write!(f, "azurite-outage ({} ms down)", hold.as_millis())
            }
            FaultKind::ImdsSlow { delay, count } => {
                write!(
                    f,
                    "imds-slow ({count} GETs delayed {} ms)",
                    delay.as_millis()
                )
            }
            FaultKind::ImdsFailing { fault, count } => {
                let what = match fault {
                    Fault::Status(status) => status.as_u16().to_string(),
                    Fault::Malformed => "malformed".to_owned(),
                    Fault::Drop => "dropped".to_owned(),
                    Fault::Delay(_) => "delayed".to_owned(),
                };
                write!(f, "imds-failing ({count} GETs {what})")
            }
            FaultKind::SharedReboot { notice, .. } => {
                write!(f, "{} (notice {} s)", self.name(), notice.as_secs())
            }
        }
    }
}

#[derive(Clone, Debug)]
pub(super) struct PlannedFault {
    /// Pause before it, after the previous fault.
    pub(super) gap: Duration,
    pub(super) kind: FaultKind,
    /// The worker slot it targets (ignored for the Azurite outage).
    pub(super) slot: usize,
}

/// The fault schedule: each kind as often as `mix` says, in a random order,
/// with random pauses and targets.
pub(super) fn plan_faults(rng: &mut StdRng, options: &Options) -> Vec<PlannedFault> {
    let mix = options.faults;
    let mut kinds: Vec<u8> = Vec::new();
    for (kind, count) in [
        (0, mix.preempt),
        (1, mix.kill),
        (2, mix.freeze),
        (3, mix.azurite_outage),
        (4, mix.imds_slow),
        (5, mix.imds_failing),
    ] {
        kinds.extend(std::iter::repeat_n(kind, count));
    }
    kinds.shuffle(rng);
    let mut plan: Vec<PlannedFault> = kinds
        .into_iter()
        .map(|kind| {
            let kind = match kind {
                0 => FaultKind::Preempt,
                1 => FaultKind::Kill,
                2 => FaultKind::Freeze {
                    notice: Duration::from_secs(rng.random_range(1..=3)),
                    secs: rng.random_range(2..=10),
                },
                3 => FaultKind::AzuriteOutage {
                    hold: Duration::from_millis(rng.random_range(1000..=3000)),
                },
                4 => FaultKind::ImdsSlow {
                    // Slow but inside the client's 2 s timeout.
                    delay: Duration::from_millis(rng.random_range(300..=1500)),
                    count: rng.random_range(2..=5),
                },
                _ => FaultKind::ImdsFailing {
                    fault: match rng.random_range(0..3) {
                        0 => Fault::Status(StatusCode::SERVICE_UNAVAILABLE),
                        1 => Fault::Malformed,
                        _ => Fault::Drop,
                    },
                    // At most five: with the watcher's backoff that is
                    // about 7 s blind, well inside a 30 s notice. (Much
                    // longer and a Preempt is seen only after NotBefore,
                    // which no poller survives.)
                    count: rng.random_range(2..=5),
                },
            };
            let (lo, hi) = options.gap;
            PlannedFault {
                gap: rng.random_range(lo..=hi),
                kind,
                slot: rng.random_range(0..options.workers),
            }
        })
        .collect();
    shared_reboot::plan(rng, options, &mut plan);
    plan
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng as _;

    use super::super::{FaultMix, SharedReboots};
    use super::*;

    fn options(workers: usize, shared_reboots: SharedReboots) -> Options {
        Options {
            seed: 0,
            workers,
            jobs: 0,
            malformed: 0,
            job_span: (1, 2),
            faults: FaultMix {
                preempt: 3,
                kill: 2,
                freeze: 1,
                azurite_outage: 1,
                imds_slow: 2,
                imds_failing: 2,
            },
            gap: (Duration::from_millis(100), Duration::from_millis(200)),
            concurrency: 1,
            visibility_timeout: Duration::from_secs(10),
            max_failures: 2,
            timeout: Duration::from_secs(1),
            binary: Default::default(),
            keep_logs: false,
            long_job: None,
            shared_reboots,
            lost_answers: 0.0,
            deadline_jobs: 0,
            regular_workers: 0,
            command_jobs: None,
        }
    }

    fn names(plan: &[PlannedFault]) -> Vec<String> {
        plan.iter().map(|fault| fault.kind.to_string()).collect()
    }

    #[test]
    fn a_seed_replays_the_same_schedule_with_each_kind_as_often_as_asked() {
        let reboots = SharedReboots {
            cancelled: 1,
            started: 2,
        };
        let options = options(3, reboots);
        let plan = plan_faults(&mut StdRng::seed_from_u64(7), &options);
        let again = plan_faults(&mut StdRng::seed_from_u64(7), &options);
        let other = plan_faults(&mut StdRng::seed_from_u64(8), &options);
        assert_eq!(names(&plan), names(&again));
        assert_ne!(names(&plan), names(&other));
        assert_eq!(plan.len(), options.faults.total() + 3);
        let count = |name: &str| plan.iter().filter(|f| f.kind.name() == name).count();
        for (name, expected) in [
            ("preempt", 3),
            ("sigkill", 2),
            ("freeze", 1),
            ("azurite-outage", 1),
            ("imds-slow", 2),
            ("imds-failing", 2),
            ("shared-reboot-cancelled", 1),
            ("shared-reboot-started", 2),
        ] {
            assert_eq!(count(name), expected, "{name}");
        }
        // The cancelled Reboot comes first, while plenty of work is queued.
        assert_eq!(plan[0].kind.name(), "shared-reboot-cancelled");
        for fault in &plan {
            assert!(fault.slot < 3);
            assert!((options.gap.0..=options.gap.1).contains(&fault.gap));
            if let FaultKind::SharedReboot { peer, .. } = fault.kind {
                assert_ne!(peer, fault.slot, "a shared Reboot needs two VMs");
            }
        }
    }

    #[test]
    fn one_worker_gets_no_shared_reboot() {
        let reboots = SharedReboots {
            cancelled: 1,
            started: 1,
        };
        let plan = plan_faults(&mut StdRng::seed_from_u64(1), &options(1, reboots));
        assert_eq!(plan.len(), 11);
        assert!(plan.iter().all(|f| f.slot == 0));
    }

    #[test]
    fn faults_print_their_parameters() {
        let table = [
            (FaultKind::Preempt, "preempt"),
            (FaultKind::Kill, "sigkill"),
            (
                FaultKind::Freeze {
                    notice: Duration::from_secs(2),
                    secs: 5,
                },
                "freeze (5 s, notice 2 s)",
            ),
            (
                FaultKind::AzuriteOutage {
                    hold: Duration::from_millis(1500),
                },
                "azurite-outage (1500 ms down)",
            ),
            (
                FaultKind::ImdsSlow {
                    delay: Duration::from_millis(300),
                    count: 2,
                },
                "imds-slow (2 GETs delayed 300 ms)",
            ),
            (
                FaultKind::ImdsFailing {
                    fault: Fault::Status(StatusCode::SERVICE_UNAVAILABLE),
                    count: 3,
                },
                "imds-failing (3 GETs 503)",
            ),
            (
                FaultKind::SharedReboot {
                    peer: 1,
                    notice: Duration::from_secs(12),
                    cancel: false,
                },
                "shared-reboot-started (notice 12 s)",
            ),
        ];
        for (kind, printed) in table {
            assert_eq!(kind.to_string(), printed);
        }
    }
}
