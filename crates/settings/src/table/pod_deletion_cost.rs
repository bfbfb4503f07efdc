//! The settings of scale-in on AKS: this pod's deletion cost
//! (docs/deploying.md, "How a scale-in picks the pod").

use std::time::Duration;

use crate::setting::Setting;

use super::{Text, seconds, text};

/// Keep this pod's `controller.kubernetes.io/pod-deletion-cost`.
pub const POD_DELETION_COST: Setting<bool> = Setting {
    key: "SPOT_WORKER_POD_DELETION_COST",
    default: true,
    default_doc: None,
    doc: "in a pod (`SPOT_WORKER_POD_NAME` set): keep the pod's `controller.kubernetes.io/pod-deletion-cost` equal to its unsaved work (0 when idle), so a scale-in removes an idle pod before a busy one; needs the service-account token and a Role allowing `patch` on pods (deploy/kubernetes/pod-deletion-cost.yaml). Without `SPOT_WORKER_POD_NAME` nothing is done",
    secret: false,
};

/// How coarse the pod's deletion cost is, and how often it may change.
pub const POD_DELETION_COST_STEP: Setting<Duration> = Setting {
    key: "SPOT_WORKER_POD_DELETION_COST_STEP",
    default: seconds(60),
    default_doc: None,
    doc: "a busy pod's deletion cost is its unsaved seconds rounded down to a multiple of this, and changes at most once per this long while it stays busy (KEP-2255 advises against updating it on every small step); between idle and busy it changes at once",
    secret: false,
};

/// This pod's name.
pub const POD_NAME: Setting<Option<Text>> = Setting {
    key: "SPOT_WORKER_POD_NAME",
    default: None,
    default_doc: None,
    doc: "this pod's name (from the downward API, `metadata.name`): set only in a Kubernetes pod",
    secret: false,
};

/// This pod's namespace.
pub const POD_NAMESPACE: Setting<Option<Text>> = Setting {
    key: "SPOT_WORKER_POD_NAMESPACE",
    default: None,
    default_doc: None,
    doc: "this pod's namespace (from the downward API, `metadata.namespace`); required with `SPOT_WORKER_POD_NAME`",
    secret: false,
};

/// The Kubernetes API server's address, as the kubelet sets it.
pub const KUBERNETES_SERVICE_HOST: Setting<Option<Text>> = Setting {
    key: "KUBERNETES_SERVICE_HOST",
    default: None,
    default_doc: None,
    doc: "the API server's address (set in every pod by the kubelet); reached over HTTPS only",
    secret: false,
};

/// The Kubernetes API server's port, as the kubelet sets it.
pub const KUBERNETES_SERVICE_PORT: Setting<Option<u32>> = Setting {
    key: "KUBERNETES_SERVICE_PORT",
    default: None,
    default_doc: Some("443"),
    doc: "the API server's HTTPS port (set in every pod by the kubelet)",
    secret: false,
};

/// Where the pod's service-account token and the cluster's CA are.
pub const SERVICE_ACCOUNT_DIR: Setting<Text> = Setting {
    key: "SPOT_WORKER_SERVICE_ACCOUNT_DIR",
    default: text("/var/run/secrets/kubernetes.io/serviceaccount"),
    default_doc: None,
    doc: "the directory of the pod's service-account `token` (re-read for every call; never logged) and the cluster CA `ca.crt` the API server's certificate is checked against",
    secret: false,
};
