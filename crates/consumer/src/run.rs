//! The receive loop: receive in batches as slots free up, back off while
//! the queue is empty or the store cannot serve, and on shutdown release
//! every message still held.

use super::*;

impl Consumer {
    /// Consumes until `shutdown` is cancelled, then drops every handler,
    /// makes its message visible again at once, and returns the statistics.
    /// Storage errors are logged and retried with backoff, never returned:
    /// a worker keeps trying until it is told to stop.
    pub async fn run<H: MessageHandler>(
        &self,
        handler: H,
        shutdown: CancellationToken,
    ) -> ConsumerStats {
        let signals = DrainSignals::new();
        let release = signals.clone();
        let forward = tokio::spawn(async move {
            shutdown.cancelled().await;
            release.release();
        });
        let stats = self.run_until(handler, signals).await;
        forward.abort();
        stats
    }

    /// Consumes until told to stop, in the stages of [`DrainSignals`]:
    /// stop receiving, wind handlers down, release what is left. Returns when
    /// no message is in flight any more.
    pub async fn run_until<H: MessageHandler>(
        &self,
        handler: H,
        signals: DrainSignals,
    ) -> ConsumerStats {
        let signals = signals.for_run();
        let handler = Arc::new(handler);
        let config = &self.config;
        let slots = Arc::new(Semaphore::new(config.max_in_flight));
        let mut idle = IdleBackoff::new(config.idle_backoff_floor, config.idle_backoff_max);
        let mut jobs = JoinSet::new();
        let batch = usize::from(config.batch_size).min(config.max_in_flight);
        let mut last = LastReceive::Empty;
        tracing::info!(queue = self.queue.name(), "consumer started");
        loop {
            while let Some(result) = jobs.try_join_next() {
                log_join_error(result);
            }
            let wait = slot_wait(last, batch, config.receive_fill_wait);
            let Some(permits) = self.acquire_slots(&slots, &signals, wait).await else {
                break;
            };
            if !self.monitor.current().is_healthy() {
                // Receiving now would only churn the backlog through
                // deliveries that cannot write.
                drop(permits);
                if !self.wait_while_paused(&signals).await {
                    break;
                }
                last = LastReceive::Empty;
                continue;
            }
            let wanted = u8::try_from(permits.len()).unwrap_or(config.batch_size);
            // Leases are timed from before the request: the service starts
            // the visibility timeout somewhere between sending and answering.
            let received_at = Instant::now();
            let receive = self.queue.receive(wanted, config.visibility_timeout);
            tokio::pin!(receive);
            let received = tokio::select! {
                biased;
                result = &mut receive => result,
                _ = signals.stopping() => {
                    // A receive the service already answered hid its messages;
                    // let it finish (briefly) so they can be released at once.
                    let answered = tokio::time::timeout(config.settle_timeout, receive).await;
                    signals.close_intake();
                    if let Ok(Ok(messages)) = answered {
                        self.release_unstarted(messages).await;
                    }
                    break;
                }
            };
            last = match &received {
                Ok(messages) => LastReceive::of(usize::from(wanted), messages.len()),
                Err(_) => LastReceive::Empty,
            };
            let delay = match received {
                Ok(messages) if !messages.is_empty() => {
                    idle.reset();
                    let mut permits = permits.into_iter();
                    let mut extras = Vec::new();
                    for message in messages {
                        let Some(permit) = permits.next() else {
                            extras.push(message);
                            continue;
                        };
                        bump(&self.counters.received);
                        let span = (self.message_span)(self.queue.name(), &message);
                        let task = self.clone().process(
                            message,
                            received_at,
                            Arc::clone(&handler),
                            signals.wind_down.child_token(),
                            signals.clone(),
                            permit,
                        );
                        jobs.spawn(task.instrument(span));
                    }
                    if !extras.is_empty() {
                        // Nothing would renew or settle them: they would stay
                        // hidden for a whole visibility timeout for nothing.
                        tracing::warn!(
                            queue = self.queue.name(),
                            asked_for = wanted,
                            extra = extras.len(),
                            "the queue returned more messages than asked for; releasing the extra ones"
                        );
                        let worker = self.clone();
                        jobs.spawn(async move { worker.release_unstarted(extras).await });
                    }
                    continue;
                }
                Ok(_) => idle.next_delay(&*self.clock),
                Err(error) => {
                    bump(&self.counters.receive_errors);
                    tracing::warn!(queue = self.queue.name(), %error, "receive failed; backing off");
                    idle.next_delay(&*self.clock)
                }
            };
            tokio::select! {
                _ = signals.stopping() => break,
                _ = tokio::time::sleep(delay) => {}
            }
        }
        signals.close_intake();
        tracing::info!(
            queue = self.queue.name(),
            in_flight = jobs.len(),
            "consumer stopping"
        );
        while let Some(result) = jobs.join_next().await {
            log_join_error(result);
        }
        self.stats()
    }

    /// Waits for at least one free slot, then takes as many more as one
    /// batch can use: those free now, and, up to `wait.slots`, those that
    /// free within `wait.at_most` as long as no pause between two of them
    /// lasts `wait.gap`. `None` means shutdown.
    pub(super) async fn acquire_slots(
        &self,
        slots: &Arc<Semaphore>,
        shutdown: &DrainSignals,
        wait: SlotWait,
    ) -> Option<Vec<OwnedSemaphorePermit>> {
        let first = tokio::select! {
            biased;
            _ = shutdown.stopping() => return None,
            permit = Arc::clone(slots).acquire_owned() => permit.ok()?,
        };
        let mut permits = vec![first];
        while permits.len() < usize::from(self.config.batch_size) {
            match Arc::clone(slots).try_acquire_owned() {
                Ok(permit) => permits.push(permit),
                Err(_) => break,
            }
        }
        let deadline = Instant::now() + wait.at_most;
        while permits.len() < wait.slots.min(usize::from(self.config.batch_size)) {
            let pause_ends = (Instant::now() + wait.gap).min(deadline);
            tokio::select! {
                biased;
                _ = shutdown.stopping() => return None,
                permit = Arc::clone(slots).acquire_owned() => permits.push(permit.ok()?),
                () = tokio::time::sleep_until(pause_ends) => break,
            }
        }
        Some(permits)
    }
}

fn log_join_error(result: Result<(), tokio::task::JoinError>) {
    if let Err(error) = result {
        tracing::error!(%error, "message task panicked or was aborted");
    }
}
