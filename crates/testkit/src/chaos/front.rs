//! The Azurite front: a plain-TCP proxy on loopback between the workers
//! and Azurite (one listener for the blob service, one for the queue
//! service), as a load balancer stands in front of a real storage account.
//! Its one fault mode is the lost answer: a write is passed on whole,
//! Azurite applies it, and the connection to the worker is closed as soon
//! as Azurite starts answering, so the worker never sees the answer (what
//! a reset connection or a timeout does to a write that landed). The
//! worker cannot tell that from a write that never arrived; it must treat
//! the outcome as unknown.
//!
//! Which writes lose their answer is drawn from a seeded generator at the
//! rate the plan chose (one in each block of `1 / rate` writes, at a
//! drawn place), for writes on blobs and queue messages (PUT, POST,
//! DELETE on a blob, or on a queue's `messages`), never for container or
//! queue set-up. Every answer dropped is recorded (when, which service,
//! method and path, query left off) so the verdict can explain a failure.
//!
//! Requests are read one at a time (HTTP/1.1 without pipelining, as the
//! workers' client sends them): the head, then the body by its
//! `Content-Length` or its chunks; answers pass back as bytes. A request
//! the front cannot parse, or one that waits for `100 Continue`, is passed
//! on unharmed. While Azurite is down (the outage fault) the front accepts
//! and closes at once: nothing was applied.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{Context as _, Result};
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::{ACCOUNT_KEY, ACCOUNT_NAME};

mod http;

use http::{RequestHead, forward_body, read_head};

/// One answer the front dropped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DroppedAnswer {
    /// Milliseconds since the run started.
    pub at_ms: u64,
    /// `blob` or `queue`.
    pub service: &'static str,
    /// The request's method.
    pub method: String,
    /// The path without its query (no signature, no pop receipt).
    pub path: String,
}

impl std::fmt::Display for DroppedAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:7.1} s  answer dropped: {} {} ({})",
            self.at_ms as f64 / 1000.0,
            self.method,
            self.path,
            self.service
        )
    }
}

/// Which covered writes lose their answer: one in each block of
/// `period` consecutive ones, at a place in the block drawn from the seed.
/// A rate then holds in every run however the writes fall (independent
/// draws at 1 % can miss hundreds of writes in a row).
#[derive(Debug)]
struct Draw {
    rng: StdRng,
    /// Writes per dropped answer; 0: none dropped.
    period: u64,
    /// Covered writes seen (whether or not their answer was dropped).
    writes: u64,
    /// The index of the next write whose answer is dropped.
    next: u64,
}

impl Draw {
    fn new(rate: f64, seed: u64) -> Draw {
        let mut rng = StdRng::seed_from_u64(seed);
        let period = if rate > 0.0 {
            (1.0 / rate.min(1.0)).round() as u64
        } else {
            0
        };
        let next = if period > 0 {
            rng.random_range(0..period)
        } else {
            u64::MAX
        };
        Draw {
            rng,
            period,
            writes: 0,
            next,
        }
    }

    /// Counts one covered write; whether its answer is to be dropped.
    fn next_write(&mut self) -> bool {
        let index = self.writes;
        self.writes += 1;
        if index != self.next {
            return false;
        }
        let block_end = (index / self.period + 1) * self.period;
        self.next = block_end + self.rng.random_range(0..self.period);
        true
    }
}

/// What every connection shares: the draw and its record.
struct Dropper {
    draw: Mutex<Draw>,
    started: Instant,
    dropped: Mutex<Vec<DroppedAnswer>>,
}

impl Dropper {
    /// Whether this request's answer is to be dropped: drawn only for the
    /// writes the fault mode covers, so reads do not shift the draws.
    fn draws_loss(&self, service: &'static str, request: &RequestHead) -> bool {
        is_covered_write(service, &request.method, &request.path)
            && self.draw.lock().unwrap().next_write()
    }

    fn record(&self, service: &'static str, request: &RequestHead) {
        let dropped = DroppedAnswer {
            at_ms: self.started.elapsed().as_millis() as u64,
            service,
            method: request.method.clone(),
            path: path_only(&request.path).to_owned(),
        };
        eprintln!("chaos: {dropped}");
        self.dropped.lock().unwrap().push(dropped);
    }
}

/// The running front; its listeners stop when it is dropped.
pub(super) struct AzuriteFront {
    blob: SocketAddr,
    queue: SocketAddr,
    dropper: Arc<Dropper>,
    tasks: Vec<JoinHandle<()>>,
}

impl AzuriteFront {
    /// Starts the front before Azurite's `blob` and `queue` endpoints
    /// (`http://127.0.0.1:<port>/<account>`), dropping answers to a share
    /// `rate` of the covered writes, drawn from `seed`.
    pub(super) async fn start(
        blob_endpoint: &str,
        queue_endpoint: &str,
        rate: f64,
        seed: u64,
        started: Instant,
    ) -> Result<AzuriteFront> {
        let dropper = Arc::new(Dropper {
            draw: Mutex::new(Draw::new(rate, seed)),
            started,
            dropped: Mutex::new(Vec::new()),
        });
        let (blob, blob_task) = listen("blob", blob_endpoint, &dropper).await?;
        let (queue, queue_task) = listen("queue", queue_endpoint, &dropper).await?;
        Ok(AzuriteFront {
            blob,
            queue,
            dropper,
            tasks: vec![blob_task, queue_task],
        })
    }

    /// The connection string the workers are given: Azurite's account
    /// through the front.
    pub(super) fn connection_string(&self) -> String {
        format!(
            "DefaultEndpointsProtocol=http;AccountName={ACCOUNT_NAME};AccountKey={ACCOUNT_KEY};BlobEndpoint=http://{}/{ACCOUNT_NAME};QueueEndpoint=http://{}/{ACCOUNT_NAME};",
            self.blob, self.queue
        )
    }

    /// The writes the fault mode covers seen so far, answered or not.
    pub(super) fn writes(&self) -> u64 {
        self.dropper.draw.lock().unwrap().writes
    }

    /// Every answer dropped so far, in order.
    pub(super) fn dropped(&self) -> Vec<DroppedAnswer> {
        self.dropper.dropped.lock().unwrap().clone()
    }
}

impl Drop for AzuriteFront {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// One listener on a free loopback port, passing its connections on to
/// the service at `endpoint`.
async fn listen(
    service: &'static str,
    endpoint: &str,
    dropper: &Arc<Dropper>,
) -> Result<(SocketAddr, JoinHandle<()>)> {
    let backend = backend_of(endpoint)?;
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let dropper = Arc::clone(dropper);
    let task = tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            tokio::spawn(serve(client, backend, service, Arc::clone(&dropper)));
        }
    });
    Ok((addr, task))
}

/// `127.0.0.1:<port>` from `http://127.0.0.1:<port>/<account>`.
fn backend_of(endpoint: &str) -> Result<SocketAddr> {
    let authority = endpoint
        .strip_prefix("http://")
        .and_then(|rest| rest.split('/').next())
        .with_context(|| format!("not a plain-HTTP endpoint: {endpoint}"))?;
    authority
        .parse()
        .with_context(|| format!("the endpoint's address: {endpoint}"))
}

/// Whether a request is a write the fault mode covers: PUT, POST or DELETE
/// on a blob (`/account/container/name…`) or on a queue's messages.
fn is_covered_write(service: &str, method: &str, path: &str) -> bool {
    if !matches!(method, "PUT" | "POST" | "DELETE") {
        return false;
    }
    let segments: Vec<&str> = path_only(path)
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    match service {
        "blob" => segments.len() >= 3,
        "queue" => segments.get(2) == Some(&"messages"),
        _ => false,
    }
}

fn path_only(path: &str) -> &str {
    path.split('?').next().unwrap_or(path)
}

/// One connection: requests one at a time towards Azurite, answers back,
/// until either side closes or an answer is dropped (both are closed).
async fn serve(
    client: TcpStream,
    backend: SocketAddr,
    service: &'static str,
    dropper: Arc<Dropper>,
) {
    let Ok(server) = TcpStream::connect(backend).await else {
        // Azurite is down: the worker sees its connection closed.
        return;
    };
    // A head and its body go out as separate writes: without this, each
    // request would wait for the delayed ACK of its head.
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, mut client_write) = client.into_split();
    let (server_read, mut server_write) = server.into_split();
    // The request whose answer is to be dropped, set before its first byte
    // goes out: without pipelining, the next answer bytes are its answer.
    let pending: Arc<Mutex<Option<RequestHead>>> = Arc::new(Mutex::new(None));
    let requests = {
        let pending = Arc::clone(&pending);
        let dropper = Arc::clone(&dropper);
        async move {
            let mut client_read = BufReader::new(client_read);
            loop {
                let Ok(Some(head)) = read_head(&mut client_read).await else {
                    // Closed, or a head we cannot read: pass the rest on.
                    let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
                    return;
                };
                let body = head.body;
                if !head.expects_continue && dropper.draws_loss(service, &head) {
                    *pending.lock().unwrap() = Some(RequestHead {
                        method: head.method.clone(),
                        path: head.path.clone(),
                        ..RequestHead::default()
                    });
                }
                if server_write.write_all(&head.raw).await.is_err() {
                    return;
                }
                if forward_body(&mut client_read, &mut server_write, body)
                    .await
                    .is_err()
                {
                    return;
                }
            }
        }
    };
    let answers = async move {
        let mut server_read = server_read;
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            let Ok(n) = server_read.read(&mut buffer).await else {
                return;
            };
            if n == 0 {
                return;
            }
            if let Some(request) = pending.lock().unwrap().take() {
                // Azurite answered, so it applied the write: the worker
                // gets the connection closed instead.
                dropper.record(service, &request);
                return;
            }
            if client_write.write_all(&buffer[..n]).await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        () = requests => {}
        () = answers => {}
    }
}

#[cfg(test)]
mod tests;
