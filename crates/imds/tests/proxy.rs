//! IMDS calls must never go through a proxy, whatever the environment says:
//! a proxy would see, or answer for, the metadata service.
//!
//! This binary holds a single test because it changes the process
//! environment.

mod common;

use common::*;

#[tokio::test]
async fn proxy_variables_are_ignored() {
    let emulator = emulator().await;
    // A proxy that refuses every connection: going through it would fail.
    for name in ["HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"] {
        // SAFETY: the only test in this binary, set before any other thread
        // reads the environment through the client below.
        unsafe { std::env::set_var(name, "http://127.0.0.1:9") };
    }
    for name in ["NO_PROXY", "no_proxy"] {
        // SAFETY: as above.
        unsafe { std::env::remove_var(name) };
    }
    let document = client(&emulator.url())
        .scheduled_events()
        .await
        .expect("reached directly, not through the proxy");
    assert_eq!(document.incarnation, 1);
}
