//! [`Http`]: one client and one emulator's address, so that a test names
//! only the path and the body of each request it makes.

use reqwest::Client;
use serde_json::Value;
use spot_worker_imds_emulator::RunningEmulator;

use super::{
    Answer, VERSION, answer, approve, client, control_post, document, events, poll_until, unlimited,
};

/// An emulator without rate limit (as [`unlimited`]) and a client for it.
pub async fn unlimited_over_http() -> (RunningEmulator, Http) {
    let emulator = unlimited().await;
    let http = Http::to(&emulator);
    (emulator, http)
}

/// A client pointed at one running emulator.
pub struct Http {
    pub client: Client,
    pub base: String,
}

impl Http {
    pub fn to(emulator: &RunningEmulator) -> Self {
        Http {
            client: client(),
            base: emulator.url(),
        }
    }

    /// `POST {path}` on the control API with a JSON body.
    pub async fn control(&self, path: &str, body: Value) -> Answer {
        control_post(&self.client, &self.base, path, body).await
    }

    /// `POST /emulator/events`: lists a new event.
    pub async fn new_event(&self, body: Value) -> Answer {
        self.control("/emulator/events", body).await
    }

    /// `POST /emulator/faults`: queues faults for the Scheduled Events GETs.
    pub async fn fault(&self, body: Value) -> Answer {
        self.control("/emulator/faults", body).await
    }

    /// `POST /emulator/config`: changes the running emulator's settings.
    pub async fn configure(&self, body: Value) -> Answer {
        self.control("/emulator/config", body).await
    }

    /// `GET {path}` without the `Metadata` header (the control API's reads).
    pub async fn get(&self, path: &str) -> Answer {
        answer(self.client.get(format!("{}{path}", self.base))).await
    }

    /// `POST {path}` without a body.
    pub async fn post(&self, path: &str) -> Answer {
        answer(self.client.post(format!("{}{path}", self.base))).await
    }

    /// `DELETE {path}`.
    pub async fn delete(&self, path: &str) -> Answer {
        answer(self.client.delete(format!("{}{path}", self.base))).await
    }

    /// The instance metadata GET (api-version 2021-02-01), with the header.
    pub async fn instance(&self) -> Answer {
        self.instance_at("2021-02-01").await
    }

    /// The instance metadata GET at `version`, with the header.
    pub async fn instance_at(&self, version: &str) -> Answer {
        answer(
            self.client
                .get(format!(
                    "{}/metadata/instance?api-version={version}",
                    self.base
                ))
                .header("Metadata", "true"),
        )
        .await
    }

    /// The Scheduled Events GET at [`VERSION`], whatever it answers.
    pub async fn events(&self) -> Answer {
        events(&self.client, &self.base, VERSION).await
    }

    /// The current document, asserting a 200.
    pub async fn document(&self) -> Value {
        document(&self.client, &self.base).await
    }

    /// The Scheduled Events POST with `body`.
    pub async fn approve(&self, body: String) -> Answer {
        approve(&self.client, &self.base, body).await
    }

    /// The document once `done` holds for it (bounded as [`poll_until`]).
    pub async fn poll_until(&self, done: impl Fn(&Value) -> bool) -> Value {
        poll_until(&self.client, &self.base, done).await
    }
}
