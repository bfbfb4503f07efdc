//! A small, careful HTTP client for the IMDS endpoints spot-worker needs.
//!
//! IMDS is a link-local service the VM trusts, so the client is strict about
//! how it reaches it: it ignores proxy settings (a proxy would see, or answer
//! for, the metadata service), never follows redirects (IMDS does not send
//! them), bounds every response, keeps one connection alive across polls and
//! never exceeds the 5 requests per second IMDS allows.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use reqwest::{Method, StatusCode, Url};
use serde::Deserialize;
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::error::{ImdsError, excerpt, parse_json};
use crate::model::{EventId, EventStatus, ScheduledEvent, ScheduledEvents};

/// The link-local address IMDS answers on in every Azure VM.
pub const DEFAULT_ENDPOINT: &str = "http://169.254.169.254";
/// The Scheduled Events api-version this client speaks.
pub const SCHEDULED_EVENTS_API_VERSION: &str = "2020-07-01";
/// The instance metadata api-version used to learn the VM's name.
pub const INSTANCE_API_VERSION: &str = "2021-02-01";
/// IMDS throttles above 5 requests per second. Requests are spaced a little
/// wider than 200 ms so that network jitter cannot squeeze six into one
/// second.
pub const MIN_REQUEST_SPACING: Duration = Duration::from_millis(250);

/// How to reach IMDS.
#[derive(Debug, Clone)]
pub struct ImdsConfig {
    /// Base URL, `http://169.254.169.254` on Azure.
    pub endpoint: String,
    /// Timeout for each request once Scheduled Events has answered once.
    pub request_timeout: Duration,
    /// Timeout for Scheduled Events requests until the first success: the
    /// first call enables the service for the VM and can take up to two
    /// minutes.
    pub first_call_timeout: Duration,
    /// Timeout for establishing the TCP connection.
    pub connect_timeout: Duration,
    /// Responses larger than this are refused.
    pub max_response_bytes: usize,
    /// Minimum time between two requests from this client; never below
    /// [`MIN_REQUEST_SPACING`].
    pub min_request_spacing: Duration,
}

impl Default for ImdsConfig {
    fn default() -> Self {
        ImdsConfig {
            endpoint: DEFAULT_ENDPOINT.to_owned(),
            request_timeout: Duration::from_secs(2),
            first_call_timeout: Duration::from_secs(130),
            connect_timeout: Duration::from_secs(1),
            max_response_bytes: 256 * 1024,
            min_request_spacing: MIN_REQUEST_SPACING,
        }
    }
}

impl ImdsConfig {
    /// The same configuration pointed at `endpoint`.
    pub fn with_endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.endpoint = endpoint.into();
        self
    }
}

/// What happened when an approval was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Approval {
    /// The `StartRequests` POST was accepted.
    Approved,
    /// The event had already started (approved by another VM, or its
    /// `NotBefore` passed); nothing was sent.
    AlreadyStarted,
}

/// Which events this process may approve.
///
/// Approving an event lets Azure start it for every VM in its `Resources`,
/// not just the one that approves (and events are broadcast to a whole
/// availability set or placement group). A worker that drains in a second
/// and approves a shared Reboot would cut its peers' notice to nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApprovalScope {
    /// Only events whose `Resources` is exactly this VM (compared without
    /// regard to case). The default, and the only safe one for a worker.
    ThisVm(String),
    /// Events that list this VM, alone or with others: an explicit opt-in
    /// for deployments whose other VMs need no notice.
    SharedWithThisVm(String),
    /// Any event, for a coordinator that approves on behalf of others.
    AnyVm,
}

impl ApprovalScope {
    /// Whether `event` may be approved under this scope; the error says why
    /// not. An event with no `Resources` names no VM, so only
    /// [`ApprovalScope::AnyVm`] may approve it.
    pub fn check(&self, event: &ScheduledEvent) -> Result<(), ImdsError> {
        let vm_name = match self {
            ApprovalScope::AnyVm => return Ok(()),
            ApprovalScope::ThisVm(name) | ApprovalScope::SharedWithThisVm(name) => name,
        };
        if !event.concerns(vm_name) {
            return Err(ImdsError::NotThisVm {
                event_id: event.id.clone(),
                resources: event.resources.clone(),
                vm_name: vm_name.clone(),
            });
        }
        let shared = !event.concerns_only(vm_name);
        if shared && matches!(self, ApprovalScope::ThisVm(_)) {
            return Err(ImdsError::SharedEvent {
                event_id: event.id.clone(),
                resources: event.resources.clone(),
                vm_name: vm_name.clone(),
            });
        }
        Ok(())
    }
}

/// A client for IMDS Scheduled Events and instance metadata.
///
/// ```no_run
/// # async fn run() -> Result<(), spot_worker_imds::ImdsError> {
/// use spot_worker_imds::{ImdsClient, ImdsConfig};
///
/// let client = ImdsClient::new(ImdsConfig::default())?;
/// let document = client.scheduled_events().await?;
/// println!("incarnation {}: {} events", document.incarnation, document.events.len());
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct ImdsClient {
    http: reqwest::Client,
    config: ImdsConfig,
    scheduled_events_url: Url,
    instance_url: Url,
    answered_once: AtomicBool,
    last_request: Mutex<Option<Instant>>,
}

impl ImdsClient {
    /// Builds a client; fails only on an unusable endpoint.
    pub fn new(mut config: ImdsConfig) -> Result<Self, ImdsError> {
        config.min_request_spacing = config.min_request_spacing.max(MIN_REQUEST_SPACING);
        let base = parse_endpoint(&config.endpoint)?;
        let scheduled_events_url = endpoint_url(
            &base,
            "metadata/scheduledevents",
            SCHEDULED_EVENTS_API_VERSION,
        )?;
        let instance_url = endpoint_url(&base, "metadata/instance", INSTANCE_API_VERSION)?;
        let http = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(config.connect_timeout)
            .pool_max_idle_per_host(1)
            .pool_idle_timeout(Duration::from_secs(90))
            .tcp_nodelay(true)
            .build()
            .map_err(ImdsError::Client)?;
        Ok(ImdsClient {
            http,
            config,
            scheduled_events_url,
            instance_url,
            answered_once: AtomicBool::new(false),
            last_request: Mutex::new(None),
        })
    }

    /// The configuration in use.
    pub fn config(&self) -> &ImdsConfig {
        &self.config
    }

    /// Fetches the current Scheduled Events document.
    pub async fn scheduled_events(&self) -> Result<ScheduledEvents, ImdsError> {
        self.scheduled_events_with_body()
            .await
            .map(|(document, _)| document)
    }

    /// Fetches the current document, also returning the body exactly as IMDS
    /// sent it (for operators who want to see fields this crate ignores).
    pub async fn scheduled_events_with_body(
        &self,
    ) -> Result<(ScheduledEvents, Vec<u8>), ImdsError> {
        // Until IMDS has answered once, the service may still be enabling
        // Scheduled Events for this VM, which takes up to two minutes.
        let timeout = if self.answered_once.load(Ordering::Relaxed) {
            self.config.request_timeout
        } else {
            self.config.first_call_timeout
        };
        let url = self.scheduled_events_url.clone();
        let body = self.send(Method::GET, url, None, timeout).await?;
        let document = parse_json("Scheduled Events document", &body)?;
        self.answered_once.store(true, Ordering::Relaxed);
        Ok((document, body))
    }

    /// The instance metadata document (`/metadata/instance`), which each
    /// of the answers below reads its part of.
    async fn instance_metadata(&self) -> Result<Vec<u8>, ImdsError> {
        let url = self.instance_url.clone();
        self.send(Method::GET, url, None, self.config.request_timeout)
            .await
    }

    /// This VM's name as listed in events' `Resources`, from instance
    /// metadata (`compute.name`; `{scale-set}_{instance-id}` in scale sets).
    pub async fn vm_name(&self) -> Result<String, ImdsError> {
        let body = self.instance_metadata().await?;
        crate::instance::vm_name(&body)
    }

    /// This VM's size and priority, from instance metadata
    /// (`compute.vmSize`, `compute.priority`).
    pub async fn vm_kind(&self) -> Result<crate::instance::VmKind, ImdsError> {
        let body = self.instance_metadata().await?;
        crate::instance::vm_kind(&body)
    }

    /// This VM's place in its scale set from instance metadata, or `None`
    /// when it is in none.
    pub async fn scale_set_member(
        &self,
    ) -> Result<Option<crate::scale_set_member::ScaleSetMember>, ImdsError> {
        let body = self.instance_metadata().await?;
        crate::scale_set_member::scale_set_member(&body)
    }

    /// Approves an event so Azure may start it before `NotBefore`.
    ///
    /// Reads the current document first, so that only an event that is
    /// present, still `Scheduled`, and allowed by `scope` (see
    /// [`ApprovalScope::check`]) is approved. Approving twice is harmless. An event that has
    /// already finished is no longer listed and gives
    /// [`ImdsError::EventNotFound`].
    pub async fn approve(
        &self,
        event_id: &EventId,
        scope: &ApprovalScope,
    ) -> Result<Approval, ImdsError> {
        let document = self.scheduled_events().await?;
        let event = document
            .event(event_id)
            .ok_or_else(|| ImdsError::EventNotFound(event_id.clone()))?;
        self.approve_event(event, scope).await
    }

    /// Approves `event` as last seen in a recent document, without reading
    /// the document again: for callers that already have it (a watcher), so
    /// approval costs one request. The same checks apply: the scope, and no
    /// POST for an event already started.
    pub async fn approve_event(
        &self,
        event: &ScheduledEvent,
        scope: &ApprovalScope,
    ) -> Result<Approval, ImdsError> {
        scope.check(event)?;
        if event.status == EventStatus::Started {
            return Ok(Approval::AlreadyStarted);
        }
        // Echo the id in IMDS's own spelling.
        let payload = serde_json::json!({ "StartRequests": [{ "EventId": event.id }] });
        let url = self.scheduled_events_url.clone();
        self.send(
            Method::POST,
            url,
            Some(payload.to_string()),
            self.config.request_timeout,
        )
        .await?;
        Ok(Approval::Approved)
    }

    /// One request, retried a few times if IMDS throttles it: other
    /// processes on the VM share the 5 requests per second.
    async fn send(
        &self,
        method: Method,
        url: Url,
        body: Option<String>,
        timeout: Duration,
    ) -> Result<Vec<u8>, ImdsError> {
        const THROTTLE_RETRIES: u32 = 3;
        let mut attempt = 0;
        loop {
            match self
                .send_once(method.clone(), url.clone(), body.clone(), timeout)
                .await
            {
                Err(ImdsError::Throttled) if attempt < THROTTLE_RETRIES => {
                    attempt += 1;
                    // The limit is a one-second window: by then it has room.
                    tokio::time::sleep(Duration::from_millis(400) * attempt).await;
                }
                result => return result,
            }
        }
    }

    /// One request: paced, bounded in time and size, status mapped to errors.
    async fn send_once(
        &self,
        method: Method,
        url: Url,
        body: Option<String>,
        timeout: Duration,
    ) -> Result<Vec<u8>, ImdsError> {
        self.pace().await;
        let shown_url = url.to_string();
        let mut request = self
            .http
            .request(method, url)
            .header("Metadata", "true")
            .header(reqwest::header::ACCEPT, "application/json");
        if let Some(body) = body {
            request = request
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body);
        }
        let exchange = async {
            let response = request
                .send()
                .await
                .map_err(|source| ImdsError::Transport {
                    url: shown_url.clone(),
                    source: source.without_url(),
                })?;
            let status = response.status();
            if status.is_redirection() {
                let location = response
                    .headers()
                    .get(reqwest::header::LOCATION)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned);
                return Err(ImdsError::Redirect {
                    status: status.as_u16(),
                    location,
                });
            }
            let body = self.read_bounded(response, &shown_url).await?;
            check_status(status, &body)?;
            Ok(body)
        };
        match tokio::time::timeout(timeout, exchange).await {
            Ok(result) => result,
            Err(_) => Err(ImdsError::Timeout {
                url: shown_url,
                after: timeout,
            }),
        }
    }

    /// Waits until the next request is allowed under the rate limit.
    async fn pace(&self) {
        let mut last = self.last_request.lock().await;
        if let Some(previous) = *last {
            tokio::time::sleep_until(previous + self.config.min_request_spacing).await;
        }
        *last = Some(Instant::now());
    }

    async fn read_bounded(
        &self,
        mut response: reqwest::Response,
        url: &str,
    ) -> Result<Vec<u8>, ImdsError> {
        let limit = self.config.max_response_bytes;
        if response.content_length().is_some_and(|n| n > limit as u64) {
            return Err(ImdsError::TooLarge { limit });
        }
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|source| ImdsError::Transport {
                url: url.to_owned(),
                source: source.without_url(),
            })?
        {
            if body.len() + chunk.len() > limit {
                return Err(ImdsError::TooLarge { limit });
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }
}

fn parse_endpoint(endpoint: &str) -> Result<Url, ImdsError> {
    let invalid = |reason: &str| ImdsError::InvalidEndpoint {
        endpoint: endpoint.to_owned(),
        reason: reason.to_owned(),
    };
    let mut url = Url::parse(endpoint.trim()).map_err(|e| invalid(&e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(invalid("the scheme must be http (or https)"));
    }
    if url.host_str().is_none() {
        return Err(invalid("no host"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(invalid("give the base URL only, without query or fragment"));
    }
    // Treat the endpoint as a directory so relative joins keep its path.
    if !url.path().ends_with('/') {
        let path = format!("{}/", url.path());
        url.set_path(&path);
    }
    Ok(url)
}

fn endpoint_url(base: &Url, path: &str, api_version: &str) -> Result<Url, ImdsError> {
    let mut url = base.join(path).map_err(|e| ImdsError::InvalidEndpoint {
        endpoint: base.to_string(),
        reason: e.to_string(),
    })?;
    url.query_pairs_mut()
        .append_pair("api-version", api_version);
    Ok(url)
}

pub(crate) fn check_status(status: StatusCode, body: &[u8]) -> Result<(), ImdsError> {
    if status.is_success() {
        return Ok(());
    }
    Err(match status {
        StatusCode::BAD_REQUEST => ImdsError::BadRequest {
            message: error_message(body),
        },
        StatusCode::TOO_MANY_REQUESTS => ImdsError::Throttled,
        _ => ImdsError::Status {
            status: status.as_u16(),
            body: excerpt(body),
        },
    })
}

/// IMDS errors are `{"error": "..."}`; fall back to the raw text. Either
/// way one line, bounded: it ends up in logs and error messages.
fn error_message(body: &[u8]) -> String {
    #[derive(Deserialize)]
    struct ErrorBody {
        error: String,
    }
    serde_json::from_slice::<ErrorBody>(body)
        .map(|e| excerpt(e.error.as_bytes()))
        .unwrap_or_else(|_| excerpt(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_urls_from_the_endpoint() {
        for endpoint in ["http://169.254.169.254", "http://169.254.169.254/"] {
            let base = parse_endpoint(endpoint).unwrap();
            let url = endpoint_url(&base, "metadata/scheduledevents", "2020-07-01").unwrap();
            assert_eq!(
                url.as_str(),
                "http://169.254.169.254/metadata/scheduledevents?api-version=2020-07-01"
            );
        }
        let base = parse_endpoint("http://127.0.0.1:9000/prefix").unwrap();
        let url = endpoint_url(&base, "metadata/instance", "2021-02-01").unwrap();
        assert_eq!(
            url.as_str(),
            "http://127.0.0.1:9000/prefix/metadata/instance?api-version=2021-02-01"
        );
    }

    #[test]
    fn refuses_unusable_endpoints() {
        for endpoint in [
            "",
            "169.254.169.254",
            "ftp://x",
            "http://x/?a=b",
            "unix:/tmp/s",
        ] {
            let err = ImdsClient::new(ImdsConfig::default().with_endpoint(endpoint)).unwrap_err();
            assert!(
                matches!(err, ImdsError::InvalidEndpoint { .. }),
                "{endpoint}: {err}"
            );
        }
    }

    #[test]
    fn maps_statuses_to_errors() {
        let err = check_status(StatusCode::BAD_REQUEST, br#"{"error":"no header"}"#).unwrap_err();
        assert_eq!(
            err.to_string(),
            "IMDS rejected the request (400 Bad Request): no header"
        );
        assert!(!err.is_transient());
        assert!(matches!(
            check_status(StatusCode::TOO_MANY_REQUESTS, b"").unwrap_err(),
            ImdsError::Throttled
        ));
        let err = check_status(StatusCode::SERVICE_UNAVAILABLE, b"busy").unwrap_err();
        assert!(err.is_transient(), "{err}");
        assert!(check_status(StatusCode::OK, b"").is_ok());
    }

    #[test]
    fn never_paces_faster_than_imds_allows() {
        let config = ImdsConfig {
            min_request_spacing: Duration::from_millis(1),
            ..ImdsConfig::default()
        };
        let client = ImdsClient::new(config).unwrap();
        assert_eq!(client.config().min_request_spacing, MIN_REQUEST_SPACING);
    }

    #[test]
    fn approves_only_what_the_scope_allows() {
        use crate::model::{EventType, NotBefore};
        let event = |resources: &[&str]| ScheduledEvent {
            id: "E".into(),
            event_type: EventType::Reboot,
            status: EventStatus::Scheduled,
            resource_type: "VirtualMachine".into(),
            resources: resources.iter().map(|r| r.to_string()).collect(),
            not_before: NotBefore::Unset,
            description: String::new(),
            source: None,
            duration_in_seconds: None,
        };
        let this = || ApprovalScope::ThisVm("vmss_0".into());
        let shared = || ApprovalScope::SharedWithThisVm("vmss_0".into());
        // (scope, resources, allowed, refused as)
        let table: [(ApprovalScope, &[&str], Result<(), &str>); 12] = [
            (this(), &["vmss_0"], Ok(())),
            (this(), &["VMSS_0"], Ok(())),
            (this(), &["vmss_0", "vmss_1"], Err("shared")),
            (this(), &["vmss_1", "VMSS_0"], Err("shared")),
            (this(), &["vmss_1"], Err("not this vm")),
            (this(), &[], Err("not this vm")),
            (shared(), &["vmss_0"], Ok(())),
            (shared(), &["vmss_0", "vmss_1"], Ok(())),
            (shared(), &["vmss_1"], Err("not this vm")),
            (shared(), &[], Err("not this vm")),
            (ApprovalScope::AnyVm, &["vmss_1", "vmss_2"], Ok(())),
            (ApprovalScope::AnyVm, &[], Ok(())),
        ];
        for (scope, resources, expected) in table {
            let got = scope.check(&event(resources)).map_err(|e| match e {
                ImdsError::SharedEvent { .. } => "shared",
                ImdsError::NotThisVm { .. } => "not this vm",
                _ => "other",
            });
            assert_eq!(got, expected, "{scope:?} {resources:?}");
        }
    }
}
