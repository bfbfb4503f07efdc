//! Is it our Azurite that answers? Readiness over HTTP (an account only
//! ours knows), and the address in an `EADDRINUSE` of its log.

use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};

use super::PROBE_TIMEOUT;

/// What answered on a port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Probe {
    /// Nothing listens (yet).
    Refused,
    /// This instance: it knows the probe account.
    ThisAzurite,
    /// Some Azurite that does not know the probe account: another test's.
    OtherAzurite,
    /// Something else, or no complete answer in time.
    Other(String),
}

impl std::fmt::Display for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Probe::Refused => f.write_str("connection refused"),
            Probe::ThisAzurite => f.write_str("this azurite"),
            Probe::OtherAzurite => f.write_str("another azurite instance holds the port"),
            Probe::Other(what) => write!(f, "not this azurite: {what}"),
        }
    }
}

/// Asks the server on `port` to list the containers/queues of `account`,
/// without credentials. An Azurite that knows the account refuses with 403
/// (the account exists, the request is not signed); one that does not
/// answers 404. Both say `Server: Azurite-…`.
pub(super) fn probe(port: u16, account: &str) -> Probe {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, PROBE_TIMEOUT) else {
        return Probe::Refused;
    };
    let _ = stream.set_read_timeout(Some(PROBE_TIMEOUT));
    let _ = stream.set_write_timeout(Some(PROBE_TIMEOUT));
    let request = format!(
        "GET /{account}?comp=list HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    );
    if let Err(e) = stream.write_all(request.as_bytes()) {
        return Probe::Other(format!("request not sent: {e}"));
    }
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    // The head is all we need; it is small, so cap what is read.
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
            Err(e) => return Probe::Other(format!("no HTTP answer: {e}")),
        }
    }
    let head = String::from_utf8_lossy(&head);
    let status = head
        .lines()
        .next()
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|code| code.parse::<u16>().ok());
    let azurite = head.lines().any(|line| {
        line.split_once(':').is_some_and(|(name, value)| {
            name.trim().eq_ignore_ascii_case("server") && value.trim().starts_with("Azurite-")
        })
    });
    match (status, azurite) {
        (Some(403), true) => Probe::ThisAzurite,
        (Some(_), true) => Probe::OtherAzurite,
        (Some(status), false) => Probe::Other(format!("HTTP {status} from a non-Azurite server")),
        (None, _) => Probe::Other("no HTTP status line".to_owned()),
    }
}

/// The address of an `EADDRINUSE` in Azurite's log
/// (`listen EADDRINUSE: address already in use 127.0.0.1:41001`).
pub(super) fn address_in_use(log: &str) -> Option<String> {
    let line = log.lines().find(|line| line.contains("EADDRINUSE"))?;
    let address = line
        .rsplit(' ')
        .next()
        .filter(|word| word.contains(':'))
        .unwrap_or("one of its ports");
    Some(address.to_owned())
}
