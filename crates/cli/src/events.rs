//! `spot-worker events`: print, watch and approve Scheduled Events.

use std::io::Write;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use spot_worker_imds::{
    Approval, ApprovalScope, EventId, EventType, FreezePolicy, ImdsClient, ImdsConfig,
    NoticePolicy, NoticeSignal, RunningWatcher, ScheduledEvent, ScheduledEvents, Transition,
    Watcher, WatcherConfig,
};
use spot_worker_runtime::settings::table;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use tokio::sync::broadcast::{self, error::RecvError};

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct EventsArgs {
    /// Print the document exactly as IMDS returned it (JSON) instead of a
    /// summary.
    #[arg(long)]
    json: bool,

    /// This VM's name as listed in `Resources` (default: from instance
    /// metadata).
    #[arg(long, global = true, env = table::VM_NAME.key)]
    vm_name: Option<String>,

    #[command(subcommand)]
    action: Option<EventsAction>,
}

#[derive(Debug, Subcommand)]
enum EventsAction {
    /// Stream transitions (scheduled, started, updated, completed,
    /// cancelled) until interrupted.
    Watch {
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
        /// Time between polls (at least 200ms: IMDS allows 5 requests/s).
        #[arg(long, default_value = "1s", value_parser = crate::parse_duration)]
        interval: Duration,
        /// Exit (status 0) once an event that drains this VM is seen, after
        /// printing it: for shell scripts that must act on a notice.
        #[arg(long)]
        until_notice: bool,
        #[command(flatten)]
        policy: PolicyArgs,
    },
    /// Approve a scheduled event so Azure may start it now.
    Approve {
        /// The event's id, as printed by `spot-worker events`.
        event_id: String,
        /// Approve even if the event does not list this VM (it then proceeds
        /// for every VM it lists).
        #[arg(long)]
        any_vm: bool,
    },
}

/// Which events count as a notice for `--until-notice`.
#[derive(Debug, Args)]
struct PolicyArgs {
    /// Drain for a Freeze only when it is announced longer than this (or of
    /// unknown length); 0s drains on every Freeze.
    #[arg(long, default_value = "30s", value_parser = crate::parse_duration)]
    freeze_threshold: Duration,
    /// Do not drain for this event type (repeatable), e.g. `--ignore Reboot`.
    #[arg(long, value_name = "TYPE")]
    ignore: Vec<EventType>,
    /// Also drain for this event type (repeatable), e.g. a type Azure adds
    /// later.
    #[arg(long, value_name = "TYPE")]
    drain_on: Vec<EventType>,
}

impl PolicyArgs {
    fn policy(self) -> NoticePolicy {
        let freeze = if self.freeze_threshold.is_zero() {
            FreezePolicy::Always
        } else {
            FreezePolicy::LongerThan(self.freeze_threshold)
        };
        let policy = NoticePolicy::default().freeze(freeze);
        let policy = self
            .drain_on
            .into_iter()
            .fold(policy, NoticePolicy::drain_on);
        self.ignore.into_iter().fold(policy, NoticePolicy::ignore)
    }
}

pub async fn run(endpoint: &str, args: EventsArgs) -> Result<()> {
    let client = ImdsClient::new(ImdsConfig::default().with_endpoint(endpoint))
        .context("configuring the IMDS client")?;
    match args.action {
        None => print_document(&client, args.vm_name, args.json).await,
        Some(EventsAction::Watch {
            json,
            interval,
            until_notice,
            policy,
        }) => {
            let config = WatcherConfig {
                poll_interval: interval,
                vm_name: args.vm_name,
                ..WatcherConfig::default()
            };
            watch(client, config, policy.policy(), json, until_notice).await
        }
        Some(EventsAction::Approve { event_id, any_vm }) => {
            approve(&client, EventId(event_id), args.vm_name, any_vm).await
        }
    }
}

async fn print_document(client: &ImdsClient, vm_name: Option<String>, json: bool) -> Result<()> {
    let (document, body) = client
        .scheduled_events_with_body()
        .await
        .context("reading Scheduled Events")?;
    let mut stdout = std::io::stdout().lock();
    if json {
        stdout.write_all(&body)?;
        if !body.ends_with(b"\n") {
            writeln!(stdout)?;
        }
        return stdout.flush().context("writing to stdout");
    }
    // The summary marks this VM's events; it is still useful without them.
    let vm_name = match vm_name {
        Some(name) => Some(name),
        None => client.vm_name().await.ok(),
    };
    let text = summary(&document, vm_name.as_deref(), SystemTime::now());
    stdout.write_all(text.as_bytes())?;
    stdout.flush().context("writing to stdout")
}

fn summary(document: &ScheduledEvents, vm_name: Option<&str>, now: SystemTime) -> String {
    let mut out = format!(
        "DocumentIncarnation {}: {} event(s){}\n",
        document.incarnation,
        document.events.len(),
        vm_name.map_or(String::new(), |n| format!(", this VM is {n}")),
    );
    for event in &document.events {
        let mine = vm_name.is_some_and(|n| event.concerns(n));
        out.push_str(&format!(
            "{} {} {:<9} {:<9} {} resources=[{}]{}\n",
            if mine { "*" } else { " " },
            event.id,
            event.event_type,
            event.status,
            describe_not_before(event, now),
            event.resources.join(", "),
            event
                .duration()
                .map_or(String::new(), |d| format!(" duration={}s", d.as_secs())),
        ));
    }
    out
}

fn describe_not_before(event: &ScheduledEvent, now: SystemTime) -> String {
    match event.not_before.instant() {
        Some(at) => {
            let when = at.format(&Rfc3339).unwrap_or_default();
            let left = SystemTime::from(at)
                .duration_since(now)
                .map_or("passed".to_owned(), |d| format!("in {}s", d.as_secs()));
            format!("not_before={when} ({left})")
        }
        None => "not_before=-".to_owned(),
    }
}

async fn watch(
    client: ImdsClient,
    config: WatcherConfig,
    policy: NoticePolicy,
    json: bool,
    until_notice: bool,
) -> Result<()> {
    let mut watcher = Watcher::new(client, config);
    let shutdown = watcher.notice_signal(policy);
    let mut transitions = watcher.subscribe();
    let running = watcher.spawn();
    let mut stdout = std::io::stdout().lock();
    // Created once: a signal arriving while a line is printed still counts.
    let interrupted = crate::interrupted();
    tokio::pin!(interrupted);
    loop {
        tokio::select! {
            _ = &mut interrupted => break,
            received = transitions.recv() => match received {
                Ok(t) => {
                    print_transition(&mut stdout, &t, json)?;
                    if until_notice && shutdown.token().is_cancelled() {
                        finish_document(&running, &shutdown, &mut transitions, &mut stdout, json)
                            .await?;
                        break;
                    }
                }
                Err(RecvError::Lagged(missed)) => {
                    tracing::warn!(missed, "output fell behind; some transitions were not printed");
                }
                Err(RecvError::Closed) => bail!("the watcher stopped unexpectedly"),
            },
        }
    }
    running.stop().await;
    Ok(())
}

/// Prints the rest of the document that carried the notice. The watcher
/// publishes its health only after sending a document's transitions, so once
/// health shows that incarnation, they are all queued.
async fn finish_document(
    running: &RunningWatcher,
    shutdown: &NoticeSignal,
    transitions: &mut broadcast::Receiver<Transition>,
    out: &mut impl Write,
    json: bool,
) -> Result<()> {
    let Some(target) = shutdown.notice().map(|n| n.incarnation) else {
        return Ok(());
    };
    let mut health = running.health();
    health
        .wait_for(|h| h.incarnation.is_some_and(|i| i >= target))
        .await
        .context("the watcher stopped")?;
    while let Ok(t) = transitions.try_recv() {
        print_transition(out, &t, json)?;
    }
    Ok(())
}

fn print_transition(out: &mut impl Write, t: &Transition, json: bool) -> Result<()> {
    if json {
        serde_json::to_writer(&mut *out, t)?;
        writeln!(out)?;
    } else {
        let at = OffsetDateTime::from(t.observed_at)
            .format(&Rfc3339)
            .unwrap_or_default();
        writeln!(
            out,
            "{at} {:<9} {} {} {} {} resources=[{}]{} incarnation={}",
            t.kind.as_str(),
            t.event.id,
            t.event.event_type,
            t.event.status,
            describe_not_before(&t.event, t.observed_at),
            t.event.resources.join(", "),
            if t.concerns_this_vm { " (this VM)" } else { "" },
            t.incarnation,
        )?;
    }
    out.flush().context("writing to stdout")
}

async fn approve(
    client: &ImdsClient,
    event_id: EventId,
    vm_name: Option<String>,
    any_vm: bool,
) -> Result<()> {
    let scope = if any_vm {
        ApprovalScope::AnyVm
    } else {
        let name = match vm_name {
            Some(name) => name,
            None => client
                .vm_name()
                .await
                .context("learning this VM's name (or pass --vm-name)")?,
        };
        ApprovalScope::ThisVm(name)
    };
    let outcome = client
        .approve(&event_id, &scope)
        .await
        .with_context(|| format!("approving event {event_id}"))?;
    let mut stdout = std::io::stdout().lock();
    match outcome {
        Approval::Approved => writeln!(stdout, "approved {event_id}")?,
        Approval::AlreadyStarted => {
            writeln!(stdout, "{event_id} has already started; nothing to approve")?
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_marks_this_vms_events() {
        let document: ScheduledEvents = serde_json::from_str(
            r#"{"DocumentIncarnation":4,"Events":[
              {"EventId":"A","EventType":"Preempt","EventStatus":"Scheduled",
               "Resources":["vm_0"],"NotBefore":"Thu, 01 Jan 1970 00:00:30 GMT","DurationInSeconds":-1},
              {"EventId":"B","EventType":"Freeze","EventStatus":"Started",
               "Resources":["vm_1"],"NotBefore":"","DurationInSeconds":5}]}"#,
        )
        .unwrap();
        let text = summary(&document, Some("vm_0"), SystemTime::UNIX_EPOCH);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "DocumentIncarnation 4: 2 event(s), this VM is vm_0"
        );
        assert!(lines[1].starts_with("* A Preempt"), "{}", lines[1]);
        assert!(lines[1].contains("not_before=1970-01-01T00:00:30Z (in 30s)"));
        assert!(lines[2].starts_with("  B Freeze"), "{}", lines[2]);
        assert!(lines[2].ends_with("duration=5s"), "{}", lines[2]);
    }
}
