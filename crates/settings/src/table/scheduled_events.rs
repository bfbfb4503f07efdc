//! The settings of Scheduled Events.

use std::time::Duration;

use crate::setting::Setting;

use super::{Text, seconds, text};

/// Watch Scheduled Events at all.
pub const IMDS: Setting<bool> = Setting {
    key: "SPOT_WORKER_IMDS",
    default: true,
    default_doc: None,
    doc: "`off` only on machines that are not Azure VMs",
    secret: false,
};

/// The IMDS base URL.
pub const IMDS_ENDPOINT: Setting<Text> = Setting {
    key: "SPOT_WORKER_IMDS_ENDPOINT",
    default: text("http://169.254.169.254"),
    default_doc: None,
    doc: "IMDS (an emulator's URL for rehearsals)",
    secret: false,
};

/// The Scheduled Events poll interval.
pub const IMDS_POLL_INTERVAL: Setting<Duration> = Setting {
    key: "SPOT_WORKER_IMDS_POLL_INTERVAL",
    default: seconds(1),
    default_doc: None,
    doc: "how often Scheduled Events are polled; retries after a failure wait at most this long",
    secret: false,
};

/// This VM's name in `Resources`.
pub const VM_NAME: Setting<Option<Text>> = Setting {
    key: "SPOT_WORKER_VM_NAME",
    default: None,
    default_doc: Some("from instance metadata"),
    doc: "this VM's name in `Resources`; the warmup gate does not wait for instance metadata then, and a name it contradicts when it answers is refused (the worker drains and stops with an error)",
    secret: false,
};
