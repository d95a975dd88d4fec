//! `rs_rdmanet_bw` over `Conn`: the client floods messages (one `send_msg` per message, or
//! `send_batch` groups with `-b`), the server receives until the end of the stream.

use super::args::{BwArgs, Target};
use super::cpu::process_cpu;
use super::net::{conn_options, dial, establish_name, listen, naming_depth, net_error};
use super::text::{
    accepted_line, cpu_line, json_rates, listening_line, received_line, registered_line, send_line,
    Json, SendMode,
};
use super::zerocopy;
use crate::error::{Error, Result};
use crate::out::Out;
use rsrdma_net::{Conn, NetError};
use std::io::Write;
use std::time::Instant;

/// The server: accepts one client, receives until it closes, prints the count.
///
/// # Errors
/// Listening, accepting, a failed connection or a dead client.
pub fn server(a: &BwArgs, o: &mut Out<'_>) -> Result<Json> {
    let c = &a.common;
    let l = listen(c, zerocopy::options(conn_options(c, a.depth), &a.zc))
        .map_err(|e| naming_depth(e, a.depth))?;
    o.text(&listening_line(establish_name(c.establish), l.local_addr()));
    o.flush();
    // One client, as perftest: its failed handshake ends the tool with its error.
    let conn = l
        .accept_first()
        .map_err(|e| naming_depth(net_error("accept", e), a.depth))?;
    o.text(&accepted_line(conn.peer_addr()));
    o.text(&registered_line(conn.info().registered_bytes));
    o.flush();
    let cpu = process_cpu();
    let (messages, bytes) = if a.both_ways {
        echo_burst(&conn, a.size as usize)?
    } else if a.zc.enabled {
        zerocopy::drain(&conn, a.size as usize)?
    } else if a.batch > 1 {
        drain_batches(&conn, a.batch as usize, a.size as usize)?
    } else {
        drain(&conn, a.size as usize)?
    };
    let cpu = process_cpu().saturating_sub(cpu);
    o.text(&received_line(messages, bytes));
    o.text(&cpu_line(cpu));
    o.text(&zerocopy::recv_memory_text(&l, &a.zc));
    o.flush();
    let registered = conn.info().registered_bytes as u64;
    conn.close().map_err(|e| net_error("close", e))?;
    Ok(Json::new("rs_rdmanet_bw", "server")
        .str("transport", "conn")
        .str("poll", c.poll.name())
        .int("registered_bytes", registered)
        .num("cpu_seconds", cpu.as_secs_f64())
        .int("messages", messages)
        .int("bytes", bytes))
}

/// Receives one message at a time into a buffer that grows to the largest message.
fn drain(conn: &Conn, size: usize) -> Result<(u64, u64)> {
    let mut buf = vec![0u8; size];
    let (mut messages, mut bytes) = (0u64, 0u64);
    loop {
        match conn.recv_msg_into(&mut buf) {
            Ok(Some(n)) => {
                messages += 1;
                bytes += n as u64;
            }
            Ok(None) => return Ok((messages, bytes)),
            Err(NetError::ShortBuffer { needed }) => buf.resize(needed, 0),
            Err(e) => return Err(after("recv_msg_into", messages, e)),
        }
    }
}

/// `--both-ways`, the server: receives until the client's half-close, then sends as many
/// messages of the same size back (rstream's reverse burst) and half-closes.
fn echo_burst(conn: &Conn, size: usize) -> Result<(u64, u64)> {
    let (messages, bytes) = drain(conn, size)?;
    let msg = vec![0xa5u8; size];
    for i in 0..messages {
        conn.send_msg(&msg)
            .map_err(|e| after("send_msg back", i, e))?;
    }
    conn.shutdown(std::net::Shutdown::Write)
        .map_err(|e| net_error("shutdown", e))?;
    Ok((messages, bytes))
}

/// Receives up to `max` ready messages per call, into buffers allocated once
/// (`recv_batch_into`; `recv_batch`'s `Vec` per message cost more than the messages at 16 KiB).
/// At most [`MAX_BATCH_BUFFERS`] buffers, and 256 MiB: `-b` may be as large as a u32.
fn drain_batches(conn: &Conn, max: usize, size: usize) -> Result<(u64, u64)> {
    let count = max
        .min(MAX_BATCH_BUFFERS)
        .min((256 << 20) / size.max(1))
        .max(1);
    let mut bufs = vec![vec![0u8; size]; count];
    let mut lens = vec![0usize; count];
    let (mut messages, mut bytes) = (0u64, 0u64);
    loop {
        let mut slices: Vec<&mut [u8]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
        let needed = loop {
            match conn.recv_batch_into(&mut slices, &mut lens) {
                Ok(Some(n)) => {
                    messages += n as u64;
                    bytes += lens[..n].iter().map(|&l| l as u64).sum::<u64>();
                }
                Ok(None) => return Ok((messages, bytes)),
                Err(NetError::ShortBuffer { needed }) => break needed,
                Err(e) => return Err(after("recv_batch_into", messages, e)),
            }
        };
        // A message larger than -s: every buffer grows to it.
        drop(slices);
        bufs.iter_mut().for_each(|b| b.resize(needed, 0));
    }
}

/// The most receive buffers the server's `-b` loop keeps.
const MAX_BATCH_BUFFERS: usize = 1024;

/// The client: sends `-n` messages of `-s` bytes, waits until every byte is handed to the
/// NIC, prints the rate, then closes (which confirms delivery).
///
/// # Errors
/// Connecting, a failed connection or a dead server.
pub fn client(a: &BwArgs, target: &Target, o: &mut Out<'_>) -> Result<Json> {
    let c = &a.common;
    let conn = dial(target, zerocopy::options(conn_options(c, a.depth), &a.zc))
        .map_err(|e| naming_depth(e, a.depth))?;
    let mut ring = match a.zc.enabled {
        true => Some(zerocopy::Ring::new(&conn, a.size as usize, a.zc.buffers)?),
        false => None,
    };
    o.text(&registered_line(conn.info().registered_bytes));
    o.flush();
    let msg = vec![0x5au8; a.size as usize];
    let cpu = process_cpu();
    let start = Instant::now();
    let mode = if a.both_ways {
        for i in 0..c.count {
            conn.send_msg(&msg).map_err(|e| after("send_msg", i, e))?;
        }
        conn.shutdown(std::net::Shutdown::Write)
            .map_err(|e| net_error("shutdown", e))?;
        let (back, _) = drain(&conn, a.size as usize)?;
        if back != c.count {
            return Err(Error::Oob(format!(
                "--both-ways: sent {} messages, {back} came back",
                c.count
            )));
        }
        SendMode::BothWays
    } else if let Some(ring) = &mut ring {
        ring.send(&conn, c.count)?
    } else if a.batch > 1 {
        // No longer than the run: `-b 4294967295 -n 100` asked for a 64 GiB vector and
        // aborted (an outside tester's find).
        let group_len = c.count.min(u64::from(a.batch)) as usize;
        let group: Vec<&[u8]> = vec![msg.as_slice(); group_len];
        let mut sent = 0u64;
        while sent < c.count {
            let k = (c.count - sent).min(u64::from(a.batch)) as usize;
            conn.send_batch(&group[..k])
                .map_err(|e| after("send_batch", sent, e))?;
            sent += k as u64;
        }
        SendMode::Batch(a.batch)
    } else {
        for i in 0..c.count {
            conn.send_msg(&msg).map_err(|e| after("send_msg", i, e))?;
        }
        SendMode::Single
    };
    (&conn)
        .flush()
        .map_err(|e| Error::Oob(format!("flush: {e}")))?;
    let elapsed = start.elapsed();
    let cpu = process_cpu().saturating_sub(cpu);
    let moved = match mode {
        SendMode::BothWays => 2 * c.count,
        _ => c.count,
    };
    o.text(&send_line(mode, moved, a.size, elapsed));
    o.text(&cpu_line(cpu));
    o.text(&zerocopy::copied_text(&conn, &a.zc));
    o.flush();
    let registered = conn.info().registered_bytes as u64;
    conn.close().map_err(|e| net_error("close", e))?;
    let j = Json::new("rs_rdmanet_bw", "client")
        .str("transport", "conn")
        .str("poll", c.poll.name())
        .str(
            "mode",
            match mode {
                SendMode::Single => "send_msg",
                SendMode::Batch(_) => "send_batch",
                SendMode::Buffers(_) => "send_buffer",
                SendMode::BothWays => "both_ways",
                SendMode::Rails(_) => "rails",
            },
        )
        .int("batch", u64::from(a.batch))
        .int("registered_bytes", registered)
        .num("cpu_seconds", cpu.as_secs_f64());
    Ok(json_rates(j, moved, a.size, elapsed))
}

/// A failure after `done` messages.
pub(super) fn after(op: &str, done: u64, e: NetError) -> Error {
    net_error(&format!("{op} (after {done} messages)"), e)
}
