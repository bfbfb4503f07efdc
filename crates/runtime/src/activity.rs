//! What the worker holds, as one signal others subscribe to: the number of
//! messages whose handler is running, as a `tokio::sync::watch` owned by the
//! [`Worker`](crate::Worker) (issue 39).
//!
//! Whatever follows the worker's busy and idle periods reads this one
//! channel: the scale-in protection keeper
//! ([`scale_in_protection::keep`](crate::scale_in_protection::keep)), and
//! any other keeper or record of busy and idle time
//! ([`Worker::activity`](crate::Worker::activity)). The count changes when a
//! handler starts and when it returns (or is dropped), so two changes close
//! together may reach a subscriber as one: it sees the latest count, which
//! is what a busy/idle decision needs.

use std::sync::Arc;

use tokio::sync::watch;

/// The number of running handlers, shared by the worker and its handler.
#[derive(Clone, Debug)]
pub struct WorkerActivity {
    held: Arc<watch::Sender<usize>>,
}

impl Default for WorkerActivity {
    fn default() -> Self {
        Self {
            held: Arc::new(watch::channel(0).0),
        }
    }
}

impl WorkerActivity {
    /// A receiver of the count (0: idle).
    pub fn subscribe(&self) -> watch::Receiver<usize> {
        self.held.subscribe()
    }

    /// Counts one more message held until the guard is dropped.
    pub(crate) fn hold(&self) -> Held {
        self.held.send_modify(|held| *held = held.saturating_add(1));
        Held {
            held: Arc::clone(&self.held),
        }
    }
}

/// One message held: counted down when dropped, however the handler ends.
#[derive(Debug)]
pub(crate) struct Held {
    held: Arc<watch::Sender<usize>>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.held.send_modify(|held| *held = held.saturating_sub(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_count_follows_the_guards_whatever_order_they_end_in() {
        let activity = WorkerActivity::default();
        let seen = activity.subscribe();
        let first = activity.hold();
        let second = activity.hold();
        assert_eq!(*seen.borrow(), 2);
        drop(first);
        assert_eq!(*seen.borrow(), 1);
        drop(second);
        assert_eq!(*seen.borrow(), 0);
    }
}
