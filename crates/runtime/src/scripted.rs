//! [`Scripted`]: the keepers' tests' stand-in for what a keeper writes to
//! (the VM's scale-in protection, the pod's deletion cost): it records
//! every call and answers from a script, success once the script is empty.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// Calls of `T` answered from a script of `Result<(), E>`.
pub(crate) struct Scripted<T, E> {
    answers: Mutex<VecDeque<Result<(), E>>>,
    calls: Mutex<Vec<T>>,
}

impl<T, E> Default for Scripted<T, E> {
    fn default() -> Self {
        Scripted {
            answers: Mutex::default(),
            calls: Mutex::default(),
        }
    }
}

fn lock<V>(mutex: &Mutex<V>) -> MutexGuard<'_, V> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<T: Clone + std::fmt::Debug, E> Scripted<T, E> {
    /// Answers `script` in order, then success.
    pub(crate) fn new(script: Vec<Result<(), E>>) -> Self {
        Scripted {
            answers: Mutex::new(script.into()),
            calls: Mutex::default(),
        }
    }

    /// Records `call` and gives the next answer.
    pub(crate) fn answer(&self, call: T) -> Result<(), E> {
        lock(&self.calls).push(call);
        lock(&self.answers).pop_front().unwrap_or(Ok(()))
    }

    /// The calls so far, in order.
    pub(crate) fn calls(&self) -> Vec<T> {
        lock(&self.calls).clone()
    }

    /// Lets the keeper's task run until `n` calls were made (bounded: the
    /// target answers at once).
    pub(crate) async fn until_calls(&self, n: usize) {
        for _ in 0..10_000 {
            if lock(&self.calls).len() >= n {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("the keeper made {:?}, not {n} calls", self.calls());
    }

    /// As [`Scripted::until_calls`], the paused clock moving on a second
    /// at a time meanwhile (for a keeper that waits out a backoff).
    pub(crate) async fn until_calls_in_time(&self, n: usize) {
        for _ in 0..10_000 {
            if lock(&self.calls).len() >= n {
                return;
            }
            tokio::task::yield_now().await;
            if lock(&self.calls).len() < n {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
        panic!("the keeper made {:?}, not {n} calls", self.calls());
    }
}
