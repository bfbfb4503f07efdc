//! What goes wrong on real VMs, each with a clear error in `/readyz` and
//! nothing taken from the queue: a client id IMDS does not know, a token
//! storage refuses, a certificate the VM does not trust, and a dead proxy
//! (which must not stop the token request, since IMDS is never proxied).

use std::collections::BTreeMap;
use std::path::Path;

use spot_worker::azure::AzureQueue;

use super::the_box::{TheBox, assert_untouched, note, start_azurite};
use super::vm::Vm;

impl TheBox {
    pub async fn wrong_client_id(
        &self,
        binary: &Path,
        env: &BTreeMap<String, String>,
        queue: &AzureQueue,
    ) {
        let wrong = "11111111-2222-3333-4444-555555555555";
        let mut env = env.clone();
        env.insert("AZURE_CLIENT_ID".into(), wrong.into());
        let mut vm = Vm::start(binary, &env);
        let error = vm.until_gate_fails_with("storage", wrong).await;
        assert!(
            error.contains("AZURE_CLIENT_ID") && error.contains("IMDS refused the client id"),
            "{error}"
        );
        assert!(vm.stop().await.success());
        assert_untouched(queue).await;
        note(format!(
            "wrong client id: not ready, /readyz storage: {error}"
        ));
    }

    pub async fn token_storage_refuses(
        &self,
        binary: &Path,
        env: &BTreeMap<String, String>,
        queue: &AzureQueue,
    ) {
        self.identity(serde_json::json!({"issuer": "https://issuer.invalid/"}))
            .await;
        let mut vm = Vm::start(binary, env);
        let error = vm.until_gate_fails_with("storage", "403").await;
        assert!(error.contains("AuthenticationFailed"), "{error}");
        assert!(vm.stop().await.success());
        self.identity(serde_json::json!({"issuer": null})).await;
        assert_untouched(queue).await;
        note(format!(
            "token with a wrong issuer: not ready, /readyz storage: {error}"
        ));
    }

    pub async fn untrusted_certificate(
        &self,
        binary: &Path,
        env: &BTreeMap<String, String>,
        queue: &AzureQueue,
    ) {
        // The same names, served by a certificate from a CA the VM does not
        // trust (on other loopback addresses).
        let rogue = start_azurite(&self.account, &self.untrusted, ["127.0.0.5", "127.0.0.6"]);
        self.point_storage_at(["127.0.0.5", "127.0.0.6"]);
        let mut vm = Vm::start(binary, env);
        let error = vm.until_gate_fails_with("storage", "certificate").await;
        assert!(vm.stop().await.success());
        self.point_storage_at(["127.0.0.2", "127.0.0.3"]);
        drop(rogue);
        assert_untouched(queue).await;
        note(format!(
            "untrusted certificate: not ready, /readyz storage: {error}"
        ));
    }

    pub async fn dead_proxy(
        &self,
        binary: &Path,
        env: &BTreeMap<String, String>,
        queue: &AzureQueue,
    ) {
        // Storage would go through the proxy (it may, in real life); here the
        // proxy is dead, so only the token can succeed, and must.
        let mut env = env.clone();
        for name in [
            "HTTPS_PROXY",
            "HTTP_PROXY",
            "https_proxy",
            "http_proxy",
            "ALL_PROXY",
        ] {
            env.insert(name.into(), "http://127.0.0.9:9".into());
        }
        let tokens_before = self.emulator.tokens().len();
        let mut vm = Vm::start(binary, &env);
        let error = vm.until_gate_fails_with("storage", "tunnel error").await;
        assert!(vm.stop().await.success());
        let fetched = self.emulator.tokens().len() - tokens_before;
        assert!(
            fetched > 0,
            "the token request went around the proxy to IMDS; /readyz storage: {error}"
        );
        assert_untouched(queue).await;
        note(format!(
            "HTTP(S)_PROXY set to a dead proxy: {fetched} token(s) still fetched from IMDS directly; storage through the proxy fails: {error}"
        ));
    }
}
