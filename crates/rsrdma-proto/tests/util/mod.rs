//! A simulated RC link for two cores (after quinn's test `Pair`): one FIFO per direction (in
//! order, lossless), virtual time, and the verbs rules as assertions: an arriving SEND finds a
//! posted receive (else "RNR: credit bug") big enough for it; only signalled WRs complete, and
//! complete every earlier one; the SQ never overflows; a receive slot is never posted twice.
//! Knobs: hold a direction, delay send completions, break one side's QP.

#![allow(dead_code)] // each test file uses a part

use rsrdma_proto::{
    settle, Config, Conn, Event, Fatal, FrameType, Header, LentPayload, ProtoError, Recv, Step,
    VecSlots, Work, WrId, HEADER_LEN,
};
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// The payload byte of message `id` at `offset`: corruption, loss and reordering all show.
pub fn byte_at(id: u64, offset: usize) -> u8 {
    (id.wrapping_mul(131) as usize ^ offset.wrapping_mul(7) ^ (offset >> 8).wrapping_mul(13)) as u8
}

/// The value of a call that must have done its work: neither failed nor blocked.
pub fn done<T: std::fmt::Debug>(r: Result<Step<T>, ProtoError>) -> T {
    match r {
        Ok(Step::Done(v)) => v,
        other => panic!("not done: {other:?}"),
    }
}

/// Message `id` of `len` bytes.
pub fn payload(id: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| byte_at(id, i)).collect()
}

/// A small configuration: 256-byte slots (240 payload bytes a frame), 8 receive slots, 6
/// send slots and an SQ of 8, so that credits and the SQ run out within a few messages.
pub fn small_config() -> Config {
    Config::default()
        .with_slot_size(256)
        .with_recv_slots(8)
        .with_send_slots(6)
        .with_sq_depth(8)
        .with_signal_interval(4)
        .with_inline_size(64)
        .with_max_message(64 * 1024)
}

/// Sends `lens` from side 0, message `i` lent when `lent(i)` and else by `send_any` (copied
/// or rendezvous), reads on side 1 with `recv_any` (the read path a driver would use), and
/// releases side 0's memory as the core allows. Returns the receiver's checker once every
/// message is taken; panics where the link stops making progress.
pub fn transfer_lent_or_any(p: &mut Pair, lens: &[usize], lent: impl Fn(usize) -> bool) -> Checker {
    let mut chk = Checker::default();
    let mut next = 0;
    for _ in 0..200_000 {
        if next < lens.len() {
            let data = payload(next as u64, lens[next]);
            let sent = if lent(next) {
                p.sides[0].send_lent(&data).map(|s| !s.is_blocked())
            } else {
                p.sides[0].send_any(&data).map(|s| !s.is_blocked())
            };
            if sent.unwrap_or(false) {
                chk.lens.push(lens[next]);
                next += 1;
            }
        }
        p.pump(0);
        loop {
            match p.sides[1].recv_any() {
                Ok(Recv::Data(m)) => chk.on_msg(&m),
                Ok(Recv::Eof | Recv::Blocked) => break,
                Ok(Recv::NeedsRead { .. }) => unreachable!("recv_any starts the read"),
                Err(e) => panic!("{e}"),
            }
        }
        p.pump(1);
        p.sides[0].release();
        if !p.step() && next == lens.len() && chk.all_taken() {
            return chk;
        }
    }
    panic!(
        "no progress: {next} of {} sent, {} taken",
        lens.len(),
        chk.done()
    );
}

struct Packet {
    wr: WrId,
    signaled: bool,
    slot: Option<u16>,
    len: u32,
    inline: Option<Vec<u8>>,
    /// An RDMA READ: (local address, lkey, remote address, rkey).
    read: Option<(u64, u32, u64, u32)>,
    /// A lent payload after the slot's header.
    lent: Option<LentPayload>,
    /// A window bind or invalidation: nothing goes to the peer; it takes effect in SQ order.
    window: Option<WindowOp>,
}

/// A memory-window request on the model send queue.
#[derive(Clone, Copy)]
enum WindowOp {
    /// Bind window key `rkey` to `len` bytes at `addr` of region `key`.
    Bind {
        rkey: u32,
        key: u32,
        addr: u64,
        len: u32,
    },
    /// Invalidate window key `rkey`.
    Invalidate { rkey: u32 },
}

/// One endpoint: the core plus the model of its queue pair.
pub struct Side {
    pub conn: Conn<VecSlots>,
    pub cfg: Config,
    posted: VecDeque<u16>,
    /// Receives ever posted (the most any frame of this side may announce).
    recvs_posted: u64,
    sq: VecDeque<(WrId, bool)>,
    pub events: Vec<Event>,
    /// Frames posted after the core reported failure (type of each).
    pub posted_after_failure: Vec<FrameType>,
    /// Frames posted, by type.
    pub frames_posted: Vec<FrameType>,
    pub broken: bool,
    /// Registered memory of this side by key (rendezvous sources and read destinations).
    pub regions: HashMap<u32, Vec<u8>>,
    next_key: u32,
    /// Rendezvous sends whose memory is still registered: (message number, key).
    pub rdv_sends: Vec<(u64, u32)>,
    /// Lent sends whose memory is still registered: (message number, key).
    pub lent_sends: Vec<(u64, u32)>,
    /// The destination key of the read in progress.
    pub read_key: Option<u32>,
    /// READs posted.
    pub reads_posted: usize,
    /// Rendezvous sends go through memory windows (`send_rendezvous_window`).
    pub use_windows: bool,
    /// Bound windows: key -> (region key, address, length). A READ through a key not here
    /// fails the test.
    pub windows: HashMap<u32, (u32, u64, u32)>,
    /// Window keys handed out (each bind gets a new one).
    next_window_key: u32,
    /// Windows bound and invalidated, over the run.
    pub windows_bound: usize,
    pub windows_invalidated: usize,
}

impl Side {
    fn new(cfg: Config, peer: &Config, now: Instant) -> Self {
        let settled = settle(&cfg.params(), &peer.params()).expect("settle");
        let conn = Conn::new(&cfg, &settled, VecSlots::for_config(&cfg), now).expect("Conn::new");
        Self {
            conn,
            cfg,
            posted: VecDeque::new(),
            recvs_posted: 0,
            sq: VecDeque::new(),
            events: Vec::new(),
            posted_after_failure: Vec::new(),
            frames_posted: Vec::new(),
            broken: false,
            regions: HashMap::new(),
            next_key: 1,
            rdv_sends: Vec::new(),
            lent_sends: Vec::new(),
            read_key: None,
            reads_posted: 0,
            use_windows: false,
            windows: HashMap::new(),
            next_window_key: 0x8000_0000,
            windows_bound: 0,
            windows_invalidated: 0,
        }
    }

    /// Registers `bytes` and returns the key.
    pub fn register(&mut self, bytes: Vec<u8>) -> u32 {
        let key = self.next_key;
        self.next_key += 1;
        self.regions.insert(key, bytes);
        key
    }

    /// Sends `data` by rendezvous when it is settled and `data` reaches the threshold,
    /// else eagerly.
    pub fn send_any(&mut self, data: &[u8]) -> Result<Step<()>, ProtoError> {
        match self.conn.rendezvous_threshold() {
            Some(t) if data.len() >= t as usize => {
                let key = self.register(data.to_vec());
                let sent = if self.use_windows {
                    self.next_window_key += 1;
                    self.conn
                        .send_rendezvous_window(data.len(), 0, self.next_window_key)
                } else {
                    self.conn.send_rendezvous(data.len(), 0, key)
                };
                if let Ok(Step::Done(msg)) = sent {
                    self.rdv_sends.push((msg, key));
                    return Ok(Step::Done(()));
                }
                self.regions.remove(&key);
                sent.map(|_| Step::Blocked)
            }
            _ => self.conn.send_msg(data),
        }
    }

    /// Sends `data` from lent memory (registered here, at address 0 of a key of its own):
    /// no copy; the region stays until `release` finds the message released.
    pub fn send_lent(&mut self, data: &[u8]) -> Result<Step<u64>, ProtoError> {
        let key = self.register(data.to_vec());
        let sent = self.conn.send_msg_lent(data.len(), 0, key);
        match sent {
            Ok(Step::Done(msg)) => self.lent_sends.push((msg, key)),
            _ => {
                self.regions.remove(&key);
            }
        }
        sent
    }

    /// Releases rendezvous and lent memory the core says is done with.
    pub fn release(&mut self) {
        let conn = &self.conn;
        let regions = &mut self.regions;
        let windows = &self.windows;
        self.rdv_sends.retain(|&(msg, key)| {
            let done = conn.rendezvous_released(msg);
            if done {
                assert!(
                    windows.values().all(|&(k, _, _)| k != key),
                    "message {msg} released while a window still exposes its memory"
                );
                regions.remove(&key);
            }
            !done
        });
        self.lent_sends.retain(|&(msg, key)| {
            let done = conn.lent_released(msg);
            if done {
                regions.remove(&key);
            }
            !done
        });
    }

    /// `recv_msg`, reading rendezvous messages as a driver would: `Blocked` while a read is
    /// in flight (never `NeedsRead`: it starts the read).
    pub fn recv_any(&mut self) -> Result<Recv<Vec<u8>>, ProtoError> {
        if let Some(key) = self.read_key {
            return match self.conn.take_read() {
                Some(n) => {
                    self.read_key = None;
                    let mut v = self.regions.remove(&key).expect("read destination");
                    assert!(v.len() >= n);
                    v.truncate(n);
                    Ok(Recv::Data(v))
                }
                None => Ok(Recv::Blocked),
            };
        }
        match self.conn.recv_msg() {
            Ok(Recv::NeedsRead { len }) => {
                // Started or not (no SQ room), the message is not here yet.
                let _ = self.start_read(len)?;
                Ok(Recv::Blocked)
            }
            r => r,
        }
    }

    /// Registers a destination of `len` bytes and starts the read of the head message.
    pub fn start_read(&mut self, len: usize) -> Result<Step<()>, ProtoError> {
        let key = self.register(vec![0; len]);
        let started = self.conn.start_read(0, key, len);
        match started {
            Ok(Step::Done(())) => self.read_key = Some(key),
            _ => {
                self.regions.remove(&key);
            }
        }
        started
    }

    /// Checks a send-queue request that is not a SEND (`what`) as side `i` posts it: room in
    /// the SQ, the next WR id, a connection that has not failed.
    fn check_non_send(&self, i: usize, wr_id: WrId, what: &str) {
        let depth = usize::from(self.cfg.sq_depth);
        assert!(self.sq.len() < depth, "side {i}: SQ overflow");
        if let Some((last, _)) = self.sq.back() {
            assert_eq!(wr_id.0, last.0 + 1, "side {i}: WR ids not consecutive");
        }
        assert!(self.conn.error().is_none(), "{what} posted after failure");
    }

    /// Checks that `len` bytes at `addr` of region `key` are registered (for `what`).
    fn check_range(&self, key: u32, addr: u64, len: u32, what: &str) {
        let region = self
            .regions
            .get(&key)
            .unwrap_or_else(|| panic!("{what} over unregistered memory"));
        assert!(
            addr as usize + len as usize <= region.len(),
            "{what} beyond its region"
        );
    }

    /// Receives posted (the model's view).
    pub fn posted_receives(&self) -> usize {
        self.posted.len()
    }

    /// Send WRs posted and not completed (the model's view).
    pub fn sq_len(&self) -> usize {
        self.sq.len()
    }

    pub fn failed(&self) -> bool {
        self.conn.error().is_some()
    }
}

/// Two cores and the link between them.
pub struct Pair {
    pub sides: [Side; 2],
    wire: [VecDeque<Packet>; 2],
    completions: [VecDeque<WrId>; 2],
    pub now: Instant,
    /// Hold frames sent by side `i` on the wire.
    pub hold: [bool; 2],
    /// Keep send completions until `complete` is called.
    pub delay_completions: bool,
    /// Side `i`'s driver leaves queued reposts for a later pump whenever the core allows
    /// (`Conn::reposts_may_wait`), as a blocking receive loop does.
    pub defer_reposts: [bool; 2],
    /// Side `i` sends a message that fits one inline frame the lean way when the core takes
    /// it (`Conn::send_inline_now`: posted at once, ahead of the queue), as a blocking
    /// `send_msg` does; see [`Pair::send`].
    pub fast_sends: [bool; 2],
    turn: usize,
}

impl Pair {
    pub fn new(a: Config, b: Config) -> Self {
        let now = Instant::now();
        let sides = [Side::new(a.clone(), &b, now), Side::new(b, &a, now)];
        let mut p = Self {
            sides,
            wire: [VecDeque::new(), VecDeque::new()],
            completions: [VecDeque::new(), VecDeque::new()],
            now,
            hold: [false; 2],
            delay_completions: false,
            defer_reposts: [false; 2],
            fast_sends: [false; 2],
            turn: 0,
        };
        p.pump(0);
        p.pump(1);
        p
    }

    /// Sends `data` from side `i`: below the rendezvous threshold and with `fast_sends[i]`,
    /// first the lean way (the frame `Conn::send_inline_now` builds is posted here and now,
    /// before anything queued, as rsrdma-net's driver does), else as [`Side::send_any`].
    pub fn send(&mut self, i: usize, data: &[u8]) -> Result<Step<()>, ProtoError> {
        let below = self.sides[i]
            .conn
            .rendezvous_threshold()
            .map_or(true, |t| data.len() < t as usize);
        if self.fast_sends[i] && below {
            if let Some(w) = self.sides[i].conn.send_inline_now(data) {
                assert!(
                    matches!(
                        w,
                        Work::PostSend {
                            slot: None,
                            lent: None,
                            ..
                        }
                    ),
                    "send_inline_now built {w:?}"
                );
                self.post(i, w);
                return Ok(Step::Done(()));
            }
        }
        self.sides[i].send_any(data)
    }

    /// Frames on the wire from side `i`.
    pub fn in_flight(&self, i: usize) -> usize {
        self.wire[i].len()
    }

    /// Send completions waiting for side `i`.
    pub fn pending_completions(&self, i: usize) -> usize {
        self.completions[i].len()
    }

    /// Drains side `i`'s outputs like a driver: work onto the model QP, events into `events`.
    /// Posts in rounds, as rsrdma-net's driver may: of what was queued when a round began, the
    /// sends go first (built before the round's receives were taken, they announce none of
    /// them), then the receives; what the queue holds after that (a CREDIT frame due once
    /// the receives were taken) is the next round. Every send is checked to announce only
    /// receives posted before it.
    pub fn pump(&mut self, i: usize) {
        let deferred = self.defer_reposts[i] && self.sides[i].conn.reposts_may_wait();
        loop {
            let side = &mut self.sides[i];
            if deferred {
                break;
            }
            let queued = side.conn.work_queued();
            let mut round: Vec<Work> = (0..queued).filter_map(|_| side.conn.poll_work()).collect();
            if round.is_empty() {
                // Taking receives may make a CREDIT frame due: `poll_work` builds it now.
                match side.conn.poll_work() {
                    Some(w) => round.push(w),
                    None => break,
                }
            }
            let (sends, recvs): (Vec<Work>, Vec<Work>) = round
                .into_iter()
                .partition(|w| !matches!(w, Work::PostRecv { .. }));
            for w in sends.into_iter().chain(recvs) {
                self.post(i, w);
            }
        }
        self.drain_events(i);
    }

    /// Posts one work request of side `i` on the model QP.
    fn post(&mut self, i: usize, w: Work) {
        let side = &mut self.sides[i];
        {
            assert!(!side.broken, "side {i} posted {w:?} on a broken QP");
            match w {
                Work::PostRead {
                    wr_id,
                    local_addr,
                    lkey,
                    remote_addr,
                    rkey,
                    len,
                } => {
                    side.check_non_send(i, wr_id, "READ");
                    side.check_range(lkey, local_addr, len, "READ");
                    assert!(
                        len <= side.cfg.max_read,
                        "side {i}: a READ of {len} bytes, over max_read {}",
                        side.cfg.max_read
                    );
                    side.reads_posted += 1;
                    side.sq.push_back((wr_id, true));
                    self.wire[i].push_back(Packet {
                        wr: wr_id,
                        signaled: true,
                        slot: None,
                        len,
                        inline: None,
                        read: Some((local_addr, lkey, remote_addr, rkey)),
                        lent: None,
                        window: None,
                    });
                }
                Work::BindWindow {
                    wr_id,
                    msg,
                    addr,
                    len,
                    rkey,
                    signaled,
                } => {
                    let op = {
                        let key = side
                            .rdv_sends
                            .iter()
                            .find(|&&(m, _)| m == msg)
                            .map(|&(_, k)| k)
                            .expect("a window bound for a message not sent by rendezvous");
                        WindowOp::Bind {
                            rkey,
                            key,
                            addr,
                            len,
                        }
                    };
                    self.post_window_op(i, wr_id, signaled, op);
                }
                Work::InvalidateWindow {
                    wr_id,
                    msg: _,
                    rkey,
                } => {
                    self.post_window_op(i, wr_id, true, WindowOp::Invalidate { rkey });
                }
                Work::PostRecv { slot } => {
                    assert!(
                        !side.posted.contains(&slot),
                        "side {i}: receive slot {slot} posted twice"
                    );
                    side.posted.push_back(slot);
                    side.recvs_posted += 1;
                }
                Work::PostSend {
                    wr_id,
                    slot,
                    len,
                    signaled,
                    lent,
                } => {
                    let depth = usize::from(side.cfg.sq_depth);
                    assert!(
                        side.sq.len() < depth,
                        "side {i}: SQ overflow ({depth} WRs outstanding)"
                    );
                    if let Some((last, _)) = side.sq.back() {
                        assert_eq!(wr_id.0, last.0 + 1, "side {i}: WR ids not consecutive");
                    }
                    let inline = match slot {
                        None => {
                            let bytes = side
                                .conn
                                .inline_frame(wr_id)
                                .expect("inline frame")
                                .to_vec();
                            assert_eq!(bytes.len(), len as usize, "inline length");
                            assert!(
                                len <= u32::from(side.cfg.inline_size),
                                "inline over the QP's limit"
                            );
                            Some(bytes)
                        }
                        Some(s) => {
                            assert!(len <= side.cfg.slot_size, "send longer than its slot");
                            let _ = s;
                            None
                        }
                    };
                    if let Some(l) = lent {
                        assert!(slot.is_some(), "a lent payload without a header slot");
                        assert_eq!(len, HEADER_LEN as u32 + l.len, "lent frame length");
                        assert!(l.len > 0, "an empty lent SGE");
                        let region = side.regions.get(&l.lkey).expect("lent memory unregistered");
                        assert!(
                            l.addr as usize + l.len as usize <= region.len(),
                            "lent SGE beyond its region"
                        );
                    }
                    let head = match &inline {
                        Some(b) => Header::decode(b),
                        None => Header::decode(side.conn.memory().send_slot(slot.unwrap())),
                    }
                    .expect("the core sends well-formed headers");
                    assert!(
                        u64::from(head.credit_limit) <= side.recvs_posted,
                        "side {i}: a {:?} announces {} receives, {} are posted",
                        head.kind,
                        head.credit_limit,
                        side.recvs_posted
                    );
                    side.frames_posted.push(head.kind);
                    if side.conn.error().is_some() {
                        side.posted_after_failure.push(head.kind);
                    }
                    side.sq.push_back((wr_id, signaled));
                    self.wire[i].push_back(Packet {
                        wr: wr_id,
                        signaled,
                        slot,
                        len,
                        inline,
                        read: None,
                        lent,
                        window: None,
                    });
                }
            }
        }
    }

    /// Posts a window request of side `i` on its model send queue.
    fn post_window_op(&mut self, i: usize, wr_id: WrId, signaled: bool, op: WindowOp) {
        let side = &mut self.sides[i];
        side.check_non_send(i, wr_id, "window request");
        if let WindowOp::Bind { key, addr, len, .. } = op {
            side.check_range(key, addr, len, "window");
        }
        side.sq.push_back((wr_id, signaled));
        self.wire[i].push_back(Packet {
            wr: wr_id,
            signaled,
            slot: None,
            len: 0,
            inline: None,
            read: None,
            lent: None,
            window: Some(op),
        });
    }

    /// Side `i`'s events into `events`, and a check of its next deadline.
    fn drain_events(&mut self, i: usize) {
        let side = &mut self.sides[i];
        while let Some(e) = side.conn.poll_event() {
            side.events.push(e);
        }
        if let Some(t) = side.conn.poll_timeout() {
            // A deadline may be due at once, never in the past of an earlier input.
            assert!(
                t + Duration::from_secs(3600) > self.now,
                "timeout far in the past"
            );
        }
    }

    /// Delivers the oldest frame sent by side `from`. Returns false if there is none.
    pub fn deliver(&mut self, from: usize) -> bool {
        self.deliver_into(from, None).0
    }

    /// As [`Pair::deliver`], with the receiving core's completion taken the way a driver
    /// whose reader waits with `buf` takes it (`handle_recv_completion_into`): the second
    /// value is the length of a message copied straight into `buf`.
    pub fn deliver_into(&mut self, from: usize, buf: Option<&mut [u8]>) -> (bool, Option<usize>) {
        let Some(p) = self.wire[from].pop_front() else {
            return (false, None);
        };
        let to = 1 - from;
        if let Some(op) = p.window {
            // Executes in SQ order, on the sender's side only.
            let side = &mut self.sides[from];
            match op {
                WindowOp::Bind {
                    rkey,
                    key,
                    addr,
                    len,
                } => {
                    assert!(
                        side.windows.insert(rkey, (key, addr, len)).is_none(),
                        "a window key bound twice"
                    );
                    side.windows_bound += 1;
                }
                WindowOp::Invalidate { rkey } => {
                    assert!(
                        side.windows.remove(&rkey).is_some(),
                        "invalidation of a window that is not bound"
                    );
                    side.windows_invalidated += 1;
                }
            }
            if p.signaled {
                self.completions[from].push_back(p.wr);
                if !self.delay_completions {
                    self.complete(from);
                }
            }
            return (true, None);
        }
        if let (Some((laddr, lkey, raddr, rkey)), false) = (p.read, self.sides[to].broken) {
            // The READ's response: the peer's memory must still be registered (and, through
            // a window, the window still bound, the range inside it).
            let peer = &self.sides[to];
            let src = match peer.windows.get(&rkey) {
                Some(&(key, waddr, wlen)) => {
                    assert!(
                        raddr >= waddr && raddr + u64::from(p.len) <= waddr + u64::from(wlen),
                        "READ outside its window"
                    );
                    peer.regions.get(&key)
                }
                None => {
                    assert!(
                        !peer.use_windows,
                        "READ through a window key that is not bound"
                    );
                    peer.regions.get(&rkey)
                }
            };
            let src = src.expect("READ of memory the peer released");
            let (r, l, n) = (raddr as usize, laddr as usize, p.len as usize);
            assert!(r + n <= src.len(), "READ beyond the peer's region");
            let bytes = src[r..r + n].to_vec();
            let dest = self.sides[from]
                .regions
                .get_mut(&lkey)
                .expect("READ destination released while in flight");
            dest[l..l + n].copy_from_slice(&bytes);
            self.completions[from].push_back(p.wr);
            if !self.delay_completions {
                self.complete(from);
            }
            return (true, None);
        }
        let bytes = match p.inline {
            Some(b) => b,
            None if p.read.is_some() => Vec::new(),
            // The NIC reads the slot (and lent memory) when it transmits: a slot reused or
            // lent memory released too early shows here.
            None => match p.lent {
                None => self.sides[from].conn.memory().send_slot(p.slot.unwrap())[..p.len as usize]
                    .to_vec(),
                Some(l) => {
                    let side = &self.sides[from];
                    let head = p.len as usize - l.len as usize;
                    let mut b = side.conn.memory().send_slot(p.slot.unwrap())[..head].to_vec();
                    let region = side
                        .regions
                        .get(&l.lkey)
                        .expect("lent memory released while its SEND was in flight");
                    let at = l.addr as usize;
                    b.extend_from_slice(&region[at..at + l.len as usize]);
                    b
                }
            },
        };
        if self.sides[to].broken {
            // The peer's QP is gone: the sender's retries run out. RC completes in order, so
            // the completions of earlier signalled WRs (held back by `delay_completions`)
            // come first.
            while self.complete(from) {}
            self.sides[from].sq.retain(|(w, _)| w.0 > p.wr.0);
            self.sides[from].conn.handle_send_completion(p.wr, Err(12));
            self.pump(from);
            return (true, None);
        }
        let rx = &mut self.sides[to];
        let slot = rx
            .posted
            .pop_front()
            .expect("RNR: credit bug (a SEND found no posted receive)");
        assert!(
            bytes.len() <= rx.cfg.slot_size as usize,
            "LOCAL_LENGTH: frame larger than the receive slot"
        );
        rx.conn.memory_mut().recv_slot_mut(slot)[..bytes.len()].copy_from_slice(&bytes);
        let taken = match buf {
            Some(b) => {
                rx.conn
                    .handle_recv_completion_into(slot, bytes.len() as u32, Ok(()), self.now, b)
            }
            None => {
                rx.conn
                    .handle_recv_completion(slot, bytes.len() as u32, Ok(()), self.now);
                None
            }
        };
        self.pump(to);
        if p.signaled {
            self.completions[from].push_back(p.wr);
            if !self.delay_completions {
                self.complete(from);
            }
        }
        (true, taken)
    }

    /// Delivers the oldest send completion of side `i`.
    pub fn complete(&mut self, i: usize) -> bool {
        let Some(wr) = self.completions[i].pop_front() else {
            return false;
        };
        let side = &mut self.sides[i];
        if side.broken {
            return true;
        }
        let before = side.sq.len();
        side.sq.retain(|(w, _)| w.0 > wr.0);
        assert!(
            side.sq.len() < before,
            "completion for a WR not outstanding"
        );
        side.conn.handle_send_completion(wr, Ok(()));
        self.pump(i);
        true
    }

    /// One unit of progress (alternating directions). False when idle.
    pub fn step(&mut self) -> bool {
        for k in 0..2 {
            let i = (self.turn + k) % 2;
            if !self.hold[i] && self.deliver(i) {
                self.turn = 1 - i;
                return true;
            }
        }
        (0..2).any(|i| self.complete(i))
    }

    /// Runs until idle; false if still busy after `max` steps (a livelock).
    pub fn drive(&mut self, max: usize) -> bool {
        for _ in 0..max {
            if !self.step() {
                return true;
            }
        }
        false
    }

    /// Advances virtual time and runs due timers.
    pub fn advance(&mut self, d: Duration) {
        self.now += d;
        for i in 0..2 {
            let due = self.sides[i]
                .conn
                .poll_timeout()
                .is_some_and(|t| t <= self.now);
            if due && !self.sides[i].broken {
                self.sides[i].conn.handle_timeout(self.now);
                self.pump(i);
            }
        }
    }

    /// Breaks side `i`'s QP: the driver reports it, flushes everything and reports the flush.
    pub fn break_qp(&mut self, i: usize) {
        let side = &mut self.sides[i];
        side.conn.handle_fatal(Fatal::QpError);
        while let Some(e) = side.conn.poll_event() {
            side.events.push(e);
        }
        assert!(side.conn.poll_work().is_none(), "work after a fatal error");
        side.broken = true;
        self.wire[i].clear();
        self.completions[i].clear();
        while let Some(slot) = side.posted.pop_front() {
            side.conn.handle_recv_completion(slot, 0, Err(5), self.now);
        }
        if let Some((last, _)) = side.sq.back().copied() {
            side.conn.handle_send_completion(last, Err(5));
        }
        side.sq.clear();
        // A type-2 window works only through its QP, which is gone (the driver deallocates
        // the windows before the memory goes).
        side.windows.clear();
        side.conn.handle_flushed();
        assert!(side.conn.poll_work().is_none(), "work after a fatal error");
        assert!(side.conn.is_drained(), "flushed but not drained");
    }

    /// Checks the credit invariants of both directions.
    pub fn check_credits(&self) {
        for i in 0..2 {
            let c = self.sides[i].conn.counters();
            assert!(
                c.frames_sent <= c.peer_limit,
                "side {i} spent credit it did not have"
            );
            assert!(
                c.peer_limit - c.frames_sent <= c.peer_slots,
                "side {i} holds more credit than peer slots"
            );
            assert!(c.announced <= c.grant && c.frames_received <= c.announced);
        }
    }

    /// At quiescence (nothing on the wire either way), per direction: the sender's credit plus
    /// the receiver's unannounced credit plus the slots it holds equals its receive slots.
    pub fn check_conservation(&self) {
        for from in 0..2 {
            if !self.wire[from].is_empty() || self.sides[0].failed() || self.sides[1].failed() {
                continue;
            }
            let s = self.sides[from].conn.counters();
            let r = self.sides[1 - from].conn.counters();
            let slots = u64::from(self.sides[1 - from].cfg.recv_slots);
            // Reposts a deferring receiver has not taken yet (all that may stay queued).
            let deferred = self.sides[1 - from].conn.work_queued() as u64;
            assert_eq!(
                (s.peer_limit - s.frames_sent) + (r.grant - r.announced) + r.held_slots + deferred,
                slots,
                "credit conservation from side {from}"
            );
        }
    }
}

/// Receiver-side check of what one side reads, against what the other side sent: message and
/// stream reads mixed, byte-exact, in order, no loss, no duplicates.
#[derive(Default)]
pub struct Checker {
    pub lens: Vec<usize>,
    idx: usize,
    off: usize,
}

impl Checker {
    /// Messages fully taken so far.
    pub fn done(&self) -> usize {
        self.idx
    }

    fn settle_position(&mut self, received: u64) {
        while self.idx < received as usize && self.off == self.lens[self.idx] {
            self.idx += 1;
            self.off = 0;
        }
    }

    /// Bytes from `read`; `received` is the reader's `messages_received` after the call.
    pub fn on_read(&mut self, bytes: &[u8], received: u64) {
        let mut i = 0;
        loop {
            self.settle_position(received);
            if i == bytes.len() {
                break;
            }
            assert!(self.idx < self.lens.len(), "read more bytes than were sent");
            let k = (bytes.len() - i).min(self.lens[self.idx] - self.off);
            assert!(k > 0, "read crossed into a message that has not arrived");
            let want: Vec<u8> = (self.off..self.off + k)
                .map(|o| byte_at(self.idx as u64, o))
                .collect();
            assert_eq!(
                &bytes[i..i + k],
                &want[..],
                "stream bytes of message {} at {}",
                self.idx,
                self.off
            );
            self.off += k;
            i += k;
        }
    }

    /// The unread rest of the head message: how many bytes `recv_msg*` must need.
    pub fn expected_len(&self) -> usize {
        self.lens[self.idx] - self.off
    }

    /// One `recv_msg*` result.
    pub fn on_msg(&mut self, bytes: &[u8]) {
        assert!(
            self.idx < self.lens.len(),
            "received more messages than were sent"
        );
        let want: Vec<u8> = (self.off..self.lens[self.idx])
            .map(|o| byte_at(self.idx as u64, o))
            .collect();
        assert_eq!(bytes.len(), want.len(), "length of message {}", self.idx);
        assert!(bytes == &want[..], "bytes of message {}", self.idx);
        self.idx += 1;
        self.off = 0;
    }

    /// Everything sent was taken.
    pub fn all_taken(&self) -> bool {
        self.idx == self.lens.len() && self.off == 0
    }
}
