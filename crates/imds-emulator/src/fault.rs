//! Injected failures of the Scheduled Events endpoint, served in FIFO order
//! to the next well-formed Scheduled Events GETs, so that clients can be
//! tested against the ways the real service (or the network) misbehaves.

use std::collections::VecDeque;
use std::time::Duration;

use axum::http::StatusCode;

/// One way of answering a Scheduled Events GET badly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Answer with this status and a JSON error body.
    Status(StatusCode),
    /// Answer 200 with a truncated, invalid JSON document.
    Malformed,
    /// Close the TCP connection without sending any response.
    Drop,
    /// Answer correctly, but only after this delay.
    Delay(Duration),
}

impl Fault {
    /// The fault as the control API describes it.
    pub(crate) fn to_json(&self, count: u32) -> serde_json::Value {
        match self {
            Fault::Status(status) => {
                serde_json::json!({"kind": "status", "status": status.as_u16(), "count": count})
            }
            Fault::Malformed => serde_json::json!({"kind": "malformed", "count": count}),
            Fault::Drop => serde_json::json!({"kind": "drop", "count": count}),
            Fault::Delay(delay) => serde_json::json!({
                "kind": "delay",
                "millis": u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                "count": count,
            }),
        }
    }
}

/// Pending faults, each with how many more requests it applies to.
#[derive(Debug, Default)]
pub(crate) struct FaultQueue {
    pending: VecDeque<(Fault, u32)>,
}

impl FaultQueue {
    pub(crate) fn push(&mut self, fault: Fault, count: u32) {
        if count > 0 {
            self.pending.push_back((fault, count));
        }
    }

    /// The fault for the next request, if any.
    pub(crate) fn next(&mut self) -> Option<Fault> {
        let (fault, remaining) = self.pending.front_mut()?;
        let fault = fault.clone();
        *remaining -= 1;
        if *remaining == 0 {
            self.pending.pop_front();
        }
        Some(fault)
    }

    pub(crate) fn clear(&mut self) {
        self.pending.clear();
    }

    pub(crate) fn to_json(&self) -> Vec<serde_json::Value> {
        self.pending
            .iter()
            .map(|(fault, count)| fault.to_json(*count))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_are_served_fifo_with_counts() {
        let mut queue = FaultQueue::default();
        queue.push(Fault::Status(StatusCode::SERVICE_UNAVAILABLE), 2);
        queue.push(Fault::Drop, 0);
        queue.push(Fault::Malformed, 1);
        assert_eq!(
            queue.next(),
            Some(Fault::Status(StatusCode::SERVICE_UNAVAILABLE))
        );
        assert_eq!(
            queue.next(),
            Some(Fault::Status(StatusCode::SERVICE_UNAVAILABLE))
        );
        assert_eq!(queue.next(), Some(Fault::Malformed));
        assert_eq!(queue.next(), None);
    }
}
