//! [`FaultPlan`]: the one seeded source of every decision a fault search
//! makes (which store call fails, before or after it applies, which is
//! held past its lease), and the trace of the steps it took, so that a
//! failing seed replays exactly and says what happened.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// What happens to one store call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// It applies and answers.
    None,
    /// It fails `Unavailable` without applying (the request never arrived).
    FailBefore,
    /// It applies, then fails `Unavailable` (the answer was lost).
    LoseAnswer,
    /// It waits this long before it applies (a slow call, or a process
    /// paused past its hold or lease), then answers.
    Delay(Duration),
}

/// How often each fault is chosen, in percent of the calls a plan decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultRates {
    /// [`Fault::FailBefore`].
    pub fail_before: u32,
    /// [`Fault::LoseAnswer`].
    pub lose_answer: u32,
    /// [`Fault::Delay`].
    pub delay: u32,
    /// The longest [`Fault::Delay`].
    pub max_delay: Duration,
}

impl FaultRates {
    /// No faults: every call applies and answers.
    pub const NONE: FaultRates = FaultRates {
        fail_before: 0,
        lose_answer: 0,
        delay: 0,
        max_delay: Duration::ZERO,
    };
}

impl Default for FaultRates {
    /// One call in ten fails before, one in ten loses its answer, one in
    /// ten is delayed up to a minute (past a queue hold or a blob lease).
    fn default() -> Self {
        FaultRates {
            fail_before: 10,
            lose_answer: 10,
            delay: 10,
            max_delay: Duration::from_secs(60),
        }
    }
}

/// A check of the whole system's state, run after every step; `Err` names
/// the invariant broken.
pub type Check = Box<dyn Fn() -> Result<(), String> + Send + Sync>;

struct Inner {
    rng: StdRng,
    rates: FaultRates,
    trace: Vec<String>,
    /// Tokio's time at the run's first step: each step of the trace is
    /// stamped with the time since, so two runs of a seed compare in time
    /// as well as in order.
    first_step: Option<tokio::time::Instant>,
    checks: Vec<Check>,
    /// The first invariant broken, and the step after which it was.
    broken: Option<String>,
}

/// Shared by every faulty store and every process of one run (clones
/// share it). The run is deterministic as long as every random choice
/// that shapes it comes from here and the runtime is a paused
/// current-thread one (see [`super::run_seed`]).
#[derive(Clone)]
pub struct FaultPlan {
    inner: Arc<Mutex<Inner>>,
}

impl Inner {
    /// Adds `step` to the trace, stamped with tokio's time since the
    /// first step (on the run's paused clock, the same in every run of a
    /// seed); unstamped outside a runtime, where there is no such clock.
    fn push(&mut self, step: String) {
        if tokio::runtime::Handle::try_current().is_err() {
            self.trace.push(step);
            return;
        }
        let now = tokio::time::Instant::now();
        let since = now - *self.first_step.get_or_insert(now);
        self.trace
            .push(format!("{:>8.3}s {step}", since.as_secs_f64()));
    }
}

impl FaultPlan {
    /// A plan for `seed`, choosing faults at `rates`.
    pub fn new(seed: u64, rates: FaultRates) -> Self {
        FaultPlan {
            inner: Arc::new(Mutex::new(Inner {
                rng: StdRng::seed_from_u64(seed),
                rates,
                trace: Vec::new(),
                first_step: None,
                checks: Vec::new(),
                broken: None,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The fault for the call `what` (a store and an operation), recorded
    /// in the trace.
    pub fn decide(&self, what: &str) -> Fault {
        let mut inner = self.lock();
        let rates = inner.rates;
        let roll = inner.rng.random_range(0..100u32);
        let fault = if roll < rates.fail_before {
            Fault::FailBefore
        } else if roll < rates.fail_before + rates.lose_answer {
            Fault::LoseAnswer
        } else if roll < rates.fail_before + rates.lose_answer + rates.delay
            && !rates.max_delay.is_zero()
        {
            let ms = inner
                .rng
                .random_range(1..=rates.max_delay.as_millis().max(1) as u64);
            Fault::Delay(Duration::from_millis(ms))
        } else {
            Fault::None
        };
        let line = match fault {
            Fault::None => what.to_owned(),
            Fault::FailBefore => format!("{what} -> fails before applying"),
            Fault::LoseAnswer => format!("{what} -> applies, answer lost"),
            Fault::Delay(d) => format!("{what} -> delayed {d:?}"),
        };
        inner.push(line);
        fault
    }

    /// True with probability `percent` in 100: a process's own choice
    /// (stop here? wait how long?), from the same seeded stream.
    pub fn chance(&self, percent: u32) -> bool {
        self.lock().rng.random_range(0..100u32) < percent
    }

    /// A number in `range`, from the same seeded stream.
    pub fn pick(&self, range: std::ops::Range<u64>) -> u64 {
        self.lock().rng.random_range(range)
    }

    /// A number in `0..=max`, from the same seeded stream: the library's
    /// jitter ([`super::PlanClock`]).
    pub fn jitter(&self, max: u64) -> u64 {
        self.lock().rng.random_range(0..=max)
    }

    /// Records a step a process took (not a store call) in the trace.
    pub fn note(&self, step: impl Into<String>) {
        self.lock().push(step.into());
    }

    /// Adds an invariant checked after every step from now on.
    pub fn check(&self, check: impl Fn() -> Result<(), String> + Send + Sync + 'static) {
        self.lock().checks.push(Box::new(check));
    }

    /// Runs every check (the faulty stores call this after each call
    /// applies); the first one broken is kept, with the step it followed.
    pub fn after_step(&self) {
        let mut inner = self.lock();
        if inner.broken.is_some() {
            return;
        }
        let broken = inner.checks.iter().find_map(|check| check().err());
        if let Some(broken) = broken {
            let step = inner.trace.len();
            inner.broken = Some(format!("{broken} (after step {step})"));
            inner.push(format!("!! {broken}"));
        }
    }

    /// Records `broken` as an invariant broken now (a check only the end
    /// of a run, or a process, can make).
    pub fn broken(&self, broken: impl Into<String>) {
        let broken = broken.into();
        let mut inner = self.lock();
        inner.push(format!("!! {broken}"));
        if inner.broken.is_none() {
            let step = inner.trace.len();
            inner.broken = Some(format!("{broken} (step {step})"));
        }
    }

    /// The first invariant broken, if any.
    pub fn first_broken(&self) -> Option<String> {
        self.lock().broken.clone()
    }

    /// Every step so far, in order.
    pub fn trace(&self) -> Vec<String> {
        self.lock().trace.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_seed_makes_the_same_decisions_every_time() {
        let decide = |seed| {
            let plan = FaultPlan::new(seed, FaultRates::default());
            (0..200)
                .map(|i| plan.decide(&format!("call {i}")))
                .collect::<Vec<_>>()
        };
        assert_eq!(decide(7), decide(7));
        assert_ne!(decide(7), decide(8));
    }

    /// Inside a run each step carries tokio's time since the first, so
    /// two runs of a seed that waited differently do not compare equal.
    #[test]
    fn steps_are_stamped_with_the_runs_clock() {
        let plan = FaultPlan::new(1, FaultRates::NONE);
        plan.note("outside");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        runtime.block_on(async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            plan.note("first");
            tokio::time::sleep(Duration::from_millis(1_500)).await;
            plan.decide("call");
        });
        assert_eq!(
            plan.trace(),
            ["outside", "   0.000s first", "   1.500s call"]
        );
    }

    #[test]
    fn no_rates_no_faults() {
        let plan = FaultPlan::new(1, FaultRates::NONE);
        assert!((0..100).all(|_| plan.decide("call") == Fault::None));
    }

    #[test]
    fn the_first_broken_invariant_is_kept_with_its_step() {
        let plan = FaultPlan::new(1, FaultRates::NONE);
        let armed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let seen = Arc::clone(&armed);
        plan.check(move || {
            if seen.load(std::sync::atomic::Ordering::SeqCst) {
                Err("broken".to_owned())
            } else {
                Ok(())
            }
        });
        plan.decide("first");
        plan.after_step();
        assert_eq!(plan.first_broken(), None);
        armed.store(true, std::sync::atomic::Ordering::SeqCst);
        plan.decide("second");
        plan.after_step();
        assert_eq!(
            plan.first_broken().as_deref(),
            Some("broken (after step 2)")
        );
    }
}
