//! Between the command line and rsrdma-net: `Conn` options, connecting and listening, and
//! rsrdma-net's errors as this crate's.

use super::args::{Common, Target, MAX_SIZE};
use crate::error::Error;
use rsrdma_net::{Conn, ConnOptions, Establish, Listener, NetError};
use std::time::Duration;

/// PING after this long without hearing from the peer.
pub const KEEPALIVE: Duration = Duration::from_secs(1);
/// A peer silent this long is dead: under the 5 s within which the tools must notice (a
/// killed process is usually noticed at once, through rdma_cm or the TCP channel).
pub const PEER_TIMEOUT: Duration = Duration::from_secs(4);

/// rsrdma-net's error as this crate's: a verbs failure keeps its source; anything else (a
/// dead or refusing peer, a time-out, a bad option) is a failed connection.
pub fn net_error(what: &str, e: NetError) -> Error {
    match e {
        NetError::Verbs(source) => Error::rdma(what, source),
        other => Error::Oob(format!("{what}: {other}")),
    }
}

/// `Conn`'s options for these flags. `depth` (non-zero) sets the credit window: receive and
/// send slots, and a send queue that holds them. Both ends accept messages up to
/// [`MAX_SIZE`] (the settled cap is the smaller end's), so a server needs no `-s`.
pub fn conn_options(c: &Common, depth: u32) -> ConnOptions {
    let o = ConnOptions::default()
        .establish(c.establish)
        .poll_mode(c.poll.mode())
        .device(c.device.clone())
        .port(c.ib_port)
        .gid_index(c.gid_index)
        .keepalive(Some(KEEPALIVE))
        .peer_timeout(PEER_TIMEOUT)
        .max_message(MAX_SIZE as u32);
    match u16::try_from(depth) {
        Ok(d) if d > 0 => {
            let sq = d.max(o.sq_depth);
            o.recv_slots(d).send_slots(d).sq_depth(sq)
        }
        _ => o,
    }
}

/// `e`, naming the flag that chose the library's options it names: `--depth` sets
/// `recv_slots`, `send_slots` and `sq_depth`, which a refusal names (an outside tester read
/// "recv_slots + sq_depth + 1 … does not fit" and looked for those flags).
pub fn naming_depth(e: Error, depth: u32) -> Error {
    let text = e.to_string();
    if depth == 0 || !(text.contains("recv_slots") || text.contains("sq_depth")) {
        return e;
    }
    Error::Oob(format!(
        "{text} (--depth {depth} sets recv_slots, send_slots and sq_depth)"
    ))
}

/// What `--handshake` chose, as the listening line says it.
pub fn establish_name(e: Establish) -> &'static str {
    match e {
        Establish::Tcp => "TCP handshake",
        _ => "rdma_cm",
    }
}

/// Listens on every address at the server's port.
///
/// # Errors
/// The listener's errors.
pub fn listen(c: &Common, opts: ConnOptions) -> Result<Listener, Error> {
    Listener::bind(("0.0.0.0", c.port), opts).map_err(|e| net_error("listen", e))
}

/// Connects to the server.
///
/// # Errors
/// The dial's errors.
pub fn dial(t: &Target, opts: ConnOptions) -> Result<Conn, Error> {
    Conn::dial((t.host.as_str(), t.port), opts).map_err(|e| connect_error(t, e, false))
}

/// A failed connect, with the flags to look at when the server takes no connection of this
/// kind (`raw`: this side dialled as a RawConn).
pub fn connect_error(t: &Target, e: NetError, raw: bool) -> Error {
    let what = format!("connect to {}:{}", t.host, t.port);
    match e {
        e if e.io_kind() == std::io::ErrorKind::ConnectionRefused => {
            let flags = if raw {
                "this side has --raw: does the server?"
            } else {
                "both ends need the same --raw and --handshake"
            };
            Error::Oob(format!("{what}: {e} ({flags})"))
        }
        e => net_error(&what, e),
    }
}

#[cfg(test)]
mod tests {
    use super::super::args::parse_bw;
    use super::*;
    use rsrdma_net::PollMode;

    fn common(args: &[&str]) -> Common {
        let a: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        parse_bw(&a).unwrap().common
    }

    #[test]
    fn options_follow_the_flags() {
        let c = common(&[
            "-d",
            "rxe0",
            "-x",
            "1",
            "-i",
            "2",
            "--handshake",
            "--poll",
            "busy",
        ]);
        let o = conn_options(&c, 0);
        let d = ConnOptions::default();
        assert_eq!(o.establish, Establish::Tcp);
        assert_eq!(o.poll_mode, PollMode::Busy);
        assert_eq!(o.device.as_deref(), Some("rxe0"));
        assert_eq!((o.port, o.gid_index), (2, Some(1)));
        assert_eq!((o.recv_slots, o.send_slots), (d.recv_slots, d.send_slots));
        assert_eq!(o.keepalive, Some(KEEPALIVE));
        assert!(o.peer_timeout < Duration::from_secs(5));
        assert_eq!(o.max_message, MAX_SIZE as u32);
        o.check().unwrap();
        let o = conn_options(&common(&[]), 256);
        assert_eq!(o.establish, Establish::Cm);
        assert_eq!(o.poll_mode, PollMode::Event);
        assert_eq!((o.recv_slots, o.send_slots, o.sq_depth), (256, 256, 256));
        o.check().unwrap();
        let o = conn_options(&common(&["--poll", "adaptive"]), 8);
        assert_eq!(o.poll_mode, PollMode::default());
        assert_eq!((o.recv_slots, o.sq_depth), (8, d.sq_depth));
        o.check().unwrap();
    }

    #[test]
    fn errors_keep_the_verbs_source() {
        let e = net_error(
            "listen",
            NetError::Verbs(rsrdma::Error::InvalidArgument("x".into())),
        );
        assert!(matches!(e, Error::Rdma { .. }), "{e:?}");
        let e = net_error("send_msg", NetError::PeerGone { op: "send_msg" });
        assert!(
            matches!(&e, Error::Oob(m) if m.starts_with("send_msg: ")),
            "{e:?}"
        );
    }

    #[test]
    fn a_refusal_of_the_options_depth_sets_names_the_flag() {
        let refused = || {
            Error::Oob("listen: the completion queue of a connection (recv_slots + sq_depth + 1) 32769 does not fit".into())
        };
        let e = naming_depth(refused(), 16384).to_string();
        assert!(e.contains("--depth 16384 sets recv_slots"), "{e}");
        assert_eq!(
            naming_depth(refused(), 0).to_string(),
            refused().to_string()
        );
        let other = naming_depth(Error::Oob("connect: refused".into()), 8).to_string();
        assert!(!other.contains("--depth"), "{other}");
    }
}
