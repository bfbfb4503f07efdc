//! The settings of the fleet's bill (issue 39).

use std::time::Duration;

use crate::setting::Setting;

use super::seconds;

/// How long a gone worker's lifetime record is kept.
pub const LIFETIME_RETENTION: Setting<Duration> = Setting {
    key: "SPOT_WORKER_LIFETIME_RETENTION",
    default: seconds(30 * 86_400),
    default_doc: Some("`30d`"),
    doc: "how long a worker's lifetime record (the fleet's bill, `.spot-worker/fleet/workers/`) is kept after the worker last wrote it; each worker, once its record is first written, deletes at most 50 records older than this (see [How to read the bill](deploying.md#how-to-read-the-bill))",
    secret: false,
};
