//! `rs_rdmanet_lat`: ping-pong over `Conn`. The client times `send_msg` plus the
//! `recv_msg_into` of the echo; the server echoes every message until the end of the stream.
//! Round trips are timed with the time-stamp counter ([`crate::watch::Clock`]), as
//! `rs_send_lat` times its own: a `clock_gettime` system call (a VM's HPET clock source)
//! inside every sample would be measured as latency.

use super::args::{LatArgs, Target};
use super::conn_bw::after;
use super::net::{conn_options, dial, establish_name, listen, net_error};
use super::text::{
    accepted_line, echoed_line, json_lat, lat_line, lat_summary, listening_line, Json,
};
use super::zerocopy;
use crate::error::{Error, Result};
use crate::out::Out;
use crate::watch::Clock;
use rsrdma_net::NetError;
use std::time::Duration;

/// The server: accepts one client and echoes each message until the client closes.
///
/// # Errors
/// Listening, accepting, a failed connection or a dead client.
pub fn server(a: &LatArgs, o: &mut Out<'_>) -> Result<Json> {
    let c = &a.common;
    let l = listen(c, zerocopy::options(conn_options(c, 0), &a.zc))?;
    o.text(&listening_line(establish_name(c.establish), l.local_addr()));
    o.flush();
    // One client, as perftest: its failed handshake ends the tool with its error.
    let conn = l.accept_first().map_err(|e| net_error("accept", e))?;
    o.text(&accepted_line(conn.peer_addr()));
    o.flush();
    let (messages, bytes) = match a.zc.enabled {
        true => zerocopy::echo(&conn, a.size as usize)?,
        false => echo(&conn, a.size as usize)?,
    };
    o.text(&echoed_line(messages, bytes));
    o.text(&zerocopy::recv_memory_text(&l, &a.zc));
    o.flush();
    conn.close().map_err(|e| net_error("close", e))?;
    Ok(Json::new("rs_rdmanet_lat", "server")
        .str("poll", c.poll.name())
        .int("messages", messages)
        .int("bytes", bytes))
}

/// Echoes each message from a vector that grows to the largest message.
fn echo(conn: &rsrdma_net::Conn, size: usize) -> Result<(u64, u64)> {
    let mut buf = vec![0u8; size];
    let (mut messages, mut bytes) = (0u64, 0u64);
    loop {
        let n = match conn.recv_msg_into(&mut buf) {
            Ok(Some(n)) => n,
            Ok(None) => break,
            Err(NetError::ShortBuffer { needed }) => {
                buf.resize(needed, 0);
                continue;
            }
            Err(e) => return Err(after("recv_msg_into", messages, e)),
        };
        conn.send_msg(&buf[..n])
            .map_err(|e| after("send_msg", messages, e))?;
        messages += 1;
        bytes += n as u64;
    }
    Ok((messages, bytes))
}

/// The client: `-n` timed round trips of `-s` bytes, then the statistics.
///
/// # Errors
/// Connecting, a failed connection, a dead server, or an echo of the wrong length.
pub fn client(a: &LatArgs, target: &Target, o: &mut Out<'_>) -> Result<Json> {
    let c = &a.common;
    let conn = dial(target, zerocopy::options(conn_options(c, 0), &a.zc))?;
    if a.zc.enabled {
        return zerocopy::lat_client(a, &conn, o);
    }
    let size = a.size as usize;
    let msg = vec![0xa5u8; size];
    let mut echo = vec![0u8; size];
    // Grown outside the timed part of each round trip when a run is longer than this.
    let mut samples = Vec::with_capacity(c.count.min(1 << 16) as usize);
    let clock = Clock::new();
    for i in 0..c.count {
        let t0 = clock.now();
        conn.send_msg(&msg).map_err(|e| after("send_msg", i, e))?;
        let got = conn
            .recv_msg_into(&mut echo)
            .map_err(|e| after("recv_msg_into", i, e))?;
        samples.push(Duration::from_nanos(clock.now().saturating_sub(t0)));
        echo_len(i, got, size, c.count)?;
    }
    finish_client(a, &conn, o, &mut samples, None)
}

/// Round trip `i`'s echo length, which must be `size`; an error for a short echo or a server
/// that closed (after `i` of `count` round trips).
pub(super) fn echo_len(i: u64, got: Option<usize>, size: usize, count: u64) -> Result<usize> {
    match got {
        Some(n) if n == size => Ok(n),
        Some(n) => Err(Error::Protocol(format!(
            "round trip {i}: the echo has {n} bytes, {size} were sent"
        ))),
        None => Err(Error::Oob(format!(
            "the server closed the connection after {i} of {count} round trips"
        ))),
    }
}

/// Prints the statistics of `samples`, closes, and returns the client's JSON object (with
/// `mode` when the run was not the plain copying one).
pub(super) fn finish_client(
    a: &LatArgs,
    conn: &rsrdma_net::Conn,
    o: &mut Out<'_>,
    samples: &mut [Duration],
    mode: Option<&str>,
) -> Result<Json> {
    let summary = lat_summary(samples);
    if let Some(s) = &summary {
        o.text(&lat_line(s));
        o.flush();
    }
    conn.close().map_err(|e| net_error("close", e))?;
    let mut j = Json::new("rs_rdmanet_lat", "client").str("poll", a.common.poll.name());
    if let Some(m) = mode {
        j = j.str("mode", m);
    }
    // `-n` is at least 1, so there is a summary.
    Ok(match &summary {
        Some(s) => json_lat(j, a.size, s),
        None => j.int("size", a.size).int("round_trips", 0),
    })
}
