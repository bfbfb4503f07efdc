//! The worker as systemd runs it on the VM: the installed binary, exactly
//! the rendered environment file (plus systemd's default `PATH`), its
//! readiness read from the health address the environment names, and its
//! JSON log kept for assertions and the transcript.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::common::start_worker;

/// Bound of every wait: generous for a slow machine, finite for a bug.
pub const PATIENCE: Duration = Duration::from_secs(120);
/// systemd's `PATH` for services.
pub const SYSTEMD_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// A running worker process.
pub struct Vm {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    readyz: String,
    healthz: String,
    http: reqwest::Client,
}

impl Vm {
    /// Starts `binary` with exactly `env` (and systemd's `PATH`).
    pub fn start(binary: &Path, env: &BTreeMap<String, String>) -> Vm {
        Vm::exec(binary, &[], None, env)
    }

    /// Starts `binary args` in `dir` (the unit's `WorkingDirectory`, if it
    /// has one) with exactly `env` (and systemd's `PATH`).
    pub fn exec(
        binary: &Path,
        args: &[String],
        dir: Option<&Path>,
        env: &BTreeMap<String, String>,
    ) -> Vm {
        let mut command = Command::new(binary);
        if let Some(dir) = dir {
            command.current_dir(dir);
        }
        command
            .args(args)
            .env_clear()
            .envs(env)
            .env("PATH", SYSTEMD_PATH);
        Vm::spawn(command, &env["SPOT_WORKER_HEALTH_ADDR"])
    }

    /// Starts `command` (its output kept as the log), whose worker serves
    /// `/readyz` at `health_addr`; the pod in a box starts `podman run` so.
    pub fn spawn(mut command: Command, health_addr: &str) -> Vm {
        let mut child = start_worker(&mut command, Stdio::piped());
        let lines = Arc::new(Mutex::new(Vec::new()));
        for stream in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn tokio::io::AsyncRead + Unpin + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let lines = Arc::clone(&lines);
            tokio::spawn(async move {
                let mut reader = BufReader::new(stream).lines();
                while let Ok(Some(line)) = reader.next_line().await {
                    lines.lock().unwrap().push(line);
                }
            });
        }
        Vm {
            child,
            lines,
            readyz: format!("http://{health_addr}/readyz"),
            healthz: format!("http://{health_addr}/healthz"),
            http: reqwest::Client::builder()
                .no_proxy()
                .timeout(Duration::from_secs(5))
                .build()
                .unwrap(),
        }
    }

    /// Everything the worker logged so far.
    pub fn log(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }

    /// The messages of the log lines (JSON) containing `needle`, with their
    /// fields, for the transcript.
    pub fn transcript(&self, needles: &[&str]) -> Vec<String> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|line| needles.iter().any(|n| line.contains(n)))
            .map(|line| summarise(line))
            .collect()
    }

    /// `/readyz` as JSON, once it answers.
    async fn readiness(&self) -> Option<(u16, Value)> {
        let response = self.http.get(&self.readyz).send().await.ok()?;
        let status = response.status().as_u16();
        Some((status, response.json().await.ok()?))
    }

    /// `/healthz`'s status now (`None`: no answer), what the scale set's
    /// health extension probes.
    pub async fn liveness(&self) -> Option<u16> {
        let response = self.http.get(&self.healthz).send().await.ok()?;
        Some(response.status().as_u16())
    }

    /// `/readyz` as JSON, once it answers (status and body).
    pub async fn readiness_now(&self) -> Option<(u16, Value)> {
        self.readiness().await
    }

    /// Whether `/readyz` answers 200 now.
    pub async fn is_ready(&self) -> bool {
        matches!(self.readiness().await, Some((200, _)))
    }

    /// Waits until `/readyz` answers 200; fails at once if the worker exits.
    pub async fn until_ready(&mut self) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            self.assert_running("becoming ready");
            if let Some((200, _)) = self.readiness().await {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "not ready within {PATIENCE:?}; log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until `/readyz` says 503 with `gate` waiting on an error that
    /// contains `needle`; returns that error. The worker must stay up.
    pub async fn until_gate_fails_with(&mut self, gate: &str, needle: &str) -> String {
        let deadline = Instant::now() + PATIENCE;
        let mut last = Value::Null;
        loop {
            self.assert_running("waiting at its warmup gate");
            if let Some((status, body)) = self.readiness().await {
                assert_ne!(status, 200, "ready although it must not be: {body}");
                let detail = body[gate]["detail"].as_str().unwrap_or_default().to_owned();
                if detail.contains(needle) {
                    return detail;
                }
                last = body;
            }
            assert!(
                Instant::now() < deadline,
                "/readyz never showed {needle:?} for {gate} within {PATIENCE:?}; last: {last}\nlog:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub fn assert_running(&mut self, doing: &str) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!(
                "the worker exited ({status}) while {doing}; log:\n{}",
                self.log()
            );
        }
    }

    /// Waits (bounded by `limit`) for the worker to exit by itself.
    pub async fn exit_within(&mut self, limit: Duration) -> ExitStatus {
        match tokio::time::timeout(limit, self.child.wait()).await {
            Ok(status) => status.unwrap(),
            Err(_) => panic!(
                "the worker did not exit within {limit:?}; log:\n{}",
                self.log()
            ),
        }
    }

    /// Stops the worker as systemd does (SIGTERM) and waits for it.
    pub async fn stop(&mut self) -> ExitStatus {
        if let Some(pid) = self.child.id() {
            // SAFETY: kill(2) has no memory-safety preconditions; the pid is
            // our child's, which has not been reaped yet.
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGTERM);
            }
        }
        self.exit_within(Duration::from_secs(30)).await
    }
}

/// One JSON log line as `message key=value ...` (the line itself if it is
/// not JSON).
fn summarise(line: &str) -> String {
    let Ok(Value::Object(entry)) = serde_json::from_str::<Value>(line) else {
        return line.to_owned();
    };
    let fields = entry.get("fields").and_then(Value::as_object);
    let message = fields
        .and_then(|f| f.get("message"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    let mut text = message.to_owned();
    for (key, value) in fields.into_iter().flatten() {
        if key != "message" {
            text.push_str(&format!(" {key}={value}"));
        }
    }
    text
}
