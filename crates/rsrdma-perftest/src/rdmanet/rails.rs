//! `rs_rdmanet_bw --rails N`: the client floods messages over a striped connection
//! (`RailConn`, N rails, each a `Conn` on the device), the server receives until the end of the
//! stream. The client's time runs until its close returns, that is until the server confirmed
//! it read every message: a striped connection keeps each message until then, so that is when
//! it is delivered.

use super::args::{BwArgs, Target};
use super::cpu::process_cpu;
use super::net::{conn_options, establish_name, naming_depth, net_error};
use super::text::{cpu_line, json_rates, listening_line, received_line, send_line, Json, SendMode};
use crate::error::Result;
use crate::out::Out;
use rsrdma_net::{NetError, RailConn, RailListener, RailOptions};
use std::time::Instant;

fn options(a: &BwArgs) -> RailOptions {
    let n = a.rails.unwrap_or(1) as usize;
    let mut o = RailOptions::new(conn_options(&a.common, a.depth), n);
    o.max_message = super::args::MAX_SIZE as u32;
    o
}

/// The server: accepts one striped connection, receives until it closes, prints the count.
///
/// # Errors
/// Listening, accepting, a failed connection.
pub fn server(a: &BwArgs, o: &mut Out<'_>) -> Result<Json> {
    let c = &a.common;
    let l = RailListener::bind(("0.0.0.0", c.port), options(a))
        .map_err(|e| naming_depth(net_error("listen", e), a.depth))?;
    o.text(&listening_line(establish_name(c.establish), l.local_addr()));
    o.flush();
    let conn = l
        .accept()
        .map_err(|e| naming_depth(net_error("accept", e), a.depth))?;
    let cpu = process_cpu();
    let (mut messages, mut bytes) = (0u64, 0u64);
    let mut buf = vec![0u8; a.size.max(1) as usize];
    loop {
        match conn.recv_msg_into(&mut buf) {
            Ok(Some(n)) => {
                messages += 1;
                bytes += n as u64;
            }
            Ok(None) => break,
            Err(NetError::ShortBuffer { needed }) => buf.resize(needed, 0),
            Err(e) => {
                return Err(net_error(
                    &format!("recv_msg_into (after {messages} messages)"),
                    e,
                ))
            }
        }
    }
    let cpu = process_cpu().saturating_sub(cpu);
    o.text(&received_line(messages, bytes));
    o.text(&cpu_line(cpu));
    o.flush();
    let lost = conn.counters().rails_failed;
    conn.close().map_err(|e| net_error("close", e))?;
    Ok(Json::new("rs_rdmanet_bw", "server")
        .str("transport", "rails")
        .int("rails_failed", u64::from(lost))
        .num("cpu_seconds", cpu.as_secs_f64())
        .int("messages", messages)
        .int("bytes", bytes))
}

/// The client: sends `-n` messages of `-s` bytes over the rails and closes (which waits for
/// the server's confirmation of every message), then prints the rate.
///
/// # Errors
/// Connecting, a failed connection.
pub fn client(a: &BwArgs, target: &Target, o: &mut Out<'_>) -> Result<Json> {
    let c = &a.common;
    let rails = a.rails.unwrap_or(1);
    let conn = RailConn::dial((target.host.as_str(), target.port), options(a)).map_err(|e| {
        let e = net_error(&format!("connect to {}:{}", target.host, target.port), e);
        naming_depth(e, a.depth)
    })?;
    let msg = vec![0x5au8; a.size as usize];
    let cpu = process_cpu();
    let start = Instant::now();
    for i in 0..c.count {
        conn.send_msg(&msg)
            .map_err(|e| net_error(&format!("send_msg (after {i} messages)"), e))?;
    }
    conn.close().map_err(|e| net_error("close", e))?;
    let elapsed = start.elapsed();
    let cpu = process_cpu().saturating_sub(cpu);
    o.text(&send_line(SendMode::Rails(rails), c.count, a.size, elapsed));
    o.text(&cpu_line(cpu));
    o.flush();
    let j = Json::new("rs_rdmanet_bw", "client")
        .str("transport", "rails")
        .int("rails", u64::from(rails))
        .num("cpu_seconds", cpu.as_secs_f64());
    Ok(json_rates(j, c.count, a.size, elapsed))
}
