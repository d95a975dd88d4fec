//! The out-of-band connection: perftest's TCP socket (spec 1.1) or, with `-R`, its rdma_cm
//! exchange QP ([`crate::cmlink`], spec 2.7). Lock-step exchanges with time limits, so that a
//! dead or silent peer ends the run with a message instead of a hang.

use crate::cmlink::CmLink;
use crate::error::{Error, Result};
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// How long a read may wait for a peer that should answer at once (setup, reports).
pub const PROMPT: Duration = Duration::from_secs(30);
/// How long a read may wait while the peer runs its part of a test (the passive side of
/// write_bw blocks for the whole run). Overridable with `RSRDMA_PERFTEST_WAIT_SECS`.
pub const LONG: Duration = Duration::from_secs(600);

/// How long to wait for the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// The peer should answer promptly.
    Prompt,
    /// The peer may be running its part of the test first (plus this many extra seconds).
    Long(u64),
}

impl Wait {
    /// The time limit of this wait.
    pub fn limit(self) -> Duration {
        match self {
            Wait::Prompt => PROMPT,
            Wait::Long(extra) => {
                let base = std::env::var("RSRDMA_PERFTEST_WAIT_SECS")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .map_or(LONG, Duration::from_secs);
                base + Duration::from_secs(extra)
            }
        }
    }
}

/// A connected OOB channel.
pub struct Oob {
    link: Link,
    server: bool,
    peer: String,
}

/// What carries the messages.
enum Link {
    /// perftest's default: a TCP socket.
    Tcp(TcpStream),
    /// `-R`: SEND/RECV on an rdma_cm-connected QP.
    Cm(Box<CmLink>),
}

impl std::fmt::Debug for Oob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Oob")
            .field("rdma_cm", &self.is_rdma_cm())
            .field("server", &self.server)
            .field("peer", &self.peer)
            .finish()
    }
}

/// Binds the server's listening socket on all IPv4 addresses (perftest: `AI_PASSIVE`, `AF_INET`).
///
/// # Errors
/// perftest's "Couldn't listen to port" messages.
pub fn listen(port: u16) -> Result<TcpListener> {
    TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)).map_err(|e| {
        tracing::debug!(%e, port, "bind failed");
        Error::Perftest(format!(
            "Couldn't listen to port {port}\nUnable to open file descriptor for socket connection Unable to init the socket connection"
        ))
    })
}

impl Oob {
    /// Accepts one client, then closes the listener (perftest serves a single connection).
    ///
    /// # Errors
    /// [`Error::Oob`] when accept fails.
    pub fn accept(listener: TcpListener) -> Result<Oob> {
        let (stream, addr) = listener
            .accept()
            .map_err(|e| Error::Oob(format!(" Unable to accept a connection: {e}")))?;
        drop(listener);
        Self::setup(stream, true, addr.to_string())
    }

    /// Connects to `host:port` once, without retrying (as perftest).
    ///
    /// # Errors
    /// perftest's resolve and connect messages.
    pub fn connect(host: &str, port: u16) -> Result<Oob> {
        let tail = "Unable to open file descriptor for socket connection Unable to init the socket connection";
        let addrs: Vec<SocketAddr> = match (host, port).to_socket_addrs() {
            Ok(a) => a.filter(SocketAddr::is_ipv4).collect(),
            Err(_) => Vec::new(),
        };
        if addrs.is_empty() {
            return Err(Error::Perftest(format!(
                "Name or service not known for {host}:{port}\nProblem in resolving basic address and port\n{tail}"
            )));
        }
        for a in &addrs {
            if let Ok(s) = TcpStream::connect_timeout(a, PROMPT) {
                return Self::setup(s, false, a.to_string());
            }
        }
        Err(Error::Perftest(format!(
            "Couldn't connect to {host}:{port}\n{tail}"
        )))
    }

    fn setup(stream: TcpStream, server: bool, peer: String) -> Result<Oob> {
        stream.set_nodelay(true).ok();
        set_keepalive(&stream);
        Ok(Oob {
            link: Link::Tcp(stream),
            server,
            peer,
        })
    }

    /// `-R` server: takes one client on the rdma_cm `listener` ([`crate::cmlink::listen`]).
    ///
    /// # Errors
    /// As [`CmLink::accept`].
    pub fn accept_rdma_cm(listener: rsrdma::cm::CmId) -> Result<Oob> {
        let (link, peer) = CmLink::accept(listener)?;
        Ok(Oob {
            link: Link::Cm(Box::new(link)),
            server: true,
            peer,
        })
    }

    /// `-R` client: connects to `host:port` with rdma_cm.
    ///
    /// # Errors
    /// As [`CmLink::connect`].
    pub fn connect_rdma_cm(host: &str, port: u16) -> Result<Oob> {
        let (link, peer) = CmLink::connect(host, port)?;
        Ok(Oob {
            link: Link::Cm(Box::new(link)),
            server: false,
            peer,
        })
    }

    /// True when the messages travel over rdma_cm (`-R`): endpoints are then binary.
    pub fn is_rdma_cm(&self) -> bool {
        matches!(self.link, Link::Cm(_))
    }

    /// True on the accepting side.
    pub fn is_server(&self) -> bool {
        self.server
    }

    /// The peer's address.
    pub fn peer(&self) -> &str {
        &self.peer
    }

    /// One lock-step exchange: the client writes `out` then reads `inp.len()` bytes; the server
    /// reads first, then writes.
    ///
    /// # Errors
    /// [`Error::Oob`] naming what was being read and why it failed.
    pub fn exchange(&mut self, what: &str, out: &[u8], inp: &mut [u8], wait: Wait) -> Result<()> {
        if self.server {
            self.read_exact(what, inp, wait)?;
            self.write_all(what, out)
        } else {
            self.write_all(what, out)?;
            self.read_exact(what, inp, wait)
        }
    }

    fn write_all(&mut self, what: &str, b: &[u8]) -> Result<()> {
        let stream = match &mut self.link {
            Link::Tcp(s) => s,
            Link::Cm(c) => return c.send(what, b),
        };
        stream.write_all(b).map_err(|e| {
            Error::Oob(format!(
                " Unable to write {what} to the peer ({}): {e}\n Failed to exchange data between server and clients",
                self.peer
            ))
        })
    }

    /// Reads exactly `buf.len()` bytes within the wait's time limit.
    ///
    /// # Errors
    /// [`Error::Oob`]: the peer closed the connection (it exited or was killed), or the time
    /// limit passed.
    pub fn read_exact(&mut self, what: &str, buf: &mut [u8], wait: Wait) -> Result<()> {
        let stream = match &mut self.link {
            Link::Tcp(s) => s,
            Link::Cm(c) => return c.recv(what, buf, wait, self.server),
        };
        let limit = wait.limit();
        let deadline = Instant::now() + limit;
        let mut got = 0;
        let side = if self.server { "to" } else { "from" };
        let fail = |reason: String| {
            Error::Oob(format!(
                "ethernet_read_keys: Couldn't read {what}\n Unable to read {side} socket/rdma_cm\n Failed to exchange data between server and clients\n ({reason})"
            ))
        };
        while got < buf.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(fail(format!(
                    "no answer from the peer {} within {} s (got {got} of {} bytes)",
                    self.peer,
                    limit.as_secs(),
                    buf.len()
                )));
            }
            // A socket time-out in slices, so a long wait still notices the deadline.
            let slice = left
                .min(Duration::from_secs(1))
                .max(Duration::from_millis(1));
            stream.set_read_timeout(Some(slice)).ok();
            match stream.read(&mut buf[got..]) {
                // Nothing at all: a client may have reached another kind of server, where a
                // socket's peer that went away tells this side no more (a server's client
                // that goes away is just gone).
                Ok(0) if got == 0 && !self.server => {
                    return Err(fail(format!(
                        "the peer {} closed the connection after 0 of {} bytes: it exited or was \
                         killed, or it is not a server for this run (one started with -R takes \
                         rdma_cm connections only: give both ends -R, or neither)",
                        self.peer,
                        buf.len()
                    )))
                }
                Ok(0) => {
                    return Err(fail(format!(
                        "the peer {} closed the connection after {got} of {} bytes: it exited or was killed",
                        self.peer,
                        buf.len()
                    )))
                }
                Ok(n) => got += n,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {}
                Err(e) => return Err(fail(format!("reading from {}: {e}", self.peer))),
            }
        }
        Ok(())
    }

    /// Sends "done\0" and closes, as both perftest ends do last over TCP; errors are ignored
    /// (nobody reads it). Over rdma_cm perftest sends nothing: the connection just closes.
    pub fn finish(self) {
        if let Link::Tcp(mut stream) = self.link {
            let _ = stream.write_all(crate::wire::DONE);
            let _ = stream.shutdown(std::net::Shutdown::Write);
        }
    }

    /// Checks the socket without blocking: `Some(true)` if the peer closed it, `Some(false)` if
    /// it sent data that is waiting, `None` if nothing happened. Used while polling completions,
    /// so a dead peer ends the data path at once.
    pub fn peek_state(&self) -> Option<bool> {
        let stream = match &self.link {
            Link::Tcp(s) => s,
            Link::Cm(c) => return c.peek(),
        };
        let mut b = [0u8; 1];
        // SAFETY: `b` is a valid one-byte buffer; MSG_PEEK|MSG_DONTWAIT neither blocks nor
        // consumes data; the fd is open for the life of `stream`.
        let n = unsafe {
            libc::recv(
                stream.as_raw_fd(),
                b.as_mut_ptr().cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        match n {
            0 => Some(true),
            n if n > 0 => Some(false),
            _ => {
                let e = std::io::Error::last_os_error();
                match e.kind() {
                    ErrorKind::WouldBlock | ErrorKind::Interrupted => None,
                    _ => Some(true),
                }
            }
        }
    }
}

/// TCP keepalive with short timers, so a peer whose machine vanished (no FIN) is noticed in
/// about ten seconds even during a long passive wait.
fn set_keepalive(s: &TcpStream) {
    let fd = s.as_raw_fd();
    let set = |level: i32, opt: i32, v: i32| {
        // SAFETY: `fd` is an open socket; the option value is a valid int of the stated size.
        unsafe {
            libc::setsockopt(
                fd,
                level,
                opt,
                (&v as *const i32).cast(),
                std::mem::size_of::<i32>() as libc::socklen_t,
            )
        }
    };
    set(libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 5);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 2);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 3);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_step_exchange_and_eof_detection() {
        let l = listen(0).unwrap();
        let port = l.local_addr().unwrap().port();
        let t = std::thread::spawn(move || {
            let mut s = Oob::accept(l).unwrap();
            let mut b = [0u8; 4];
            s.exchange("x", b"pong", &mut b, Wait::Prompt).unwrap();
            assert_eq!(&b, b"ping");
            s.finish();
        });
        let mut c = Oob::connect("127.0.0.1", port).unwrap();
        let mut b = [0u8; 4];
        c.exchange("x", b"ping", &mut b, Wait::Prompt).unwrap();
        assert_eq!(&b, b"pong");
        t.join().unwrap();
        let mut done = [0u8; 5];
        c.read_exact("done", &mut done, Wait::Prompt).unwrap();
        assert_eq!(&done, b"done\0");
        // The server closed: reading more is a clear error, and peeking sees EOF.
        let e = c.read_exact("more", &mut done, Wait::Prompt).unwrap_err();
        assert!(e.to_string().contains("closed the connection"), "{e}");
        assert_eq!(c.peek_state(), Some(true));
    }

    #[test]
    fn no_server_is_perftests_message() {
        let port = {
            let l = listen(0).unwrap();
            l.local_addr().unwrap().port()
        };
        let e = Oob::connect("127.0.0.1", port).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("Couldn't connect to 127.0.0.1:{port}\n")),
            "{e}"
        );
        let e = Oob::connect("nonexistent.invalid", port)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("Name or service not known for nonexistent.invalid:"),
            "{e}"
        );
    }
}
