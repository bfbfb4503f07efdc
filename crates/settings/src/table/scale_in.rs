//! The settings of scale-in (issue 39).

use std::time::Duration;

use crate::setting::Setting;

use super::seconds;

/// Keep this VM protected from scale-in while it holds work.
pub const SCALE_IN_PROTECTION: Setting<bool> = Setting {
    key: "SPOT_WORKER_SCALE_IN_PROTECTION",
    default: false,
    default_doc: None,
    doc: "on a VM of a scale set: protect this VM from scale-in (`protectFromScaleIn`, through Azure Resource Manager with the worker's managed identity) from its first message of a busy period until it has been idle for `SPOT_WORKER_SCALE_IN_IDLE_GRACE`, and release it on exit; needs the custom role of the template's `scaleInProtection` (see [Expected cost shape](deploying.md#expected-cost-shape))",
    secret: false,
};

/// How long a worker must be idle before its VM may be scaled in.
pub const SCALE_IN_IDLE_GRACE: Setting<Duration> = Setting {
    key: "SPOT_WORKER_SCALE_IN_IDLE_GRACE",
    default: seconds(120),
    default_doc: None,
    doc: "with `SPOT_WORKER_SCALE_IN_PROTECTION`: how long the worker holds nothing before its VM's protection is released (a gap between two messages is not idleness: one protect and one release per busy period)",
    secret: false,
};
