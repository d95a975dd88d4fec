//! Reassembling frames from a byte stream that arrives in arbitrary pieces.

use super::codec::{self, DecodeError, Message};
use std::io::{self, Read};

/// Bytes asked of the source per read.
const CHUNK: usize = 16 * 1024;

/// Accumulates bytes read from a (typically non-blocking) source and yields whole frames.
///
/// Garbage is refused as soon as its header shows it, and a header announcing an oversized
/// body is refused before the body is read, so the buffer never holds more than one maximal
/// frame plus one read.
#[derive(Debug, Default)]
pub struct FrameReader {
    buf: Vec<u8>,
    /// Where the first unconsumed byte is: consumed frames are dropped lazily.
    start: usize,
}

impl FrameReader {
    /// An empty reader.
    pub fn new() -> FrameReader {
        FrameReader::default()
    }

    /// Reads once from `src` into the buffer: `Ok(0)` at end of stream, else how many bytes
    /// came. `WouldBlock` and other errors pass through unchanged.
    ///
    /// # Errors
    /// The source's.
    pub fn read_from(&mut self, src: &mut impl Read) -> io::Result<usize> {
        self.compact();
        let old = self.buf.len();
        self.buf.resize(old + CHUNK, 0);
        let r = src.read(&mut self.buf[old..]);
        self.buf.truncate(old + *r.as_ref().unwrap_or(&0));
        r
    }

    /// The next whole frame in the buffer, if one is complete.
    ///
    /// # Errors
    /// [`DecodeError`] when the buffered bytes cannot be a frame; the stream is then out of
    /// step and the same error repeats.
    pub fn next_frame(&mut self) -> Result<Option<Message>, DecodeError> {
        Ok(self.next_frame_raw()?.map(|(msg, _)| msg))
    }

    /// As [`FrameReader::next_frame`], with the frame's bytes as they arrived (what an
    /// authenticated channel's tag covers).
    ///
    /// # Errors
    /// As [`FrameReader::next_frame`].
    pub fn next_frame_raw(&mut self) -> Result<Option<(Message, &[u8])>, DecodeError> {
        match codec::decode(&self.buf[self.start..])? {
            Some((msg, used)) => {
                let raw = &self.buf[self.start..self.start + used];
                self.start += used;
                Ok(Some((msg, raw)))
            }
            None => Ok(None),
        }
    }

    /// Bytes received but not yet part of a whole frame.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }

    fn compact(&mut self) {
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handshake::codec::Regions;
    use rsrdma::RemoteMemory;
    use std::collections::VecDeque;

    /// A source that hands out its pieces one per read, then would block.
    struct Pieces(VecDeque<Vec<u8>>);

    impl Read for Pieces {
        fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
            let Some(mut p) = self.0.pop_front() else {
                return Err(io::ErrorKind::WouldBlock.into());
            };
            let n = p.len().min(out.len());
            out[..n].copy_from_slice(&p[..n]);
            if n < p.len() {
                self.0.push_front(p.split_off(n));
            }
            Ok(n)
        }
    }

    fn stream() -> (Vec<Message>, Vec<u8>) {
        let msgs = vec![
            Message::Sync(7),
            Message::Regions(Regions(vec![RemoteMemory {
                addr: 0x1000,
                len: 4096,
                rkey: 3,
            }])),
            Message::Keepalive,
            Message::Abort("bye".into()),
        ];
        let mut bytes = Vec::new();
        for m in &msgs {
            m.encode(&mut bytes).unwrap();
        }
        (msgs, bytes)
    }

    #[test]
    fn frames_split_at_every_pair_of_boundaries_come_out_whole() {
        let (msgs, bytes) = stream();
        for a in 0..=bytes.len() {
            for b in a..=bytes.len() {
                let mut src = Pieces(
                    [&bytes[..a], &bytes[a..b], &bytes[b..]]
                        .iter()
                        .map(|p| p.to_vec())
                        .collect(),
                );
                let mut r = FrameReader::new();
                let mut got = Vec::new();
                loop {
                    while let Some(m) = r.next_frame().unwrap() {
                        got.push(m);
                    }
                    match r.read_from(&mut src) {
                        Ok(_) => {}
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) => panic!("{e}"),
                    }
                }
                assert_eq!(got, msgs, "cut at {a} and {b}");
                assert_eq!(r.buffered(), 0);
            }
        }
    }

    #[test]
    fn a_partial_frame_stays_buffered_and_garbage_is_refused() {
        let (_, bytes) = stream();
        let mut r = FrameReader::new();
        let mut src = Pieces([bytes[..5].to_vec()].into());
        r.read_from(&mut src).unwrap();
        assert_eq!(r.next_frame(), Ok(None));
        assert_eq!(r.buffered(), 5);
        let mut r = FrameReader::new();
        let mut src = Pieces([b"RSRX".to_vec()].into());
        r.read_from(&mut src).unwrap();
        assert!(matches!(r.next_frame(), Err(DecodeError::BadMagic(_))));
    }
}
