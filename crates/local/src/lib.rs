//! Local stand-ins for development: what `spot-worker dev` and `spot-worker
//! demo --azurite` run on a laptop, and what the test kit starts per test.
//!
//! [`Azurite`] starts a real [Azurite](https://github.com/Azure/Azurite)
//! storage emulator: on free loopback ports with a temporary workspace
//! ([`Azurite::start`]), or on the ports `UseDevelopmentStorage=true` names
//! ([`Azurite::start_on`]); a bounded wait until it answers, and a stop
//! (SIGTERM, so it flushes its data) on drop. It can be stopped and started
//! again on the same ports and data, to test recovery from a storage outage.
//! The IMDS stand-in is its own crate, `spot-worker-imds-emulator`.
//!
//! Readiness is proven over HTTP, not just by a TCP accept: each instance
//! gets an extra storage account with a random name (`AZURITE_ACCOUNTS`),
//! and only an Azurite that knows that account answers a request for it
//! with 403 (any other answers 404). So another Azurite, or any other
//! server that took one of our ports while we were stopped, is never
//! mistaken for ours. A port taken by someone else makes Azurite exit with
//! `EADDRINUSE`, reported as [`HarnessError::PortInUse`].
//!
//! [`Azurite::start_separate`] serves blob and queue from two processes
//! (`azurite-blob`, `azurite-queue`) instead of one; see [`topology`].
//!
//! [`Azurite::start_https`] starts it as production looks instead: HTTPS
//! with a given certificate, OAuth (`--oauth basic`: bearer tokens are
//! checked for issuer, audience and lifetime), a named account, and blob and
//! queue on port 443 of addresses of the caller's choosing (inside a network
//! namespace, where `https://<account>.blob.core.windows.net` resolves to
//! them).
//!
//! Which `azurite` runs ([`find_azurite`]): the one `AZURITE_BIN` names, else
//! `tools/azurite/node_modules/.bin/azurite` in the current directory or one
//! of its parents (a clone of spot-worker after `npm ci --prefix
//! tools/azurite`), else `azurite` on `PATH` (`npm install -g azurite`).
//! Nothing here knows where it was built: no path of the build machine is
//! compiled in.

mod azurite;

pub use azurite::topology;
pub use azurite::{
    ACCOUNT_KEY, ACCOUNT_NAME, Azurite, AzuriteProcess, DEV_PORTS, HarnessError, HttpsOptions,
    Topology, azurite_answers, find_azurite,
};
