//! The least HTTP/1.1 that etcd's JSON gateway needs: one POST per connection, a JSON body
//! each way, every step under a deadline. A connection per request makes reconnecting after
//! an etcd restart free.

use crate::error::{NetError, Result};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// The largest response accepted.
const MAX_RESPONSE: usize = 1 << 20;

/// POSTs `body` (JSON) to `path` at `addr`; the status and the response body.
///
/// # Errors
/// [`NetError::Io`] or [`NetError::Timeout`] for the connection; [`NetError::EtcdReply`]
/// for a response that is not HTTP.
pub(crate) fn post(
    addr: SocketAddr,
    path: &str,
    body: &str,
    timeout: Duration,
) -> Result<(u16, String)> {
    let deadline = crate::deadline::deadline_after(timeout);
    let left = || {
        let d = deadline.saturating_duration_since(Instant::now());
        if d.is_zero() {
            Err(NetError::Timeout {
                op: "etcd request",
                millis: crate::deadline::whole_millis(timeout),
            })
        } else {
            Ok(d)
        }
    };
    let mut s = TcpStream::connect_timeout(&addr, left()?)
        .map_err(|e| NetError::io("connect to etcd", e))?;
    s.set_nodelay(true)
        .map_err(|e| NetError::io("set_nodelay", e))?;
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.set_write_timeout(Some(left()?))
        .map_err(|e| NetError::io("set_write_timeout", e))?;
    s.write_all(request.as_bytes())
        .map_err(|e| NetError::io("send to etcd", e))?;
    let mut raw = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        s.set_read_timeout(Some(left()?))
            .map_err(|e| NetError::io("set_read_timeout", e))?;
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                raw.extend_from_slice(&buf[..n]);
                if raw.len() > MAX_RESPONSE {
                    return Err(NetError::EtcdReply("a response over 1 MiB".into()));
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                left()?;
            }
            Err(e) => return Err(NetError::io("read from etcd", e)),
        }
    }
    parse(&raw)
}

fn bad(why: &str) -> NetError {
    NetError::EtcdReply(format!("not HTTP: {why}"))
}

/// Status and body of a whole response (`Content-Length`, chunked, or to the end).
fn parse(raw: &[u8]) -> Result<(u16, String)> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| bad("no header end"))?;
    let head = std::str::from_utf8(&raw[..split]).map_err(|_| bad("header not UTF-8"))?;
    let mut body = &raw[split + 4..];
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse::<u16>().ok())
        .ok_or_else(|| bad("no status"))?;
    let mut chunked = false;
    for l in lines {
        let Some((k, v)) = l.split_once(':') else {
            continue;
        };
        let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
        if k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked") {
            chunked = true;
        } else if k == "content-length" {
            let n: usize = v.parse().map_err(|_| bad("content-length"))?;
            body = body.get(..n).ok_or_else(|| bad("short body"))?;
        }
    }
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_vec()
    };
    Ok((
        status,
        String::from_utf8(body).map_err(|_| bad("body not UTF-8"))?,
    ))
}

fn dechunk(mut b: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = b
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| bad("chunk size"))?;
        let size = std::str::from_utf8(&b[..eol])
            .ok()
            .and_then(|s| usize::from_str_radix(s.split(';').next().unwrap_or("").trim(), 16).ok());
        let size = size.ok_or_else(|| bad("chunk size"))?;
        b = &b[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        out.extend_from_slice(b.get(..size).ok_or_else(|| bad("short chunk"))?);
        b = b.get(size + 2..).ok_or_else(|| bad("chunk end"))?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lengths_chunks_and_refuses_garbage() {
        let r = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}trailing";
        assert_eq!(parse(r).unwrap(), (200, "{}".into()));
        let r = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{\"a\r\n4\r\n\":1}\r\n0\r\n\r\n";
        assert_eq!(parse(r).unwrap(), (200, "{\"a\":1}".into()));
        assert!(parse(b"SSH-2.0-OpenSSH").is_err());
    }
}
