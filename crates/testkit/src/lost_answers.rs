//! [`LostAnswerStore`]: any [`CheckpointStore`] (and the [`ChunkStore`]
//! it hands out) whose calls fail on a plan the test writes, either
//! before they reach the store or after they applied: the answer lost on
//! the way back ([`Fault::AnswerLost`], what a timeout, a reset connection
//! or a dropped response does to a write that landed). The caller sees
//! `Unavailable` either way and cannot tell which; a correct caller must
//! treat such a write as possibly landed.
//!
//! A [`Policy`] of the one store layer ([`crate::store_layer`]). Faults
//! are planned per kind of call ([`StoreCall`]), first planned
//! first used, or decided for every call by a function of the call (a
//! seeded fault search: [`LostAnswerStore::deciding`]). Every fault that
//! fired is recorded, so a test can say what happened.
//!
//! ```
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! use std::sync::Arc;
//! use spot_worker_storage::{Checkpoint, CheckpointStore, InMemoryCheckpointStore, WritePrecondition};
//! use spot_worker_testkit::lost_answers::{Fault, LostAnswerStore, StoreCall};
//!
//! let inner = InMemoryCheckpointStore::new();
//! let store = LostAnswerStore::new(Arc::new(inner.clone()));
//! store.plan(StoreCall::CheckpointWrite, Fault::AnswerLost);
//! let saved = Checkpoint::InProgress { progress: serde_json::json!(1) };
//! let answer = store.write("job", &saved, WritePrecondition::Create, None).await;
//! assert!(answer.unwrap_err().is_transient());
//! assert_eq!(inner.get("job"), Some(saved), "it landed all the same");
//! assert_eq!(store.fired(), [(StoreCall::CheckpointWrite, Fault::AnswerLost)]);
//! # });
//! ```

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use spot_worker_storage::CheckpointStore;

pub use crate::store_layer::StoreCall;
use crate::store_layer::{Action, Call, Layered, Policy};

/// What happens to one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Fails as `Unavailable` without reaching the store.
    Before,
    /// Applied by the store, then answered `Unavailable`.
    AnswerLost,
}

/// Decides the fault of each call, if any (a seeded search's dice).
pub type Decider = Box<dyn FnMut(StoreCall) -> Option<Fault> + Send>;

#[derive(Default)]
struct Plan {
    /// `None`: a call planned to go through (so a fault lands on a later one).
    planned: HashMap<StoreCall, VecDeque<Option<Fault>>>,
    decider: Option<Decider>,
    fired: Vec<(StoreCall, Fault)>,
}

/// The [`Policy`] of a [`LostAnswerStore`]: faults planned per kind of
/// call, then decided by a function of the call, each one that fired
/// recorded.
#[derive(Default)]
pub struct Planned {
    plan: Mutex<Plan>,
}

/// A checkpoint store with planned faults (see the module doc). Clones
/// share the plan and the record.
pub type LostAnswerStore = Layered<Planned>;

impl Layered<Planned> {
    /// `inner`, with no fault planned.
    pub fn new(inner: Arc<dyn CheckpointStore>) -> Self {
        Layered::wrap(inner, Planned::default())
    }

    /// `inner`, each call's fault decided by `decider` (after any planned
    /// with [`LostAnswerStore::plan`]).
    pub fn deciding(inner: Arc<dyn CheckpointStore>, decider: Decider) -> Self {
        let store = Self::new(inner);
        store.policy().lock().decider = Some(decider);
        store
    }

    /// The next call of kind `call` not yet planned gets `fault`.
    pub fn plan(&self, call: StoreCall, fault: Fault) {
        self.policy()
            .lock()
            .planned
            .entry(call)
            .or_default()
            .push_back(Some(fault));
    }

    /// The next call of kind `call` not yet planned goes through: a
    /// fault planned after it lands on the one after.
    pub fn plan_clean(&self, call: StoreCall) {
        self.policy()
            .lock()
            .planned
            .entry(call)
            .or_default()
            .push_back(None);
    }

    /// The faults that fired, in order.
    pub fn fired(&self) -> Vec<(StoreCall, Fault)> {
        self.policy().lock().fired.clone()
    }
}

impl Planned {
    fn lock(&self) -> MutexGuard<'_, Plan> {
        self.plan.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Policy for Planned {
    fn decide(&self, call: &Call<'_>) -> Action {
        let mut plan = self.lock();
        let kind = call.kind;
        let fault = match plan.planned.get_mut(&kind).and_then(VecDeque::pop_front) {
            Some(planned) => planned,
            None => plan.decider.as_mut().and_then(|decide| decide(kind)),
        };
        match fault {
            None => Action::Pass,
            Some(fault) => {
                plan.fired.push((kind, fault));
                match fault {
                    Fault::Before => Action::FailBefore,
                    Fault::AnswerLost => Action::LoseAnswer,
                }
            }
        }
    }
}
