//! The HTTP server: routing, a listener whose connections can be dropped on
//! purpose (for the `drop` fault), and the handle of a running emulator.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use axum::Router;
use axum::extract::connect_info::Connected;
use axum::http::{StatusCode, Uri};
use axum::response::Response;
use axum::serve::{IncomingStream, Listener};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::config::EmulatorConfig;
use crate::emulator::Emulator;
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

/// Lets a handler abort its own TCP connection: once killed, the
/// connection's reads and writes fail, so hyper gives up on it without
/// writing anything and closes the socket.
#[derive(Clone, Default)]
pub(crate) struct KillSwitch(Arc<KillState>);

#[derive(Default)]
struct KillState {
    killed: AtomicBool,
    /// The task reading the connection, woken so that it notices at once.
    reader: Mutex<Option<Waker>>,
}

impl KillSwitch {
    pub(crate) fn kill(&self) {
        self.0.killed.store(true, Ordering::SeqCst);
        let reader = self
            .0
            .reader
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(reader) = reader {
            reader.wake();
        }
    }

    fn check(&self) -> io::Result<()> {
        if self.0.killed.load(Ordering::SeqCst) {
            Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "connection dropped by an injected fault",
            ))
        } else {
            Ok(())
        }
    }

    fn register_reader(&self, waker: &Waker) {
        let mut reader = self.0.reader.lock().unwrap_or_else(PoisonError::into_inner);
        match &mut *reader {
            Some(current) if current.will_wake(waker) => {}
            _ => *reader = Some(waker.clone()),
        }
    }
}

impl Connected<IncomingStream<'_, KillableListener>> for KillSwitch {
    fn connect_info(stream: IncomingStream<'_, KillableListener>) -> Self {
        stream.io().switch.clone()
    }
}

/// A TCP listener whose connections carry a [`KillSwitch`].
pub(crate) struct KillableListener(TcpListener);

impl Listener for KillableListener {
    type Io = KillableStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        // axum's implementation retries failed accepts with a back-off.
        let (stream, addr) = Listener::accept(&mut self.0).await;
        // Small JSON answers should not wait for Nagle's algorithm; failing
        // to set the option only costs latency.
        let _ = stream.set_nodelay(true);
        (
            KillableStream {
                inner: stream,
                switch: KillSwitch::default(),
            },
            addr,
        )
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.0.local_addr()
    }
}

/// A TCP stream that fails once its [`KillSwitch`] is killed.
pub(crate) struct KillableStream {
    inner: TcpStream,
    switch: KillSwitch,
}

macro_rules! checked {
    ($switch:expr) => {
        if let Err(error) = $switch.check() {
            return Poll::Ready(Err(error));
        }
    };
}

impl AsyncRead for KillableStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        checked!(this.switch);
        this.switch.register_reader(cx.waker());
        // A kill between the first check and the registration woke nobody.
        checked!(this.switch);
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for KillableStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        checked!(this.switch);
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        checked!(this.switch);
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        checked!(this.switch);
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
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
