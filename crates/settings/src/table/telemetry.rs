//! The settings of telemetry (standard OpenTelemetry variables where there is
//! one).

use crate::setting::Setting;

use super::{Text, text};

/// The stderr log filter.
pub const LOG_FILTER: Setting<Text> = Setting {
    key: "RUST_LOG",
    default: text("info"),
    default_doc: None,
    doc: "stderr log filter (`tracing` directives); spans below it are not exported",
    secret: false,
};

/// Text or JSON logs.
pub const LOG_FORMAT: Setting<Text> = Setting {
    key: "SPOT_WORKER_LOG_FORMAT",
    default: text("text"),
    default_doc: None,
    doc: "or `json` for structured log lines; text has ANSI colours only when stderr is a terminal and `NO_COLOR` is unset or empty",
    secret: false,
};

/// `service.name`.
pub const SERVICE_NAME: Setting<Text> = Setting {
    key: "OTEL_SERVICE_NAME",
    default: text("spot-worker"),
    default_doc: None,
    doc: "`service.name` of exported spans and metrics",
    secret: false,
};

/// OTLP/HTTP collector.
pub const OTLP_ENDPOINT: Setting<Option<Text>> = Setting {
    key: "OTEL_EXPORTER_OTLP_ENDPOINT",
    default: None,
    default_doc: None,
    doc: "OTLP/HTTP collector base URL (`/v1/traces`, `/v1/metrics` appended)",
    secret: false,
};

/// OTLP protocol; only one is supported.
pub const OTLP_PROTOCOL: Setting<Text> = Setting {
    key: "OTEL_EXPORTER_OTLP_PROTOCOL",
    default: text("http/protobuf"),
    default_doc: None,
    doc: "the only protocol supported",
    secret: false,
};

/// Upper bound of one export.
pub const OTLP_TIMEOUT: Setting<u64> = Setting {
    key: "OTEL_EXPORTER_OTLP_TIMEOUT",
    default: 10_000,
    default_doc: None,
    doc: "upper bound of one export request, in ms",
    secret: false,
};

/// How often metrics are pushed.
pub const METRIC_EXPORT_INTERVAL: Setting<u64> = Setting {
    key: "OTEL_METRIC_EXPORT_INTERVAL",
    default: 60_000,
    default_doc: None,
    doc: "how often metrics are pushed, in ms",
    secret: false,
};

/// Application Insights.
pub const APP_INSIGHTS: Setting<Option<Text>> = Setting {
    key: "APPLICATIONINSIGHTS_CONNECTION_STRING",
    default: None,
    default_doc: None,
    doc: "export to Application Insights (checked at start-up; the key is never logged)",
    secret: true,
};

/// No exporter at all.
pub const SDK_DISABLED: Setting<bool> = Setting {
    key: "OTEL_SDK_DISABLED",
    default: false,
    default_doc: None,
    doc: "`true`: logs only, no exporter",
    secret: false,
};
