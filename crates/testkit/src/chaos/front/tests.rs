//! The front's tests: the draw, the requests it covers, the HTTP it
//! reads, and answers dropped before a server that applies every request
//! and before a real Azurite.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::http::Body;
use super::*;

#[test]
fn one_write_in_each_block_loses_its_answer_at_a_seeded_place() {
    let dropped = |rate: f64, seed: u64, writes: u64| -> Vec<u64> {
        let mut draw = Draw::new(rate, seed);
        (0..writes).filter(|_| draw.next_write()).collect()
    };
    let once = dropped(0.01, 7, 1000);
    assert_eq!(once.len(), 10, "{once:?}");
    for (block, index) in once.iter().enumerate() {
        assert_eq!(index / 100, block as u64, "{once:?}");
    }
    assert_eq!(dropped(0.01, 7, 1000), once, "a seed replays");
    assert_ne!(dropped(0.01, 8, 1000), once);
    assert_eq!(dropped(1.0, 7, 5), [0, 1, 2, 3, 4]);
    assert!(dropped(0.0, 7, 1000).is_empty());
}

#[test]
fn only_writes_on_blobs_and_messages_are_covered() {
    // (service, method, path, covered)
    let table = [
        ("blob", "PUT", "/devstoreaccount1/results/j1.json", true),
        (
            "blob",
            "PUT",
            "/devstoreaccount1/cp/a/b?comp=block&x=1",
            true,
        ),
        ("blob", "DELETE", "/devstoreaccount1/cp/a", true),
        ("blob", "GET", "/devstoreaccount1/results/j1.json", false),
        ("blob", "HEAD", "/devstoreaccount1/results/j1.json", false),
        (
            "blob",
            "PUT",
            "/devstoreaccount1/results?restype=container",
            false,
        ),
        ("queue", "POST", "/devstoreaccount1/chaos/messages", true),
        (
            "queue",
            "PUT",
            "/devstoreaccount1/chaos/messages/id?popreceipt=p",
            true,
        ),
        (
            "queue",
            "DELETE",
            "/devstoreaccount1/chaos/messages/id",
            true,
        ),
        ("queue", "GET", "/devstoreaccount1/chaos/messages", false),
        ("queue", "PUT", "/devstoreaccount1/chaos", false),
        ("queue", "DELETE", "/devstoreaccount1/chaos/other", false),
    ];
    for (service, method, path, covered) in table {
        assert_eq!(
            is_covered_write(service, method, path),
            covered,
            "{service} {method} {path}"
        );
    }
}

#[tokio::test]
async fn heads_are_read_with_their_body_and_passed_on_whole() {
    // (request, method, path, body, expects 100 Continue)
    let table: [(&str, &str, &str, Body, bool); 4] = [
        (
            "GET /a/b HTTP/1.1\r\nHost: x\r\n\r\n",
            "GET",
            "/a/b",
            Body::None,
            false,
        ),
        (
            "PUT /a/b/c HTTP/1.1\r\ncontent-length: 5\r\n\r\n",
            "PUT",
            "/a/b/c",
            Body::Length(5),
            false,
        ),
        (
            "POST /a/q/messages HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST",
            "/a/q/messages",
            Body::Chunked,
            false,
        ),
        (
            "PUT /a/b/c HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n",
            "PUT",
            "/a/b/c",
            Body::Length(1),
            true,
        ),
    ];
    for (request, method, path, body, expects_continue) in table {
        let mut reader = BufReader::new(request.as_bytes());
        let head = read_head(&mut reader).await.unwrap().expect("a head");
        assert_eq!(
            (
                head.method.as_str(),
                head.path.as_str(),
                head.body,
                head.expects_continue
            ),
            (method, path, body, expects_continue),
            "{request}"
        );
        assert_eq!(head.raw, request.as_bytes());
    }
    let mut empty = BufReader::new(&b""[..]);
    assert_eq!(read_head(&mut empty).await.unwrap(), None);
    let mut cut = BufReader::new(&b"GET / HTTP/1.1\r\n"[..]);
    assert!(read_head(&mut cut).await.is_err());
}

#[tokio::test]
async fn chunked_bodies_are_passed_on_to_their_last_chunk() {
    let body = b"5\r\nhello\r\n0\r\n\r\nNEXT";
    let mut reader = BufReader::new(&body[..]);
    let mut passed = Vec::new();
    forward_body(&mut reader, &mut passed, Body::Chunked)
        .await
        .unwrap();
    assert_eq!(passed, b"5\r\nhello\r\n0\r\n\r\n");
    let mut rest = Vec::new();
    reader.read_to_end(&mut rest).await.unwrap();
    assert_eq!(rest, b"NEXT", "the next request is left unread");
}

/// A server that applies every request (counts it) and answers 201.
async fn applying_server() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let applied = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&applied);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let counter = Arc::clone(&counter);
            tokio::spawn(async move {
                let (read, mut write) = stream.into_split();
                let mut read = BufReader::new(read);
                while let Ok(Some(head)) = read_head(&mut read).await {
                    let mut body = Vec::new();
                    if forward_body(&mut read, &mut body, head.body).await.is_err() {
                        return;
                    }
                    counter.fetch_add(1, Ordering::SeqCst);
                    let answer = b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok";
                    if write.write_all(answer).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, applied)
}

#[tokio::test]
async fn a_dropped_answer_follows_an_applied_write_and_is_recorded() {
    let (backend, applied) = applying_server().await;
    let endpoint = format!("http://{backend}/{ACCOUNT_NAME}");
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    for (rate, write_answered) in [(0.0, true), (1.0, false)] {
        let front = AzuriteFront::start(&endpoint, &endpoint, rate, 7, Instant::now())
            .await
            .unwrap();
        let url = |path: &str| format!("http://{}{path}", front.blob);
        let before = applied.load(Ordering::SeqCst);
        // Reads always pass, whatever the rate.
        let read = client.get(url("/devstoreaccount1/c/b")).send().await;
        assert_eq!(read.unwrap().text().await.unwrap(), "ok");
        let write = client
            .put(url("/devstoreaccount1/c/b?comp=block"))
            .body("payload")
            .send()
            .await;
        assert_eq!(write.is_ok(), write_answered, "rate {rate}");
        assert_eq!(
            applied.load(Ordering::SeqCst) - before,
            2,
            "the write was applied either way"
        );
        let dropped: Vec<(String, String)> = front
            .dropped()
            .into_iter()
            .map(|d| (d.method, d.path))
            .collect();
        let expected = if write_answered {
            vec![]
        } else {
            vec![("PUT".to_owned(), "/devstoreaccount1/c/b".to_owned())]
        };
        assert_eq!(dropped, expected, "rate {rate}");
        assert_eq!(front.writes(), 1, "the read is no covered write");
    }
}

#[tokio::test]
async fn a_front_before_a_stopped_service_closes_at_once() {
    // A port nothing listens on: bound, then freed.
    let gone = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}/{ACCOUNT_NAME}", gone.local_addr().unwrap());
    drop(gone);
    let front = AzuriteFront::start(&endpoint, &endpoint, 1.0, 7, Instant::now())
        .await
        .unwrap();
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let answer = client
        .put(format!("http://{}/devstoreaccount1/c/b", front.queue))
        .send()
        .await;
    assert!(answer.is_err());
    assert!(front.dropped().is_empty(), "nothing was applied");
}

mod azurite {
    use std::time::Duration;

    use spot_worker::azure::{AzureStorage, StorageConfig};
    use spot_worker::storage::MessageQueue as _;

    use super::*;
    use crate::Azurite;

    #[tokio::test]
    async fn through_the_front_azurite_applies_a_send_whose_answer_is_lost() {
        let azurite = tokio::task::spawn_blocking(Azurite::start)
            .await
            .unwrap()
            .expect("azurite");
        let direct = StorageConfig::from_connection_string(&azurite.connection_string()).unwrap();
        let direct = AzureStorage::new(direct).unwrap().queue("front").unwrap();
        direct.prepare().await.unwrap();
        let front = AzuriteFront::start(
            &azurite.blob_endpoint(),
            &azurite.queue_endpoint(),
            1.0,
            7,
            Instant::now(),
        )
        .await
        .unwrap();
        let mut config = StorageConfig::from_connection_string(&front.connection_string()).unwrap();
        config.retry = spot_worker::azure::RetryConfig {
            max_retries: 0,
            ..config.retry
        };
        let through = AzureStorage::new(config).unwrap().queue("front").unwrap();
        let sent = through.send("hello", Duration::ZERO).await;
        assert!(sent.is_err(), "the answer was dropped: {sent:?}");
        assert_eq!(front.writes(), 1);
        assert_eq!(front.dropped().len(), 1, "{:?}", front.dropped());
        assert_eq!(
            direct.approximate_message_count().await.unwrap(),
            1,
            "it was applied"
        );
    }
}
