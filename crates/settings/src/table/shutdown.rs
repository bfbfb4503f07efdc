//! The settings of shutdown.

use std::time::Duration;

use crate::setting::Setting;

use super::{Text, seconds};

/// The longest drain after any notice.
pub const DRAIN_BUDGET: Setting<Duration> = Setting {
    key: "SPOT_WORKER_DRAIN_BUDGET",
    default: seconds(25),
    default_doc: None,
    doc: "longest drain after any notice; the longest drain (this, or margin + floor) plus 2 s to exit must fit the unit's `TimeoutStopSec=28s`, so at most `26s`",
    secret: false,
};

/// Release running handlers this long before the hard deadline.
pub const RELEASE_MARGIN: Setting<Duration> = Setting {
    key: "SPOT_WORKER_RELEASE_MARGIN",
    default: seconds(3),
    default_doc: None,
    doc: "release running handlers this long before the hard deadline",
    secret: false,
};

/// The time the release always gets.
pub const RELEASE_FLOOR: Setting<Duration> = Setting {
    key: "SPOT_WORKER_RELEASE_FLOOR",
    default: seconds(2),
    default_doc: None,
    doc: "time the release always gets, however late the notice (at most the margin)",
    secret: false,
};

/// Approve the triggering event once drained.
pub const APPROVE_EVENTS: Setting<bool> = Setting {
    key: "SPOT_WORKER_APPROVE_EVENTS",
    default: true,
    default_doc: None,
    doc: "approve the triggering event once drained, if it lists this VM alone",
    secret: false,
};

/// Also approve events listing other VMs.
pub const APPROVE_SHARED_EVENTS: Setting<bool> = Setting {
    key: "SPOT_WORKER_APPROVE_SHARED_EVENTS",
    default: false,
    default_doc: None,
    doc: "also approve events listing other VMs (starts them for those VMs too)",
    secret: false,
};

/// Where the workers on one VM meet before approving.
pub const RUNTIME_DIR: Setting<Option<Text>> = Setting {
    key: "SPOT_WORKER_RUNTIME_DIR",
    default: None,
    default_doc: Some("`/run/spot-worker`, else `$XDG_RUNTIME_DIR/spot-worker`"),
    doc: "where the workers on one VM meet (a locked file each): an event is approved only once every one has drained; without a usable directory, only at its deadline (see [Several workers on one VM](operating.md#several-workers-on-one-vm))",
    secret: false,
};

/// End the process if the drain overruns.
pub const WATCHDOG: Setting<bool> = Setting {
    key: "SPOT_WORKER_WATCHDOG",
    default: true,
    default_doc: None,
    doc: "end the process if the drain overruns, or if it is still up 1 s after the worker stopped",
    secret: false,
};
