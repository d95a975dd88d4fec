//! perftest's exchange over rdma_cm (`-R`, spec 2.7): instead of a TCP socket, the two ends
//! connect one RC queue pair with rdma_cm (port `-p`, TCP port space) and carry every exchange
//! message as one SEND into a receive the other side posted beforehand. Each side keeps
//! exactly one receive posted: before connecting (accepting), and again after taking each
//! message, so the lock-step exchange never finds the peer without one.

use crate::error::{Error, Result};
use crate::oob::Wait;
use rsrdma::cm::{CmEventType, CmId, ConnParam};
use rsrdma::{
    AccessFlags, CompChannel, Context, Cq, Mr, Pd, Qp, QpCaps, QpType, RecvWr, SendWr, Wc,
};
use std::cell::Cell;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, ToSocketAddrs};
use std::time::{Duration, Instant};

/// The largest message this side accepts: perftest's largest is its binary endpoint (56 bytes).
const SLOT: usize = 256;
/// How long address and route resolution may take (perftest: 2 s each).
const RESOLVE: Duration = Duration::from_secs(2);
/// Connect attempts while the server is not listening yet, 100 ms apart.
pub const CONNECT_TRIES: u32 = 10;
const RECV_ID: u64 = 1;
const SEND_ID: u64 = 2;

/// The exchange channel: a connected RC QP with one message slot each way.
pub struct CmLink {
    // Drop order: the QP (and through it the id) before its CQs, memory and PD.
    qp: Qp,
    id: CmId,
    /// `[0, SLOT)` receives, `[SLOT, 2 SLOT)` sends.
    mr: Mr,
    send_cq: Cq,
    recv_cq: Cq,
    _channel: CompChannel,
    _pd: Pd,
    /// A receive completion taken by [`CmLink::peek`], not consumed yet.
    pending: Cell<Option<Wc>>,
}

/// The listening id of a server, on `0.0.0.0:port` (perftest binds the wildcard address).
///
/// # Errors
/// perftest's bind message.
pub fn listen(port: u16, backlog: i32) -> Result<CmId> {
    let addr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port));
    CmId::listener(addr, backlog).map_err(|e| {
        Error::Perftest(format!(
            " rdma_bind_addr/rdma_listen on port {port} failed: {e}\n Unable to perform rdma_server function\n Unable to init the socket connection"
        ))
    })
}

/// The IPv4 address of `host:port` (perftest resolves with `AF_INET` only).
///
/// # Errors
/// perftest's resolve message.
pub fn resolve(host: &str, port: u16) -> Result<SocketAddr> {
    (host, port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.find(SocketAddr::is_ipv4))
        .ok_or_else(|| {
            Error::Perftest(format!(
                "Name or service not known for {host}:{port}\nProblem in resolving basic address and port\n Unable to perform rdma_client function\n Unable to init the socket connection"
            ))
        })
}

/// A new id with `dst`'s address and route resolved.
///
/// # Errors
/// The failed resolution.
pub fn resolved_id(dst: SocketAddr) -> rsrdma::Result<CmId> {
    let id = CmId::new()?;
    id.resolve_addr(None, dst, RESOLVE)?;
    id.resolve_route(RESOLVE)?;
    Ok(id)
}

/// Depths of the exchange QP: it carries SENDs only.
fn no_reads() -> ConnParam {
    ConnParam::default()
        .with_responder_resources(0)
        .with_initiator_depth(0)
}

impl CmLink {
    /// Takes one client's connection on `listener`, waiting as long as it takes (perftest's
    /// server waits for its client without a limit), then closes the listener so that the
    /// data QPs can listen on the same port.
    ///
    /// # Errors
    /// A failed request, resource or accept.
    pub fn accept(listener: CmId) -> Result<(CmLink, String)> {
        let req = loop {
            match listener.get_request(Duration::from_secs(1)) {
                Ok(r) => break r,
                Err(rsrdma::Error::Timeout { .. }) => continue,
                Err(e) => return Err(server_error(e)),
            }
        };
        drop(listener);
        let peer = req
            .id
            .peer_addr()
            .map_or_else(|| "the client".to_string(), |a| a.to_string());
        let link = CmLink::on(req.id).map_err(server_error)?;
        link.id
            .accept(&no_reads(), Wait::Prompt.limit())
            .map_err(server_error)?;
        Ok((link, peer))
    }

    /// Connects to the server at `host:port`; while nothing listens there yet (the server
    /// has not started), tries again a few times, 100 ms apart.
    ///
    /// # Errors
    /// Resolution, resources or the connection failed.
    pub fn connect(host: &str, port: u16) -> Result<(CmLink, String)> {
        let dst = resolve(host, port)?;
        let mut last = None;
        for _ in 0..CONNECT_TRIES {
            match Self::connect_once(dst) {
                Ok(link) => return Ok((link, dst.to_string())),
                Err(e @ rsrdma::Error::CmEvent { .. }) => {
                    last = Some(e);
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => return Err(client_error(host, port, e)),
            }
        }
        Err(client_error(
            host,
            port,
            last.unwrap_or(rsrdma::Error::InvalidArgument("no attempt".into())),
        ))
    }

    fn connect_once(dst: SocketAddr) -> rsrdma::Result<CmLink> {
        let id = resolved_id(dst)?;
        let link = CmLink::on(id)?;
        link.id.connect(&no_reads(), Wait::Prompt.limit())?;
        Ok(link)
    }

    /// The QP, memory and CQs on `id`'s device, with the first receive posted.
    fn on(id: CmId) -> rsrdma::Result<CmLink> {
        let ctx: Context = id.context()?;
        let pd = Pd::new(&ctx)?;
        let channel = CompChannel::new(&ctx)?;
        let send_cq = Cq::new(&ctx, 2, None)?;
        let recv_cq = Cq::new(&ctx, 2, Some(&channel))?;
        let mr = Mr::new(&pd, 2 * SLOT, AccessFlags::LOCAL_WRITE)?;
        let caps = QpCaps::default()
            .max_send_wr(1u32)
            .max_recv_wr(1u32)
            .max_send_sge(1u32)
            .max_recv_sge(1u32);
        let qp = id.create_qp(&pd, &Qp::builder(QpType::Rc).caps(caps), &send_cq, &recv_cq)?;
        let link = CmLink {
            qp,
            id,
            mr,
            send_cq,
            recv_cq,
            _channel: channel,
            _pd: pd,
            pending: Cell::new(None),
        };
        link.post_recv()?;
        Ok(link)
    }

    fn post_recv(&self) -> rsrdma::Result<()> {
        let sge = [self.mr.sge(0, SLOT)?];
        // SAFETY: the receive slot lies inside `self.mr`, which outlives the QP's requests
        // (the QP drops first); nothing else writes the slot while the receive is posted.
        unsafe { self.qp.post_recv(&RecvWr::new(RECV_ID, &sge)) }
    }

    /// Sends one message and waits for its completion.
    ///
    /// # Errors
    /// [`Error::Oob`]: the post failed or the peer did not take it (gone, or no receive).
    pub fn send(&mut self, what: &str, b: &[u8]) -> Result<()> {
        let fail = |reason: String| {
            Error::Oob(format!(
                " Unable to write {what} to the peer over rdma_cm: {reason}\n Failed to exchange data between server and clients"
            ))
        };
        if b.len() > SLOT {
            return Err(fail(format!(
                "{} bytes is more than a message holds",
                b.len()
            )));
        }
        self.mr.write_at(SLOT, b).map_err(|e| fail(e.to_string()))?;
        let sge = [self
            .mr
            .sge(SLOT, b.len())
            .map_err(|e| fail(e.to_string()))?];
        // SAFETY: the send slot lies inside `self.mr`, which outlives the request; it is not
        // written again before this send completes (waited for below).
        unsafe { self.qp.post_send(&SendWr::send(SEND_ID, &sge)) }
            .map_err(|e| fail(e.to_string()))?;
        let deadline = Instant::now() + Wait::Prompt.limit();
        let mut wc = [Wc::default()];
        loop {
            if self
                .send_cq
                .poll(&mut wc)
                .map_err(|e| fail(e.to_string()))?
                == 1
            {
                break;
            }
            if Instant::now() >= deadline {
                return Err(fail("no completion: the peer does not answer".into()));
            }
            std::thread::sleep(Duration::from_micros(20));
        }
        if !wc[0].is_ok() {
            return Err(fail(format!(
                "{} (the peer exited or was killed)",
                wc[0].status()
            )));
        }
        Ok(())
    }

    /// Takes the next message, which must be exactly `buf.len()` bytes, within the wait's time
    /// limit, and posts the next receive.
    ///
    /// # Errors
    /// [`Error::Oob`]: the peer disconnected, its message did not arrive in time, or it has
    /// another length than expected.
    pub fn recv(&mut self, what: &str, buf: &mut [u8], wait: Wait, server: bool) -> Result<()> {
        let limit = wait.limit();
        let side = if server { "to" } else { "from" };
        let fail = |reason: String| {
            Error::Oob(format!(
                "rdma_read_keys: Couldn't read {what}\n Unable to read {side} socket/rdma_cm\n Failed to exchange data between server and clients\n ({reason})"
            ))
        };
        let wc =
            self.wait_recv(Instant::now() + limit).map_err(|r| {
                fail(r.unwrap_or_else(|| {
                    format!("no answer from the peer within {} s", limit.as_secs())
                }))
            })?;
        if !wc.is_ok() {
            return Err(fail(format!(
                "{}: the peer exited or was killed",
                wc.status()
            )));
        }
        let got = wc.byte_len() as usize;
        if got != buf.len() {
            return Err(Error::Protocol(format!(
                " Couldn't read {what}: the peer sent {got} bytes where {} were expected (is it perftest, run with the same test?)",
                buf.len()
            )));
        }
        self.mr.read_at(0, buf).map_err(|e| fail(e.to_string()))?;
        tracing::trace!(what, bytes = ?buf, "rdma_cm message");
        self.post_recv().map_err(|e| fail(e.to_string()))
    }

    /// Waits for the receive completion; `Err(Some(why))` when the peer went away,
    /// `Err(None)` at the deadline.
    fn wait_recv(&self, deadline: Instant) -> std::result::Result<Wc, Option<String>> {
        let mut wc = [Wc::default()];
        loop {
            if let Some(w) = self.pending.take() {
                return Ok(w);
            }
            if self
                .recv_cq
                .poll(&mut wc)
                .map_err(|e| Some(e.to_string()))?
                == 1
            {
                return Ok(wc[0]);
            }
            if self.peer_gone() {
                return Err(Some(
                    "the peer disconnected: it exited or was killed".into(),
                ));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(None);
            }
            // Sleep on the channel (no busy wait while the peer runs its test), in slices so
            // that a disconnect is noticed.
            self.recv_cq.arm(false).map_err(|e| Some(e.to_string()))?;
            if self
                .recv_cq
                .poll(&mut wc)
                .map_err(|e| Some(e.to_string()))?
                == 1
            {
                return Ok(wc[0]);
            }
            match self
                .recv_cq
                .wait(Some(left.min(Duration::from_millis(200))))
            {
                Ok(()) | Err(rsrdma::Error::Timeout { .. }) => {}
                Err(e) => return Err(Some(e.to_string())),
            }
        }
    }

    /// True when rdma_cm reported the connection gone.
    fn peer_gone(&self) -> bool {
        loop {
            match self.id.try_next_event() {
                Ok(Some(ev)) => {
                    if matches!(
                        ev.kind,
                        CmEventType::DISCONNECTED
                            | CmEventType::DEVICE_REMOVAL
                            | CmEventType::TIMEWAIT_EXIT
                    ) {
                        return true;
                    }
                }
                Ok(None) => return false,
                Err(e) => {
                    tracing::debug!(%e, "rdma_cm event channel");
                    return true;
                }
            }
        }
    }

    /// Without blocking: `Some(true)` if the peer is gone, `Some(false)` if a message waits,
    /// `None` if nothing happened.
    pub fn peek(&self) -> Option<bool> {
        if let Some(w) = self.pending.get() {
            return Some(!w.is_ok());
        }
        let mut wc = [Wc::default()];
        match self.recv_cq.poll(&mut wc) {
            Ok(1) => {
                self.pending.set(Some(wc[0]));
                return Some(!wc[0].is_ok());
            }
            Ok(_) => {}
            Err(_) => return Some(true),
        }
        self.peer_gone().then_some(true)
    }
}

fn server_error(e: rsrdma::Error) -> Error {
    Error::Perftest(format!(
        " rdma_cm connection of the exchange failed: {e}\n Unable to perform rdma_server function\n Unable to init the socket connection"
    ))
}

fn client_error(host: &str, port: u16, e: rsrdma::Error) -> Error {
    // Refused by the CM: nothing takes rdma_cm there, maybe a server started without -R.
    let hint = match &e {
        rsrdma::Error::CmEvent { got, .. } if *got == rsrdma::cm::CmEventType::REJECTED => {
            "\n (is the server started with -R? One without it takes TCP connections only: \
             give both ends -R, or neither)"
        }
        _ => "",
    };
    Error::Perftest(format!(
        " Couldn't connect to {host}:{port} with rdma_cm: {e}{hint}\n Unable to perform rdma_client function\n Unable to init the socket connection"
    ))
}
