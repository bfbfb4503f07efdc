//! This worker's part of the fleet's bill (issue 39, item 3): a
//! [`Lifetime`] tallies its time as starting, busy, idle and draining
//! ([`Tally`]), reports it as `spot_worker.worker.time`, and writes it to
//! its own record in the checkpoint store ([`LifetimeLog`]) when the
//! warmup ends, every [`WRITE_EVERY`], and as it exits: a few writes per
//! hour, never one per message.
//!
//! Where it is told (the whole hook, in `worker/mod.rs` and `drain.rs`):
//! started as `run_lifecycle` begins; ready when the gate opens and again
//! after a withdrawn notice (`serve`); busy while a handler runs
//! ([`Busy`], around the handler `serve` builds, so the count of handlers
//! in flight is the consumer's own); draining at the drain's trigger
//! (`consume`); exited after the drain, before the telemetry flush.
//!
//! Once its own record is first written, each worker deletes a bounded
//! number of records of workers gone longer than the retention
//! (`SPOT_WORKER_LIFETIME_RETENTION`, [`LifetimeLog::delete_expired`]).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, UNIX_EPOCH};

use spot_worker_consumer::{HandlerError, Job, MessageHandler};
use spot_worker_decisions::bill::{PaidTime, Tally, WRITE_EVERY};
use spot_worker_decisions::lanes::Lane;
use spot_worker_imds::{ImdsClient, VmKind};
use spot_worker_storage::{
    CLEAN_LIFETIMES_AT_MOST, CheckpointStore, Clock, LifetimeLog, SystemClock,
};
use spot_worker_telemetry::Metrics;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// This worker's lifetime, told as it changes.
pub(crate) struct Lifetime {
    tally: Mutex<Tally>,
    clock: Arc<dyn Clock>,
    worker: String,
    queue: String,
    lane: Lane,
    /// Wakes the writer for a write out of turn (ready, exit).
    changed: Notify,
    /// The VM's size and price class, once instance metadata said.
    vm: Mutex<VmKind>,
}

impl Lifetime {
    /// A worker of `queue` in `lane` starting now by `clock`.
    pub(crate) fn start(
        queue: &str,
        lane: Lane,
        vm_name: Option<&str>,
        clock: Arc<dyn Clock>,
    ) -> Arc<Self> {
        let now = millis(clock.as_ref());
        let host = vm_name.map_or_else(host_name, str::to_owned);
        let worker = format!(
            "{host}-{}-{now}-{:04x}",
            std::process::id(),
            clock.jitter(0xffff)
        );
        Arc::new(Lifetime {
            tally: Mutex::new(Tally::started(now)),
            clock,
            worker,
            queue: queue.to_owned(),
            lane,
            changed: Notify::new(),
            vm: Mutex::new(VmKind::default()),
        })
    }

    /// With the wall clock; on a VM (`on_vm`: instance metadata watched)
    /// booted at most [`BOOT_WINDOW`] ago, its starting time counts from the
    /// boot ([`boot_lead`]).
    pub(crate) fn start_now(
        queue: &str,
        lane: Lane,
        vm_name: Option<&str>,
        on_vm: bool,
    ) -> Arc<Self> {
        let lead = if on_vm {
            std::fs::read_to_string("/proc/uptime")
                .ok()
                .and_then(|uptime| boot_lead(&uptime))
        } else {
            None
        };
        Self::start_booted(queue, lane, vm_name, Arc::new(SystemClock), lead)
    }

    /// [`start`](Self::start), its starting time counted from `lead`
    /// before now (the VM's boot), if given.
    pub(crate) fn start_booted(
        queue: &str,
        lane: Lane,
        vm_name: Option<&str>,
        clock: Arc<dyn Clock>,
        lead: Option<Duration>,
    ) -> Arc<Self> {
        let lifetime = Self::start(queue, lane, vm_name, clock);
        if let Some(lead) = lead {
            let lead_ms = u64::try_from(lead.as_millis()).unwrap_or(u64::MAX);
            let mut tally = lifetime
                .tally
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            *tally = tally.clone().booted_before(lead_ms);
        }
        lifetime
    }

    fn change(&self, change: impl FnOnce(&mut Tally, u64)) {
        let now = millis(self.clock.as_ref());
        change(
            &mut self.tally.lock().unwrap_or_else(PoisonError::into_inner),
            now,
        );
    }

    /// The warmup ended, or a withdrawn notice lets the worker serve again.
    pub(crate) fn ready(&self) {
        self.change(Tally::ready);
        self.changed.notify_one();
    }

    /// The VM's size and price class, from instance metadata: in every
    /// record written from now on.
    pub(crate) fn vm_kind(&self, kind: VmKind) {
        *self.vm.lock().unwrap_or_else(PoisonError::into_inner) = kind;
    }

    /// A stop signal or notice: the drain begins.
    pub(crate) fn draining(&self) {
        self.change(Tally::draining);
    }

    /// The worker is done; the writer writes once more and stops.
    pub(crate) fn exited(&self) {
        self.change(Tally::exited);
        self.changed.notify_one();
    }

    /// Its time so far.
    pub(crate) fn time(&self) -> PaidTime {
        let now = millis(self.clock.as_ref());
        self.tally
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .time_at(now)
    }

    /// Reports its time at every export of `metrics`.
    pub(crate) fn observe(self: &Arc<Self>, metrics: &Metrics) {
        let lifetime = Arc::clone(self);
        let lane = match self.lane {
            Lane::Spot => "spot",
            Lane::Regular => "regular",
        };
        metrics.observe_worker_time(move || {
            let t = lifetime.time();
            (lane, [t.starting_s, t.busy_s, t.idle_s, t.draining_s])
        });
    }

    /// [`keep_and_clean`](Self::keep_and_clean) without the cleaning.
    #[cfg(test)]
    pub(crate) async fn keep(
        self: Arc<Self>,
        store: Arc<dyn CheckpointStore>,
        every: Duration,
        stop: CancellationToken,
    ) {
        self.keep_and_clean(store, every, None, stop).await;
    }

    /// Keeps the record in `store` until the worker exits or `stop` is
    /// cancelled: written at each ready, every `every` while not exited,
    /// and once more at exit. A failed write is logged; the next carries
    /// everything (the figures are cumulative). Once the first record is
    /// written, the records of workers gone longer than `retention` are
    /// deleted (at most [`CLEAN_LIFETIMES_AT_MOST`] read; given up at
    /// `stop`).
    pub(crate) async fn keep_and_clean(
        self: Arc<Self>,
        store: Arc<dyn CheckpointStore>,
        every: Duration,
        mut retention: Option<Duration>,
        stop: CancellationToken,
    ) {
        let log = LifetimeLog::for_worker(Arc::clone(&store), &self.worker);
        loop {
            let stopped = tokio::select! {
                () = stop.cancelled() => true,
                () = self.changed.notified() => false,
                () = tokio::time::sleep(every) => false,
            };
            let (mut record, exited) = {
                let now = millis(self.clock.as_ref());
                let mut tally = self.tally.lock().unwrap_or_else(PoisonError::into_inner);
                let exited = tally.phase() == spot_worker_decisions::bill::Phase::Exited;
                (
                    tally.record(&self.worker, &self.queue, self.lane, now),
                    exited,
                )
            };
            {
                let vm = self.vm.lock().unwrap_or_else(PoisonError::into_inner);
                record.vm_size.clone_from(&vm.vm_size);
                record.priority.clone_from(&vm.priority);
            }
            if let Err(error) = log.write(&record).await {
                tracing::warn!(%error, key = log.key(), "could not write this worker's lifetime record; writing with the next");
            }
            if stopped || exited {
                return;
            }
            if let Some(retention) = retention.take() {
                let now = self.clock.now();
                let clean = LifetimeLog::delete_expired(
                    store.as_ref(),
                    now,
                    retention,
                    CLEAN_LIFETIMES_AT_MOST,
                );
                if let Some(Err(error)) = stop.run_until_cancelled(clean).await {
                    tracing::warn!(%error, "could not list the workers' lifetime records to delete the expired");
                }
            }
        }
    }
}

impl super::Worker {
    /// Reports this worker's time in the metrics from now on and, with a
    /// checkpoint store, keeps its record there from the gate's opening
    /// (the store is ready then) until `stop`.
    pub(super) fn keep_lifetime(
        &self,
        stop: &CancellationToken,
    ) -> Option<tokio::task::JoinHandle<()>> {
        self.lifetime.observe(&self.metrics);
        let store = Arc::clone(self.checkpoints.as_ref()?);
        let (lifetime, stop) = (Arc::clone(&self.lifetime), stop.clone());
        let retention = self.config.lifetime_retention;
        // Off Azure (no instance metadata) the size stays unknown.
        let imds = self
            .config
            .imds
            .enabled
            .then(|| ImdsClient::new(self.imds_config()).ok())
            .flatten();
        let gate_opened = self.gate_opened.clone();
        Some(tokio::spawn(async move {
            // A worker that stops before its gate opens leaves no record:
            // its store may not be ready, and its time shows in the metrics.
            if !super::gate_opened_before(&gate_opened, &stop).await {
                return;
            }
            if let Some(imds) = imds {
                match tokio::time::timeout(VM_KIND_WITHIN, imds.vm_kind()).await {
                    Ok(Ok(kind)) => lifetime.vm_kind(kind),
                    Ok(Err(error)) => {
                        tracing::debug!(%error, "instance metadata did not say this VM's size; its lifetime record says unknown")
                    }
                    Err(_) => tracing::debug!(
                        "instance metadata did not say this VM's size in time; its lifetime record says unknown"
                    ),
                }
            }
            lifetime
                .keep_and_clean(store, WRITE_EVERY, Some(retention), stop)
                .await;
        }))
    }
}

/// How soon after its VM's boot a worker must start for the time since the
/// boot to count as its starting time: a first worker started by
/// cloud-init starts within minutes; a worker restarted later on the same
/// VM (or in a container on a node up for days: `/proc/uptime` is the
/// node's, not the container's) does not, and the boot is not its to count.
pub(crate) const BOOT_WINDOW: Duration = Duration::from_secs(15 * 60);

/// The time since the host booted, from `/proc/uptime`'s text (`"seconds
/// idle"`), if it is at most [`BOOT_WINDOW`].
pub(crate) fn boot_lead(uptime: &str) -> Option<Duration> {
    let seconds: f64 = uptime.split_whitespace().next()?.parse().ok()?;
    let lead = Duration::try_from_secs_f64(seconds).ok()?;
    (lead <= BOOT_WINDOW).then_some(lead)
}

/// How long the worker waits for its VM's size before its first record
/// (instance metadata answered the gate already: it answers at once).
const VM_KIND_WITHIN: Duration = Duration::from_secs(5);

/// A handler counted busy while it runs.
pub(crate) struct Busy<H> {
    pub(crate) inner: H,
    pub(crate) lifetime: Arc<Lifetime>,
}

/// Ends a handler's busy time however the handler ends (returned,
/// panicked, dropped).
struct Running<'a>(&'a Lifetime);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.change(Tally::finished);
    }
}

impl<H: MessageHandler> MessageHandler for Busy<H> {
    async fn handle(&self, job: Job) -> Result<(), HandlerError> {
        self.lifetime.change(Tally::took);
        let _running = Running(&self.lifetime);
        self.inner.handle(job).await
    }

    crate::decorator::forward_job_knowledge!();
}

fn millis(clock: &dyn Clock) -> u64 {
    clock.now().duration_since(UNIX_EPOCH).map_or(0, |since| {
        u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
    })
}

/// The machine's name (the VM's, or the pod's on AKS), for the worker's id.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "worker".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use spot_worker_storage::InMemoryCheckpointStore;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::SystemTime;

    /// A clock moved by hand.
    #[derive(Clone, Default)]
    struct HandClock(Arc<AtomicU64>);

    impl HandClock {
        fn advance(&self, seconds: u64) {
            self.0.fetch_add(seconds * 1000, Ordering::SeqCst);
        }
    }

    impl Clock for HandClock {
        fn now(&self) -> SystemTime {
            UNIX_EPOCH + Duration::from_millis(self.0.load(Ordering::SeqCst))
        }
        fn jitter(&self, _max: u64) -> u64 {
            7
        }
    }

    #[tokio::test]
    async fn the_record_follows_ready_handlers_the_drain_and_exit() {
        let clock = HandClock::default();
        let store: Arc<dyn CheckpointStore> = Arc::new(InMemoryCheckpointStore::new());
        let lifetime = Lifetime::start("jobs", Lane::Regular, Some("vm3"), Arc::new(clock.clone()));
        assert_eq!(
            lifetime.worker,
            format!("vm3-{}-0-0007", std::process::id())
        );
        lifetime.vm_kind(VmKind {
            vm_size: Some("Standard_D4s_v5".into()),
            priority: Some("Regular".into()),
        });
        let stop = CancellationToken::new();
        let writer = tokio::spawn(Arc::clone(&lifetime).keep(
            Arc::clone(&store),
            Duration::from_secs(3600),
            stop.clone(),
        ));
        clock.advance(40);
        lifetime.ready();
        clock.advance(5);
        {
            // A handler runs for 100 s (what `Busy` does around it).
            lifetime.change(Tally::took);
            let _running = Running(&lifetime);
            clock.advance(100);
        }
        clock.advance(10);
        lifetime.draining();
        clock.advance(3);
        lifetime.exited();
        writer.await.unwrap();
        let key = LifetimeLog::key_of(&lifetime.worker);
        let record = LifetimeLog::read_key(store.as_ref(), &key)
            .await
            .unwrap()
            .expect("written at exit");
        let t = record.time;
        assert_eq!(
            [t.starting_s, t.busy_s, t.idle_s, t.draining_s],
            [40.0, 100.0, 15.0, 3.0]
        );
        assert_eq!((record.lane, record.seen_ms), (Lane::Regular, 158_000));
        assert_eq!(
            (record.vm_size.as_deref(), record.priority.as_deref()),
            (Some("Standard_D4s_v5"), Some("Regular"))
        );
        assert_eq!(lifetime.time(), t);
    }

    #[test]
    fn the_boot_counts_only_for_a_worker_started_soon_after_it() {
        let table = [
            ("95.27 180.01\n", Some(Duration::from_millis(95_270))),
            ("900.00 1.0", Some(BOOT_WINDOW)),
            ("900.01 1.0", None),
            ("350000.5 9.0", None),
            ("", None),
            ("garbage", None),
            ("-5 1", None),
        ];
        for (uptime, expected) in table {
            assert_eq!(boot_lead(uptime), expected, "{uptime:?}");
        }
    }

    #[tokio::test]
    async fn the_time_since_the_boot_is_starting_time() {
        let clock = HandClock::default();
        clock.advance(1_000);
        let lifetime = Lifetime::start_booted(
            "jobs",
            Lane::Spot,
            Some("vm"),
            Arc::new(clock.clone()),
            Some(Duration::from_secs(90)),
        );
        clock.advance(30);
        lifetime.ready();
        clock.advance(10);
        let t = lifetime.time();
        assert_eq!(
            [t.starting_s, t.idle_s],
            [120.0, 10.0],
            "90 s booting, 30 s warming up"
        );
        let record = lifetime
            .tally
            .lock()
            .unwrap()
            .record("w", "jobs", Lane::Spot, 1_040_000);
        assert_eq!(record.started_ms, 1_000_000, "the process's start");
    }

    #[tokio::test]
    async fn a_worker_deletes_the_records_of_workers_gone_longer_than_the_retention() {
        const DAY: u64 = 86_400;
        let clock = HandClock::default();
        let store: Arc<dyn CheckpointStore> = Arc::new(InMemoryCheckpointStore::new());
        // A worker that started on day 0 and exited on day 1.
        let gone = Lifetime::start("jobs", Lane::Spot, Some("old"), Arc::new(clock.clone()));
        clock.advance(DAY);
        gone.exited();
        Arc::clone(&gone)
            .keep(
                Arc::clone(&store),
                Duration::from_secs(3600),
                CancellationToken::new(),
            )
            .await;
        let gone_key = LifetimeLog::key_of(&gone.worker);
        assert!(store.read(&gone_key).await.unwrap().is_some());
        // Day 32: a new worker, once its own record is written, deletes the
        // record of the one gone 31 days (the retention is 30).
        clock.advance(31 * DAY);
        let lifetime = Lifetime::start("jobs", Lane::Spot, Some("new"), Arc::new(clock.clone()));
        let stop = CancellationToken::new();
        let writer = tokio::spawn(Arc::clone(&lifetime).keep_and_clean(
            Arc::clone(&store),
            Duration::from_secs(3600),
            Some(Duration::from_secs(30 * DAY)),
            stop.clone(),
        ));
        lifetime.ready();
        // Bounded: the in-memory store answers at once.
        for _ in 0..10_000 {
            if store.read(&gone_key).await.unwrap().is_none() {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert!(store.read(&gone_key).await.unwrap().is_none(), "deleted");
        stop.cancel();
        writer.await.unwrap();
        let left = store.list(LifetimeLog::PREFIX).await.unwrap();
        assert_eq!(
            left,
            [LifetimeLog::key_of(&lifetime.worker)],
            "its own stays"
        );
    }
}
