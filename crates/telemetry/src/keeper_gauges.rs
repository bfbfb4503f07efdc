//! Where the worker's keepers of its scale-in hints stand (issue 39), as
//! gauges observed at every export, so that a condition that will not
//! clear by itself is a metric and not only a log line:
//!
//! - `spot_worker.scale_in.protection`: 1 for the state this VM's
//!   protection from scale-in is in, 0 for the others
//!   ([`ProtectionState`]); `release_stuck` is a VM that should be released
//!   but whose release keeps failing, which every scale-in would keep.
//! - `spot_worker.pod_deletion_cost.failing`: 1 while writes of the pod's
//!   deletion cost keep failing (a 403 for ever: the Role is missing),
//!   else 0.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Meter, ObservableGauge};

use crate::{attributes, names};

/// The state of this VM's protection from scale-in, the `state` attribute
/// of `spot_worker.scale_in.protection`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProtectionState {
    /// No call has succeeded yet (or the worker keeps no protection).
    Unknown,
    /// Protected: the worker holds work (or did within its idle grace).
    Protected,
    /// Not protected: a scale-in may remove this VM.
    Unprotected,
    /// Should be released, but the release keeps failing: a scale-in keeps
    /// this VM until a retry succeeds.
    ReleaseStuck,
}

impl ProtectionState {
    /// Every state, in the order of their codes.
    pub const ALL: [ProtectionState; 4] = [
        ProtectionState::Unknown,
        ProtectionState::Protected,
        ProtectionState::Unprotected,
        ProtectionState::ReleaseStuck,
    ];

    /// The `state` attribute value.
    pub fn as_str(self) -> &'static str {
        match self {
            ProtectionState::Unknown => "unknown",
            ProtectionState::Protected => "protected",
            ProtectionState::Unprotected => "unprotected",
            ProtectionState::ReleaseStuck => "release_stuck",
        }
    }

    fn code(self) -> u8 {
        match self {
            ProtectionState::Unknown => 0,
            ProtectionState::Protected => 1,
            ProtectionState::Unprotected => 2,
            ProtectionState::ReleaseStuck => 3,
        }
    }
}

/// The two gauges and the values they report.
pub(crate) struct KeeperGauges {
    protection: Arc<AtomicU8>,
    cost_failing: Arc<AtomicBool>,
    _protection_gauge: ObservableGauge<i64>,
    _cost_failing_gauge: ObservableGauge<i64>,
}

impl KeeperGauges {
    pub(crate) fn new(meter: &Meter) -> Self {
        let protection = Arc::new(AtomicU8::new(ProtectionState::Unknown.code()));
        let cost_failing = Arc::new(AtomicBool::new(false));
        let (state, failing) = (Arc::clone(&protection), Arc::clone(&cost_failing));
        KeeperGauges {
            // Every state is always reported (0 or 1), so a dashboard sees a
            // stuck release end as well as begin.
            _protection_gauge: meter
                .i64_observable_gauge(names::SCALE_IN_PROTECTION)
                .with_unit("1")
                .with_description(
                    "1 for the state of this VM's protection from scale-in (unknown, protected, \
                     unprotected, release_stuck: should be released but the release keeps \
                     failing), 0 for the others.",
                )
                .with_callback(move |observer| {
                    let current = state.load(Ordering::Relaxed);
                    for s in ProtectionState::ALL {
                        observer.observe(
                            i64::from(s.code() == current),
                            &[KeyValue::new(attributes::STATE, s.as_str())],
                        );
                    }
                })
                .build(),
            _cost_failing_gauge: meter
                .i64_observable_gauge(names::POD_DELETION_COST_FAILING)
                .with_unit("1")
                .with_description(
                    "1 while writes of the pod's controller.kubernetes.io/pod-deletion-cost keep \
                     failing (retried with a backoff), else 0.",
                )
                .with_callback(move |observer| {
                    observer.observe(i64::from(failing.load(Ordering::Relaxed)), &[]);
                })
                .build(),
            protection,
            cost_failing,
        }
    }

    pub(crate) fn set_protection(&self, state: ProtectionState) {
        self.protection.store(state.code(), Ordering::Relaxed);
    }

    pub(crate) fn protection(&self) -> ProtectionState {
        let current = self.protection.load(Ordering::Relaxed);
        ProtectionState::ALL
            .into_iter()
            .find(|s| s.code() == current)
            .unwrap_or(ProtectionState::Unknown)
    }

    pub(crate) fn set_cost_failing(&self, failing: bool) {
        self.cost_failing.store(failing, Ordering::Relaxed);
    }

    pub(crate) fn cost_failing(&self) -> bool {
        self.cost_failing.load(Ordering::Relaxed)
    }
}
