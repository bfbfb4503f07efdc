//! A TCP listener whose connections can be dropped on purpose (for the
//! `drop` fault): each connection carries a [`KillSwitch`] its handler can
//! pull, after which the connection's reads and writes fail.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};

use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

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
pub(crate) struct KillableListener(pub(crate) TcpListener);

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
