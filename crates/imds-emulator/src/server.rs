//! The HTTP server: routing (on a listener whose connections can be dropped
//! on purpose, [`killable`](crate::killable)) and the handle of a running emulator.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::http::{StatusCode, Uri};
use axum::response::Response;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::config::EmulatorConfig;
use crate::emulator::Emulator;
use crate::killable::{KillSwitch, KillableListener};
use crate::{control, entra, identity, identity_control, imds, response};

/// The whole HTTP API of `emulator`.
fn router(emulator: Emulator) -> Router {
    Router::new()
        .merge(imds::routes())
        .merge(identity::routes())
        .merge(entra::routes())
        .merge(identity_control::routes())
        .merge(control::routes())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(emulator)
}

async fn not_found(
    axum::extract::State(emulator): axum::extract::State<Emulator>,
    uri: Uri,
) -> Response {
    // Unknown IMDS paths still count against the IMDS rate limit.
    if uri.path().starts_with("/metadata")
        && !emulator.with_state(|state| state.admit(std::time::Instant::now()))
    {
        return imds::throttled();
    }
    response::error(StatusCode::NOT_FOUND, format!("Not found: {}", uri.path()))
}

async fn method_not_allowed() -> Response {
    response::error(StatusCode::METHOD_NOT_ALLOWED, "Method not allowed")
}

/// How long [`RunningEmulator::shutdown`] waits for requests in flight.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

impl Emulator {
    /// Serves the IMDS and control APIs on `listener` until `shutdown`
    /// resolves, then finishes the requests in flight.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> io::Result<()> {
        let app = router(self).into_make_service_with_connect_info::<KillSwitch>();
        axum::serve(KillableListener(listener), app)
            .with_graceful_shutdown(shutdown)
            .await
    }

    /// Starts an emulator for `config` on `127.0.0.1` with a free port.
    pub async fn start(config: EmulatorConfig) -> io::Result<RunningEmulator> {
        let listener = TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).await?;
        Ok(Self::new(config).spawn(listener))
    }

    /// Serves this emulator on `listener` in a background task.
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime.
    pub fn spawn(self, listener: TcpListener) -> RunningEmulator {
        // A listener we were given is bound, so it has an address.
        let addr = listener
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)));
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(self.clone().serve(listener, async move {
            // A dropped sender means the handle is gone: stop as well.
            let _ = stopped.await;
        }));
        RunningEmulator {
            addr,
            emulator: self,
            stop: Some(stop),
            task: Some(task),
        }
    }
}

/// An emulator serving HTTP in a background task; stops when shut down or
/// dropped. Dereferences to its [`Emulator`].
pub struct RunningEmulator {
    addr: SocketAddr,
    emulator: Emulator,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<io::Result<()>>>,
}

impl std::fmt::Debug for RunningEmulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningEmulator")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl RunningEmulator {
    /// The base URL, e.g. `http://127.0.0.1:41234` (no trailing slash).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The address the emulator listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The emulator behind the server.
    pub fn emulator(&self) -> &Emulator {
        &self.emulator
    }

    /// Stops accepting connections and waits (at most 5 s) for the requests
    /// in flight; returns the server's error, if it failed.
    pub async fn shutdown(mut self) -> io::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let Some(mut task) = self.task.take() else {
            return Ok(());
        };
        match tokio::time::timeout(SHUTDOWN_GRACE, &mut task).await {
            Ok(Ok(result)) => result,
            Ok(Err(join_error)) => Err(io::Error::other(join_error)),
            Err(_elapsed) => {
                task.abort();
                Ok(())
            }
        }
    }
}

impl std::ops::Deref for RunningEmulator {
    type Target = Emulator;

    fn deref(&self) -> &Emulator {
        &self.emulator
    }
}

impl Drop for RunningEmulator {
    fn drop(&mut self) {
        // The server task notices the closed channel and shuts down
        // gracefully on its own.
        self.stop.take();
    }
}
