//! Frames over a blocking `TcpStream` with deadlines: every read and write has a time limit,
//! and a server's reads wake regularly to notice a stop.

use super::codec::{self, DecodeError, Message, LEN_PREFIX, MAX_FRAME};
use crate::error::{NetError, Result};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How often a waiting read checks the stop flag.
const TICK: Duration = Duration::from_millis(50);

/// A TCP stream carrying registry frames.
#[derive(Debug)]
pub(crate) struct FrameStream {
    stream: TcpStream,
    /// Received bytes not yet consumed: never more than one frame plus one read.
    buf: Vec<u8>,
    out: Vec<u8>,
    /// After an authenticated opening: every frame is followed by a 32-byte tag under the
    /// session key (as the handshake's control channel), so requests and replies cannot be
    /// rewritten, replayed or dropped on the way.
    seal: Option<Box<crate::handshake::auth::Seal>>,
}

/// Bytes of the tag that follows each frame of a sealed stream.
const TAG_LEN: usize = 32;

/// What a read gave: a message, or a frame whose body is not one (the stream stays in step).
pub(crate) type Frame = std::result::Result<Message, DecodeError>;

impl FrameStream {
    pub(crate) fn new(stream: TcpStream) -> Result<Self> {
        stream
            .set_nodelay(true)
            .map_err(|e| NetError::io("set_nodelay", e))?;
        Ok(FrameStream {
            stream,
            buf: Vec::with_capacity(LEN_PREFIX + MAX_FRAME + TAG_LEN),
            out: Vec::new(),
            seal: None,
        })
    }

    /// Seals every later frame, both ways (after the proofs).
    pub(crate) fn seal(&mut self, seal: crate::handshake::auth::Seal) {
        self.seal = Some(Box::new(seal));
    }

    /// Sends one message within `timeout`.
    pub(crate) fn send(&mut self, msg: &Message, timeout: Duration) -> Result<()> {
        self.out.clear();
        codec::encode(msg, &mut self.out).map_err(|e| NetError::InvalidArgument(e.to_string()))?;
        if let Some(seal) = &mut self.seal {
            let tag = seal.seal(&self.out);
            self.out.extend_from_slice(&tag);
        }
        self.stream
            .set_write_timeout(Some(timeout.max(Duration::from_millis(1))))
            .map_err(|e| NetError::io("set_write_timeout", e))?;
        self.stream
            .write_all(&self.out)
            .map_err(|e| match e.kind() {
                ErrorKind::WouldBlock | ErrorKind::TimedOut => NetError::Timeout {
                    op: "registry write",
                    millis: crate::deadline::whole_millis(timeout),
                },
                _ => NetError::io("registry write", e),
            })
    }

    /// The next frame, waiting until `deadline` (and, with `stop`, until it is set).
    ///
    /// # Errors
    /// [`NetError::RegistryMalformed`] when the stream is out of step (a frame size beyond
    /// the limit); [`NetError::Timeout`]; [`NetError::PeerClosed`]; [`NetError::Io`].
    pub(crate) fn recv(
        &mut self,
        op: &'static str,
        deadline: Instant,
        stop: Option<&AtomicBool>,
    ) -> Result<Frame> {
        let started = Instant::now();
        loop {
            if let Some((body, used)) = codec::split_frame(&self.buf)? {
                let Some(seal) = &mut self.seal else {
                    let frame = codec::decode_body(body);
                    self.buf.drain(..used);
                    return Ok(frame);
                };
                if let Some(tag) = self.buf.get(used..used + TAG_LEN) {
                    let tag: &[u8; TAG_LEN] = tag.try_into().expect("TAG_LEN bytes");
                    if !seal.expect(&self.buf[..used]).matches(tag) {
                        return Err(NetError::Auth(
                            "the registry connection was tampered with: a frame altered, \
                             replayed, reordered or forged; the connection is not trusted"
                                .into(),
                        ));
                    }
                    let frame = codec::decode_body(&self.buf[LEN_PREFIX..used]);
                    self.buf.drain(..used + TAG_LEN);
                    return Ok(frame);
                }
            }
            if stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
                return Err(NetError::PeerClosed("registry shutdown"));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(NetError::Timeout {
                    op,
                    millis: crate::deadline::whole_millis(
                        deadline
                            .duration_since(started)
                            .max(Duration::from_nanos(1)),
                    ),
                });
            }
            let wait = (deadline - now).min(TICK).max(Duration::from_millis(1));
            self.stream
                .set_read_timeout(Some(wait))
                .map_err(|e| NetError::io("set_read_timeout", e))?;
            self.read_some(op)?;
        }
    }

    fn read_some(&mut self, op: &'static str) -> Result<()> {
        // Read no further than the end of the frame in progress, so the buffer stays bounded.
        let mut chunk = [0u8; 512];
        let want = match self.buf.len() {
            n if n < LEN_PREFIX => LEN_PREFIX - n,
            _ => chunk.len(),
        };
        match self.stream.read(&mut chunk[..want]) {
            Ok(0) => Err(NetError::PeerClosed(op)),
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                Ok(())
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => Ok(()),
            Err(e) if e.kind() == ErrorKind::Interrupted => Ok(()),
            Err(e) => Err(NetError::io(op, e)),
        }
    }

    pub(crate) fn peer_addr(&self) -> Option<std::net::SocketAddr> {
        self.stream.peer_addr().ok()
    }
}
