//! Azure IMDS Scheduled Events for workers that must leave gracefully.
//!
//! Azure announces what is about to happen to a VM (a Spot eviction, a
//! scale-in, a reboot, a live-migration pause) through the Scheduled Events
//! endpoint of the Instance Metadata Service. This crate reads it:
//!
//! - [`model`]: the document, typed, tolerant of values Azure adds later;
//! - [`ImdsClient`]: fetches documents, learns this VM's name and its place
//!   in its scale set ([`ScaleSetMember`]), approves events;
//! - [`diff`]: turns two documents into [`Transition`]s (scheduled, started,
//!   updated, completed, cancelled);
//! - [`Watcher`]: polls forever, survives IMDS errors, reports its health;
//! - [`NoticePolicy`] / [`NoticeSignal`]: which transitions mean "drain
//!   now", as a `CancellationToken` plus a deadline taken from `NotBefore`.
//!
//! It knows nothing about queues or storage: anything that must stop in time
//! can hold a [`NoticeSignal`].

mod client;
mod error;
mod instance;
pub mod model;
mod policy;
mod retry;
mod scale_set_member;
mod transition;
mod watcher;

pub use client::{
    Approval, ApprovalScope, DEFAULT_ENDPOINT, INSTANCE_API_VERSION, ImdsClient, ImdsConfig,
    MIN_REQUEST_SPACING, SCHEDULED_EVENTS_API_VERSION,
};
pub use error::ImdsError;
pub use instance::VmKind;
pub use model::{
    EventId, EventSource, EventStatus, EventType, NotBefore, ScheduledEvent, ScheduledEvents,
};
pub use policy::{FreezePolicy, Notice, NoticePolicy, NoticeSignal, deadline_for};
pub use retry::{METADATA_RETRY_MAX_POLLS, metadata_retry_polls, retry_delay};
pub use scale_set_member::ScaleSetMember;
pub use transition::{Transition, TransitionKind, diff};
pub use watcher::{RunningWatcher, Watcher, WatcherConfig, WatcherHealth};
