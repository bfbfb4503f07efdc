//! The little of HTTP/1.1 the Azurite front reads: a request's head (its
//! method, path and how its body is framed) and its body, passed on byte
//! for byte by its `Content-Length` or chunk by chunk.

use tokio::io::{AsyncBufRead, AsyncBufReadExt as _, AsyncRead, AsyncReadExt as _};
use tokio::io::{AsyncWrite, AsyncWriteExt as _};

/// Longest request head line the front reads; longer ones are passed on
/// unparsed (none of the workers' requests come close).
const HEAD_LINE_MAX: u64 = 64 * 1024;

/// What the front reads of a request head.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct RequestHead {
    pub(super) method: String,
    pub(super) path: String,
    pub(super) body: Body,
    pub(super) expects_continue: bool,
    /// The head's bytes, passed on as read.
    pub(super) raw: Vec<u8>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum Body {
    #[default]
    None,
    Length(u64),
    Chunked,
}

/// Reads one request head; `None` at a clean end of the connection.
pub(super) async fn read_head<R: AsyncBufRead + Unpin>(
    reader: &mut R,
) -> std::io::Result<Option<RequestHead>> {
    let mut head = RequestHead::default();
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = (&mut *reader)
            .take(HEAD_LINE_MAX)
            .read_until(b'\n', &mut line)
            .await?;
        if n == 0 {
            return if head.raw.is_empty() {
                Ok(None)
            } else {
                Err(std::io::ErrorKind::UnexpectedEof.into())
            };
        }
        if !line.ends_with(b"\n") {
            return Err(std::io::ErrorKind::InvalidData.into());
        }
        head.raw.extend_from_slice(&line);
        let text = String::from_utf8_lossy(&line);
        let text = text.trim_end();
        if head.method.is_empty() {
            let mut parts = text.split(' ');
            head.method = parts.next().unwrap_or_default().to_owned();
            head.path = parts.next().unwrap_or_default().to_owned();
            continue;
        }
        if text.is_empty() {
            return Ok(Some(head));
        }
        let Some((name, value)) = text.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            let length = value
                .parse()
                .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidData))?;
            head.body = Body::Length(length);
        } else if name.eq_ignore_ascii_case("transfer-encoding")
            && value.to_ascii_lowercase().contains("chunked")
        {
            head.body = Body::Chunked;
        } else if name.eq_ignore_ascii_case("expect") {
            head.expects_continue = true;
        }
    }
}

/// Passes one request body on, by its length or chunk by chunk.
pub(super) async fn forward_body<R, W>(
    reader: &mut R,
    writer: &mut W,
    body: Body,
) -> std::io::Result<()>
where
    R: AsyncBufRead + AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    match body {
        Body::None => Ok(()),
        Body::Length(length) => {
            let copied = tokio::io::copy(&mut (&mut *reader).take(length), writer).await?;
            if copied == length {
                Ok(())
            } else {
                Err(std::io::ErrorKind::UnexpectedEof.into())
            }
        }
        Body::Chunked => loop {
            let mut line = Vec::new();
            (&mut *reader)
                .take(HEAD_LINE_MAX)
                .read_until(b'\n', &mut line)
                .await?;
            writer.write_all(&line).await?;
            let text = String::from_utf8_lossy(&line);
            let size = text.trim().split(';').next().unwrap_or_default();
            let size = u64::from_str_radix(size, 16)
                .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidData))?;
            if size == 0 {
                // Trailers, up to the empty line.
                loop {
                    line.clear();
                    (&mut *reader)
                        .take(HEAD_LINE_MAX)
                        .read_until(b'\n', &mut line)
                        .await?;
                    writer.write_all(&line).await?;
                    if line.is_empty() || line == b"\r\n" || line == b"\n" {
                        return Ok(());
                    }
                }
            }
            // The chunk and its CRLF.
            let length = size + 2;
            let copied = tokio::io::copy(&mut (&mut *reader).take(length), writer).await?;
            if copied != length {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
        },
    }
}
