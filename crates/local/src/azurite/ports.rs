//! Loopback ports for Azurite: free ones from the OS, reserved for the
//! Azurite of this process that took them until it is dropped.

use std::collections::HashSet;
use std::net::{Ipv4Addr, TcpListener};
use std::sync::{Mutex, MutexGuard};

/// Ports handed to an Azurite of this process and not yet released (on
/// drop). Parallel tests run in one process; without this, a test's
/// [`free_port`] could pick a port of another test's Azurite while that one
/// is stopped for an outage, and its restart would fail.
pub(super) static RESERVED_PORTS: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

pub(super) fn reserved_ports() -> MutexGuard<'static, Option<HashSet<u16>>> {
    RESERVED_PORTS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Three distinct free ports, none of them reserved by another Azurite of
/// this process; they stay reserved until that Azurite is dropped.
pub(super) fn reserve_ports() -> std::io::Result<[u16; 3]> {
    let mut reserved = reserved_ports();
    let set = reserved.get_or_insert_with(HashSet::new);
    let mut ports = [0; 3];
    for slot in &mut ports {
        // Bounded: the OS hands out ports from a large range, and only a
        // handful are reserved at any time.
        let mut found = None;
        for _ in 0..100 {
            let port = free_port()?;
            if set.insert(port) {
                found = Some(port);
                break;
            }
        }
        *slot = found.ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                "no free loopback port that is not already reserved",
            )
        })?;
    }
    Ok(ports)
}

fn free_port() -> std::io::Result<u16> {
    // The OS picks a free port. Another process may take it before Azurite
    // binds it (then `start` retries on fresh ports), or while Azurite is
    // stopped (then `start_again` reports `PortInUse`); other Azurites of this
    // process avoid it through `RESERVED_PORTS`.
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(listener.local_addr()?.port())
}
