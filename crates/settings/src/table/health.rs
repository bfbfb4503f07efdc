//! The settings of health and the warmup gate.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use crate::setting::Setting;

/// Where the health endpoints listen.
pub const HEALTH_ADDR: Setting<SocketAddr> = Setting {
    key: "SPOT_WORKER_HEALTH_ADDR",
    default: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 8080),
    default_doc: None,
    doc: "`/healthz` and `/readyz`",
    secret: false,
};

/// Give up if the gate stays closed this long.
pub const GATE_TIMEOUT: Setting<Option<Duration>> = Setting {
    key: "SPOT_WORKER_GATE_TIMEOUT",
    default: None,
    default_doc: None,
    doc: "exit with an error if the gate stays closed this long (unset: wait as long as it takes)",
    secret: false,
};
