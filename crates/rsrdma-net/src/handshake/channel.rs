//! The blocking driver of the handshake over a TCP stream.

use super::codec::{self, Endpoint, Hello, Message, Proof, Regions, Role, HEADER_LEN};
use super::{auth, settle, Settled};
use crate::error::{NetError, Result};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// The TCP control channel: the handshake, then barriers and the close.
#[derive(Debug)]
pub struct Channel {
    stream: TcpStream,
    timeout: Duration,
    role: Role,
}

impl Channel {
    /// Wraps a connected stream; every read waits at most `timeout`.
    ///
    /// # Errors
    /// [`NetError::Io`] when the timeout cannot be set.
    pub fn new(stream: TcpStream, role: Role, timeout: Duration) -> Result<Channel> {
        stream
            .set_read_timeout(Some(timeout))
            .map_err(|e| NetError::io("set_read_timeout", e))?;
        stream
            .set_write_timeout(Some(timeout))
            .map_err(|e| NetError::io("set_write_timeout", e))?;
        stream
            .set_nodelay(true)
            .map_err(|e| NetError::io("set_nodelay", e))?;
        Ok(Channel {
            stream,
            timeout,
            role,
        })
    }

    /// This side's role.
    pub fn role(&self) -> Role {
        self.role
    }

    /// The socket.
    pub fn stream(&self) -> &TcpStream {
        &self.stream
    }

    /// Sends one message.
    ///
    /// # Errors
    /// [`NetError::Io`] or [`NetError::Timeout`].
    pub fn send(&mut self, msg: &Message) -> Result<()> {
        self.stream
            .write_all(&msg.to_bytes())
            .map_err(|e| self.map_io("send handshake message", e))
    }

    /// Receives one message, waiting at most the channel's timeout for each part. A peer's
    /// abort becomes [`NetError::PeerAborted`].
    ///
    /// # Errors
    /// [`NetError::Malformed`], [`NetError::PeerClosed`], [`NetError::Timeout`],
    /// [`NetError::PeerAborted`].
    pub fn recv(&mut self, op: &'static str) -> Result<Message> {
        let mut header = [0u8; HEADER_LEN];
        self.read_exact(&mut header, op)?;
        let h = codec::decode_header(&header)?;
        let mut body = vec![0u8; h.body_len];
        self.read_exact(&mut body, op)?;
        match codec::decode_body(h.kind, &body)? {
            Message::Abort(why) => Err(NetError::PeerAborted(why)),
            m => Ok(m),
        }
    }

    fn read_exact(&mut self, buf: &mut [u8], op: &'static str) -> Result<()> {
        self.stream.read_exact(buf).map_err(|e| match e.kind() {
            ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset => NetError::PeerClosed(op),
            _ => self.map_io(op, e),
        })
    }

    fn map_io(&self, op: &'static str, e: std::io::Error) -> NetError {
        match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => NetError::Timeout {
                op,
                millis: self.timeout.as_millis() as u64,
            },
            _ => NetError::io(op, e),
        }
    }

    /// Tells the peer why this side gives up (best effort), and returns `err`.
    pub fn abort(&mut self, err: NetError) -> NetError {
        let _ = self.send(&Message::Abort(err.to_string()));
        err
    }

    /// The opening: hellos, then proofs when either side demands authentication. Nothing
    /// about queue pairs or memory has been sent when this returns an error.
    ///
    /// # Errors
    /// [`NetError::Auth`] when a proof is missing or wrong; the errors of [`Channel::recv`].
    pub fn authenticate(&mut self, secret: Option<&[u8]>) -> Result<()> {
        let nonce = auth::nonce().map_err(|e| NetError::io("read /dev/urandom", e))?;
        self.send(&Message::Hello(Hello {
            role: self.role,
            auth_required: secret.is_some(),
            nonce,
        }))?;
        let peer = match self.recv("handshake hello")? {
            Message::Hello(h) => h,
            other => {
                return Err(self.abort(NetError::Unexpected {
                    expected: "hello",
                    got: other.name(),
                }))
            }
        };
        if peer.role == self.role {
            return Err(self.abort(NetError::Auth(format!(
                "both ends claim to be the {}",
                self.role
            ))));
        }
        if !(peer.auth_required || secret.is_some()) {
            return Ok(());
        }
        let Some(secret) = secret else {
            return Err(self.abort(NetError::Auth(
                "the peer requires a shared secret and none is configured here".into(),
            )));
        };
        self.send(&Message::Proof(Proof {
            tag: auth::proof(secret, self.role, &nonce, &peer.nonce),
        }))?;
        let tag = match self.recv("handshake proof")? {
            Message::Proof(p) => p.tag,
            other => {
                return Err(self.abort(NetError::Unexpected {
                    expected: "proof",
                    got: other.name(),
                }))
            }
        };
        if !auth::verify(secret, peer.role, &peer.nonce, &nonce, &tag) {
            return Err(self.abort(NetError::Auth(
                "the peer's proof does not match the shared secret".into(),
            )));
        }
        Ok(())
    }

    /// Swaps endpoints and settles on what both can do. On a mismatch both sides learn which
    /// option differs (each computes it from the same two endpoints).
    ///
    /// # Errors
    /// [`NetError::Mismatch`]; the errors of [`Channel::recv`].
    pub fn exchange_endpoints(
        &mut self,
        local: &Endpoint,
        param_name: impl Fn(u16) -> String,
    ) -> Result<(Endpoint, Settled)> {
        self.send(&Message::Endpoint(local.clone()))?;
        let peer = match self.recv("handshake endpoint")? {
            Message::Endpoint(e) => e,
            other => {
                return Err(self.abort(NetError::Unexpected {
                    expected: "endpoint",
                    got: other.name(),
                }))
            }
        };
        let settled = settle(local, &peer, param_name)?;
        Ok((peer, settled))
    }

    /// Swaps memory descriptors.
    ///
    /// # Errors
    /// The errors of [`Channel::recv`].
    pub fn exchange_regions(&mut self, local: &Regions) -> Result<Regions> {
        self.send(&Message::Regions(local.clone()))?;
        match self.recv("memory descriptors")? {
            Message::Regions(r) => Ok(r),
            other => Err(self.abort(NetError::Unexpected {
                expected: "regions",
                got: other.name(),
            })),
        }
    }

    /// A barrier: both sides send `step` and wait for the other's.
    ///
    /// # Errors
    /// [`NetError::Unexpected`] when the peer is at another step; the errors of
    /// [`Channel::recv`].
    pub fn barrier(&mut self, step: u32) -> Result<()> {
        self.send(&Message::Sync(step))?;
        match self.recv("barrier")? {
            Message::Sync(s) if s == step => Ok(()),
            Message::Sync(_) => Err(self.abort(NetError::Unexpected {
                expected: "the same barrier step",
                got: "another step",
            })),
            other => Err(self.abort(NetError::Unexpected {
                expected: "sync",
                got: other.name(),
            })),
        }
    }
}
