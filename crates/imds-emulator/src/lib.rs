//! An emulator of the Azure Instance Metadata Service (IMDS): Scheduled
//! Events and instance metadata, for rehearsing evictions and for testing
//! IMDS clients against an independent implementation of the wire format.
//!
//! It behaves like the real service: `Metadata: true` and api-version
//! checks with the real error bodies, proxied requests refused, a rate limit
//! of 5 requests per second, `DocumentIncarnation` counting every change of
//! the events array, `NotBefore` in RFC 1123 with whole seconds, automatic
//! start at `NotBefore`, idempotent approvals, and version-dependent fields.
//! On top of that it offers a control API under `/emulator/` (see
//! [`Emulator::serve`]), injected [`Fault`]s and scripted [`Scenario`]s.
//!
//! Time-driven changes are applied lazily whenever the state is looked at,
//! so there are no background timers and tests are deterministic.
//!
//! ```
//! use std::time::Duration;
//! use spot_worker_imds_emulator::{Emulator, EmulatorConfig, EventSpec};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> std::io::Result<()> {
//! let running = Emulator::start(EmulatorConfig::default()).await?;
//! assert!(running.url().starts_with("http://127.0.0.1:"));
//! assert_eq!(running.incarnation(), 1);
//!
//! let event = running.schedule(EventSpec::preempt()).expect("a valid event");
//! assert_eq!(event.incarnation, 2);
//! let document = running.document();
//! assert_eq!(document["Events"][0]["EventType"], "Preempt");
//! assert_eq!(document["Events"][0]["Resources"][0], "spotvmss_0");
//!
//! running.start_event(&event.id).expect("the event exists");
//! running.wait_for_incarnation(3).await;
//! assert_eq!(running.document()["Events"][0]["NotBefore"], "");
//! running.shutdown().await
//! # }
//! ```
//!
//! # HTTP API
//!
//! IMDS (with `Metadata: true` and `api-version`):
//! `GET /metadata/scheduledevents`, `POST /metadata/scheduledevents`
//! (`{"StartRequests":[{"EventId":"…"}]}`), `GET /metadata/instance`,
//! `GET /metadata/identity/oauth2/token` (managed-identity tokens for the
//! identities in [`IdentityConfig`]).
//!
//! Microsoft Entra ID (workload identity, for `AZURE_AUTHORITY_HOST`):
//! `POST /{tenant}/oauth2/v2.0/token` exchanges a service-account token that
//! a [`FederatedCredential`] trusts for that identity's tokens.
//!
//! Control (JSON, no header): `POST /emulator/events`,
//! `POST /emulator/events/{id}/start`, `POST /emulator/events/{id}/complete`,
//! `DELETE /emulator/events/{id}`, `POST|DELETE /emulator/faults`,
//! `POST /emulator/config`, `GET|POST /emulator/identity`, `GET /emulator/scenarios`,
//! `POST /emulator/scenarios/{name}`, `GET /emulator/state`,
//! `POST /emulator/reset`.

mod config;
mod control;
mod emulator;
mod entra;
mod error;
mod event;
mod fault;
mod form;
mod identities;
mod identity;
mod identity_control;
mod imds;
mod killable;
mod response;
mod scenario;
mod server;
mod state;
mod token;

pub use axum::http::StatusCode;
pub use config::EmulatorConfig;
pub use emulator::{CURRENT_API_VERSION, Emulator, PostedEvent};
pub use error::EmulatorError;
pub use event::{EmulatedSource, EmulatedStatus, EventSpec};
pub use fault::Fault;
pub use identities::{FederatedCredential, IdentityConfig, TOKEN_EXCHANGE_AUDIENCE};
pub use identity::TOKEN_PATH;
pub use imds::{INSTANCE_API_VERSIONS, SCHEDULED_EVENTS_API_VERSIONS};
pub use scenario::{Action, Scenario, Step};
pub use server::RunningEmulator;
pub use state::{RecordedApproval, Stats};
pub use token::IssuedToken;
