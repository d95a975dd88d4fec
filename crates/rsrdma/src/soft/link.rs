//! Queue pairs in other processes, on this host or another: the soft device listens on a TCP
//! port of its address (the loopback address, or the one `RSRDMA_SOFT_ADDR` names; the port
//! is its LID and the address is in its GID, so a [`crate::QpEndpoint`] says where a QP
//! lives), and carries packets to another soft device over a connection it dials, one per
//! peer device (named by its address and port, which the dialer says first):
//! each packet's header then its payload (the header says the payload's length), written
//! with one vectored write per batch so that no payload is copied into a frame first, and
//! read into a buffer of the payload's own size, which the packet then owns. The connection a device dials
//! is only written; the ones it accepts are only read, each by its own thread, which hands
//! the packets to the destination QPs under the device lock, as a NIC executes what arrives
//! with no work from the application. Writes go through a queue and a writer thread, never
//! under the device lock: two devices that write to each other cannot block each other.
//!
//! A connection whose hello names an address other than the one it comes from is refused
//! (the dialer connects from its own device's address): a host cannot speak for another's
//! device, though, as on a RoCE fabric, it can for its own (trust is the fabric's; keys and
//! sequence numbers decide what a packet may do).
//!
//! A connection that ends (its process died, its socket reset) breaks the link of every QP
//! that talks to that device: their oldest request completes with `RETRY_EXC_ERR`.
//! Reliable, ordered streams need no retransmission, as `rsrdma-soft`'s packets assume.

use rsrdma_soft::{Packet, HEADER_LEN};
use std::collections::{HashMap, VecDeque};
use std::io::{BufReader, IoSlice, Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};

/// The largest payload a peer may send: a message of up to 2 GiB.
const MAX_PAYLOAD: usize = 1 << 31;
/// The most packets one vectored write carries (two slices each).
const MAX_BATCH: usize = 256;

/// What the links hand to the device.
pub(super) trait Deliver: Send + Sync + 'static {
    /// A packet from the device listening on `from`.
    fn packet(&self, from: SocketAddrV4, packet: Packet);
    /// The device listening on `peer` cannot be reached any more.
    fn link_down(&self, peer: SocketAddrV4);
}

/// The device's listener and its connections to other devices.
pub(super) struct Links {
    addr: SocketAddrV4,
    out: Mutex<HashMap<SocketAddrV4, Arc<Outbound>>>,
}

/// Packets queued for one peer device, and its writer thread's state.
struct Outbound {
    queue: Mutex<OutQueue>,
    ready: Condvar,
}

#[derive(Default)]
struct OutQueue {
    frames: VecDeque<Packet>,
    /// Frames the writer took and has not finished writing.
    writing: usize,
    /// The connection failed: what is queued is dropped.
    dead: bool,
}

impl Links {
    /// Listens on `at` (port 0: any free port) and starts accepting peers.
    ///
    /// # Errors
    /// The listener's.
    pub(super) fn start(at: SocketAddrV4, deliver: Arc<dyn Deliver>) -> std::io::Result<Links> {
        let listener = TcpListener::bind(at)?;
        let port = listener.local_addr()?.port();
        std::thread::Builder::new()
            .name("rsrdma-soft0-accept".into())
            .spawn(move || accept_loop(&listener, &deliver))?;
        Ok(Links {
            addr: SocketAddrV4::new(*at.ip(), port),
            out: Mutex::new(HashMap::new()),
        })
    }

    /// Where this device listens: its address, and its port (its LID).
    pub(super) fn addr(&self) -> SocketAddrV4 {
        self.addr
    }

    /// Queues `frame` for the device listening on `peer`, dialling it first if needed.
    /// Never blocks on the network.
    pub(super) fn send(&self, peer: SocketAddrV4, frame: Packet, deliver: &Arc<dyn Deliver>) {
        let out = {
            let mut map = self.out.lock().unwrap_or_else(|p| p.into_inner());
            let existing = map.get(&peer).filter(|o| !o.is_dead()).cloned();
            match existing {
                Some(o) => o,
                None => {
                    let o = Arc::new(Outbound {
                        queue: Mutex::new(OutQueue::default()),
                        ready: Condvar::new(),
                    });
                    map.insert(peer, o.clone());
                    let (w, d, me) = (o.clone(), deliver.clone(), self.addr);
                    let spawned = std::thread::Builder::new()
                        .name("rsrdma-soft0-link".into())
                        .spawn(move || write_loop(me, peer, &w, &d));
                    if spawned.is_err() {
                        o.kill();
                        deliver.link_down(peer);
                    }
                    o
                }
            }
        };
        let mut q = out.queue.lock().unwrap_or_else(|p| p.into_inner());
        if !q.dead {
            q.frames.push_back(frame);
            // The writer and any flush waiting on this queue.
            out.ready.notify_all();
        }
    }
}

impl Links {
    /// Waits (up to `limit` in all) until every packet queued so far has been written to
    /// its peer's socket or its link has died. A datagram or an acknowledgement completes,
    /// on a NIC, once it is on the wire; here once it is queued, so a process that destroys
    /// its queue pair and exits right after would lose what its writer threads had not
    /// written yet: a UD reply, the last datagrams to a second peer. `destroy_qp` calls
    /// this, without the device lock (a writer whose link fails takes it).
    pub(super) fn flush(&self, limit: std::time::Duration) {
        let deadline = std::time::Instant::now() + limit;
        let outs: Vec<Arc<Outbound>> = self
            .out
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        for o in outs {
            let mut q = o.queue.lock().unwrap_or_else(|p| p.into_inner());
            while !q.dead && (!q.frames.is_empty() || q.writing > 0) {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    return;
                }
                q = o
                    .ready
                    .wait_timeout(q, left)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
        }
    }
}

impl Outbound {
    fn is_dead(&self) -> bool {
        self.queue.lock().unwrap_or_else(|p| p.into_inner()).dead
    }

    fn kill(&self) {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        q.dead = true;
        q.frames.clear();
        q.writing = 0;
        self.ready.notify_all();
    }
}

/// The dialer's first bytes: the address and port it listens on (which name it).
const HELLO_LEN: usize = 6;

/// Dials the peer device, says which device this is, then writes what is queued.
fn write_loop(me: SocketAddrV4, peer: SocketAddrV4, out: &Outbound, deliver: &Arc<dyn Deliver>) {
    let written = (|| -> std::io::Result<()> {
        let mut s = dial_from(me, peer)?;
        s.set_nodelay(true)?;
        let mut hello = [0u8; HELLO_LEN];
        hello[..4].copy_from_slice(&me.ip().octets());
        hello[4..].copy_from_slice(&me.port().to_le_bytes());
        s.write_all(&hello)?;
        loop {
            let batch: Vec<Packet> = {
                let mut q = out.queue.lock().unwrap_or_else(|p| p.into_inner());
                while q.frames.is_empty() {
                    q = out.ready.wait(q).unwrap_or_else(|p| p.into_inner());
                }
                let n = q.frames.len().min(MAX_BATCH);
                q.writing = n;
                q.frames.drain(..n).collect()
            };
            let headers: Vec<[u8; HEADER_LEN]> = batch.iter().map(Packet::header).collect();
            let mut bufs: Vec<&[u8]> = Vec::with_capacity(2 * batch.len());
            for (h, p) in headers.iter().zip(&batch) {
                bufs.push(h);
                if !p.payload.is_empty() {
                    bufs.push(&p.payload);
                }
            }
            write_all_vectored(&mut s, &bufs)?;
            // Written: a flush waiting for them may go on.
            out.queue.lock().unwrap_or_else(|p| p.into_inner()).writing = 0;
            out.ready.notify_all();
        }
    })();
    if let Err(e) = written {
        tracing::debug!(%peer, error = %e, "soft0: the link to a peer device ended");
    }
    out.kill();
    deliver.link_down(peer);
}

/// Connects to `peer` from `me`'s address, so that the peer sees the connection come from
/// the address the hello names (a host with several addresses would otherwise pick the
/// route's).
fn dial_from(me: SocketAddrV4, peer: SocketAddrV4) -> std::io::Result<TcpStream> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    s.bind(&SocketAddrV4::new(*me.ip(), 0).into())?;
    s.connect(&peer.into())?;
    Ok(s.into())
}

fn accept_loop(listener: &TcpListener, deliver: &Arc<dyn Deliver>) {
    for stream in listener.incoming() {
        let Ok(stream) = stream else {
            continue;
        };
        let d = deliver.clone();
        let _ = std::thread::Builder::new()
            .name("rsrdma-soft0-recv".into())
            .spawn(move || read_loop(stream, &d));
    }
}

/// Writes every buffer, in order, with vectored writes (what the unstable
/// `Write::write_all_vectored` does).
fn write_all_vectored(s: &mut TcpStream, bufs: &[&[u8]]) -> std::io::Result<()> {
    let (mut first, mut skip) = (0, 0);
    while first < bufs.len() {
        let slices: Vec<IoSlice<'_>> = std::iter::once(IoSlice::new(&bufs[first][skip..]))
            .chain(bufs[first + 1..].iter().map(|b| IoSlice::new(b)))
            .collect();
        let mut n = match s.write_vectored(&slices) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        // Past what went: whole buffers, then into the next one.
        while first < bufs.len() {
            let left = bufs[first].len() - skip;
            if n < left {
                skip += n;
                break;
            }
            n -= left;
            first += 1;
            skip = 0;
        }
    }
    Ok(())
}

/// Reads a peer device's packets and hands them over; its end breaks that peer's links.
fn read_loop(s: TcpStream, deliver: &Arc<dyn Deliver>) {
    let came_from = s.peer_addr().ok();
    // Small packets (acknowledgements, requests) come out of the buffer; a large payload is
    // read past it, straight into the packet's own buffer.
    let mut s = BufReader::with_capacity(64 * 1024, s);
    let mut hello = [0u8; HELLO_LEN];
    if s.read_exact(&mut hello).is_err() {
        return;
    }
    let ip = Ipv4Addr::new(hello[0], hello[1], hello[2], hello[3]);
    let from = SocketAddrV4::new(ip, u16::from_le_bytes([hello[4], hello[5]]));
    let genuine = match came_from {
        Some(std::net::SocketAddr::V4(a)) => {
            a.ip() == from.ip() || a.ip().is_loopback() && from.ip().is_loopback()
        }
        _ => false,
    };
    if !genuine {
        tracing::warn!(
            %from,
            came_from = ?came_from,
            "soft0: a peer named a device at an address it does not come from; refused"
        );
        return;
    }
    loop {
        let mut header = [0u8; HEADER_LEN];
        if s.read_exact(&mut header).is_err() {
            break;
        }
        let len = Packet::payload_len(&header);
        if len > MAX_PAYLOAD {
            tracing::warn!(%from, len, "soft0: a peer device sent an oversized packet");
            break;
        }
        // Read into the vector's spare capacity: no zeroing of what the read overwrites.
        let mut payload = Vec::with_capacity(len);
        match (&mut s).take(len as u64).read_to_end(&mut payload) {
            Ok(n) if n == len => {}
            _ => break,
        }
        match Packet::decode_parts(&header, payload) {
            Ok(p) => deliver.packet(from, p),
            Err(e) => {
                tracing::warn!(%from, error = %e, "soft0: a malformed packet from a peer device");
                break;
            }
        }
    }
    deliver.link_down(from);
}

#[cfg(test)]
mod tests {
    use super::*;
    use rsrdma_soft::PacketKind;
    use std::sync::mpsc;
    use std::time::Duration;

    /// Hands what arrives to a channel.
    struct Collect(Mutex<mpsc::Sender<(SocketAddrV4, Packet)>>);

    impl Deliver for Collect {
        fn packet(&self, from: SocketAddrV4, packet: Packet) {
            let _ = self.0.lock().unwrap().send((from, packet));
        }

        fn link_down(&self, _: SocketAddrV4) {}
    }

    /// Connects to `links` from the loopback address, says `hello_from` is the device, and
    /// sends one packet.
    fn speak(links: &Links, hello_from: SocketAddrV4) {
        let mut s = TcpStream::connect(links.addr()).unwrap();
        let mut hello = [0u8; HELLO_LEN];
        hello[..4].copy_from_slice(&hello_from.ip().octets());
        hello[4..].copy_from_slice(&hello_from.port().to_le_bytes());
        s.write_all(&hello).unwrap();
        let p = Packet {
            dest_qpn: 7,
            psn: 1,
            kind: PacketKind::Send { imm: None },
            payload: vec![1, 2, 3].into(),
        };
        s.write_all(&p.encode()).unwrap();
    }

    #[test]
    fn a_peer_speaks_only_for_a_device_at_the_address_it_comes_from() {
        let (tx, rx) = mpsc::channel();
        let deliver: Arc<dyn Deliver> = Arc::new(Collect(Mutex::new(tx)));
        let links = Links::start(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0), deliver).unwrap();
        // From the loopback address, naming another host's device: refused, nothing arrives.
        speak(&links, SocketAddrV4::new(Ipv4Addr::new(10, 1, 2, 3), 4791));
        assert!(rx.recv_timeout(Duration::from_millis(500)).is_err());
        // Naming a device on this host (any loopback address): its packet arrives.
        let me = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 5000);
        speak(&links, me);
        let (from, p) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(
            (from, p.dest_qpn, &p.payload[..]),
            (me, 7, &[1u8, 2, 3][..])
        );
    }
}
