//! One unreliable-datagram queue pair: SENDs (with immediate data) to any UD queue pair that
//! accepts its Q_Key, with no acknowledgement and no retry; what cannot be delivered is
//! dropped, as on a real fabric.
//!
//! rxe's rules, which this follows: a send completes once its datagram is handed to the
//! wire; a datagram longer than the path MTU is "sent" (the send succeeds) and dropped; at
//! the receiver a wrong Q_Key, no posted receive, or a receive too short drops the datagram
//! without a completion (class D), except that a receive too short taken from an SRQ
//! completes with `REM_INV_REQ_ERR` (class E). Every receive gets the 40-byte GRH in front of
//! the payload and counts it in its length.

use crate::memory::Memory;
use crate::mr::MrTable;
use crate::qp::{
    admit_recv, gather_payload, scatter, PostError, QpConfig, QpEvent, QpState, RecvAdmission,
};
use crate::srq::Srq;
use crate::wire::{Packet, PacketKind};
use crate::wr::{Completion, RecvWr, SendOp, SendWr, Status, WcOpcode};
use std::collections::VecDeque;

/// Bytes of the GRH in front of every UD receive.
pub const GRH_LEN: usize = 40;

/// Where a UD send goes: the destination's device (its LID and GID, opaque to the core: the
/// device routes by them), its QP number and the Q_Key the datagram carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdDest {
    /// The LID of the destination's device.
    pub lid: u16,
    /// The destination port's GID (with the LID, it names a device on another host).
    pub gid: [u8; 16],
    /// The destination QP.
    pub qpn: u32,
    /// The Q_Key the datagram carries.
    pub qkey: u32,
}

/// Where a datagram came from, as the receiving device knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdSource {
    /// The sending device's LID.
    pub lid: u16,
    /// The sending port's GID (the GRH's source).
    pub gid: [u8; 16],
}

/// An unreliable-datagram queue pair.
#[derive(Debug)]
pub struct UdQp {
    cfg: QpConfig,
    state: QpState,
    qkey: u32,
    /// The largest payload a datagram carries (the path MTU).
    mtu: u32,
    rq: VecDeque<RecvWr>,
    out: VecDeque<(UdDest, Packet)>,
    cq: VecDeque<Completion>,
    events: VecDeque<QpEvent>,
    /// Datagrams dropped at this QP (wrong Q_Key, no receive, too long).
    dropped: u64,
}

impl UdQp {
    /// A UD queue pair in RESET whose datagrams carry at most `mtu` bytes.
    pub fn new(cfg: QpConfig, mtu: u32) -> UdQp {
        UdQp {
            cfg,
            state: QpState::Reset,
            qkey: 0,
            mtu,
            rq: VecDeque::new(),
            out: VecDeque::new(),
            cq: VecDeque::new(),
            events: VecDeque::new(),
            dropped: 0,
        }
    }

    /// Its number.
    pub fn qp_num(&self) -> u32 {
        self.cfg.qp_num
    }

    /// Its state.
    pub fn state(&self) -> QpState {
        self.state
    }

    /// Its settings.
    pub fn config(&self) -> &QpConfig {
        &self.cfg
    }

    /// Changes its settings.
    pub fn set_config(&mut self, f: impl FnOnce(&mut QpConfig)) {
        f(&mut self.cfg);
    }

    /// The Q_Key it accepts.
    pub fn qkey(&self) -> u32 {
        self.qkey
    }

    /// Sets the Q_Key it accepts (`ibv_modify_qp` with `IBV_QP_QKEY`).
    pub fn set_qkey(&mut self, qkey: u32) {
        self.qkey = qkey;
    }

    /// Datagrams dropped at this QP so far.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Any state → RESET: forgets everything queued, without completions.
    pub fn reset(&mut self) {
        *self = UdQp {
            qkey: self.qkey,
            ..UdQp::new(self.cfg, self.mtu)
        };
    }

    /// RESET → INIT.
    ///
    /// # Errors
    /// [`PostError::State`] from any other state.
    pub fn to_init(&mut self) -> Result<(), PostError> {
        self.transition(QpState::Reset, QpState::Init)
    }

    /// INIT → RTR.
    ///
    /// # Errors
    /// [`PostError::State`] from any other state.
    pub fn to_rtr(&mut self) -> Result<(), PostError> {
        self.transition(QpState::Init, QpState::Rtr)
    }

    /// RTR → RTS.
    ///
    /// # Errors
    /// [`PostError::State`] from any other state.
    pub fn to_rts(&mut self) -> Result<(), PostError> {
        self.transition(QpState::Rtr, QpState::Rts)
    }

    fn transition(&mut self, from: QpState, to: QpState) -> Result<(), PostError> {
        if self.state != from {
            return Err(PostError::State(self.state));
        }
        self.state = to;
        Ok(())
    }

    /// Any state → ERROR: queued receives complete with `WR_FLUSH_ERR` (sends completed
    /// when they were posted); nothing more is sent or received.
    pub fn to_error(&mut self) {
        if self.state != QpState::Error && self.cfg.uses_srq {
            self.events.push_back(QpEvent::LastWqeReached);
        }
        self.state = QpState::Error;
        self.out.clear();
        while let Some(r) = self.rq.pop_front() {
            self.push(r.wr_id, Status::WrFlushErr, WcOpcode::Recv, 0, None, None);
        }
    }

    /// Queues a receive.
    ///
    /// # Errors
    /// [`PostError::State`] in RESET; [`PostError::Full`]; [`PostError::Invalid`] on a QP
    /// that receives from an SRQ.
    pub fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostError> {
        match admit_recv(&self.cfg, self.state, self.rq.len())? {
            RecvAdmission::Queue => self.rq.push_back(wr),
            RecvAdmission::Flush => {
                self.push(wr.wr_id, Status::WrFlushErr, WcOpcode::Recv, 0, None, None);
            }
        }
        Ok(())
    }

    /// Sends a datagram to `dest`: it completes now (signalled, or on error), as the wire
    /// takes it. A bad local key completes it with `LOC_PROT_ERR` and fails the QP.
    ///
    /// # Errors
    /// [`PostError::State`] before RTS; [`PostError::Invalid`] for anything but a SEND, or
    /// inline data over the QP's limit.
    pub fn post_send(
        &mut self,
        wr: SendWr,
        dest: UdDest,
        mrs: &MrTable,
        mem: &dyn Memory,
    ) -> Result<(), PostError> {
        match self.state {
            QpState::Rts => {}
            QpState::Error => {
                self.push(wr.wr_id, Status::WrFlushErr, WcOpcode::Send, 0, None, None);
                return Ok(());
            }
            s => return Err(PostError::State(s)),
        }
        let SendOp::Send { imm } = wr.op else {
            return Err(PostError::Invalid("a UD queue pair only sends"));
        };
        if let Some(data) = &wr.inline {
            if data.len() > self.cfg.max_inline as usize {
                return Err(PostError::Invalid("inline data over the QP's max_inline"));
            }
        }
        let local_ok = wr.inline.is_some()
            || wr
                .sges
                .iter()
                .all(|s| mrs.check_local(self.cfg.pd, s, false).is_ok());
        if !local_ok {
            self.push(wr.wr_id, Status::LocProtErr, WcOpcode::Send, 0, None, None);
            self.to_error();
            return Ok(());
        }
        let len = wr
            .inline
            .as_ref()
            .map_or_else(|| wr.sge_len(), |d| d.len() as u64);
        // Longer than the path MTU: "sent" and lost, as rxe does.
        if len <= u64::from(self.mtu) {
            let payload = match wr.inline {
                Some(d) => d,
                None => gather_payload(&wr.sges, mem),
            };
            let packet = Packet {
                ack: None,
                solicited: wr.solicited,
                dest_qpn: dest.qpn,
                psn: 0,
                kind: PacketKind::Datagram {
                    src_qpn: self.cfg.qp_num,
                    qkey: dest.qkey,
                    imm,
                },
                payload,
            };
            self.out.push_back((dest, packet));
        }
        if wr.signaled || self.cfg.sq_sig_all {
            self.push(wr.wr_id, Status::Success, WcOpcode::Send, 0, None, None);
        }
        Ok(())
    }

    /// The next datagram to send, with its destination.
    pub fn poll_transmit(&mut self) -> Option<(UdDest, Packet)> {
        self.out.pop_front()
    }

    /// The next completion.
    pub fn poll_completion(&mut self) -> Option<Completion> {
        self.cq.pop_front()
    }

    /// The next asynchronous event.
    pub fn poll_event(&mut self) -> Option<QpEvent> {
        self.events.pop_front()
    }

    /// Whether it has completions or events to give ([`UdQp::poll_completion`],
    /// [`UdQp::poll_event`]): a device that serves many queue pairs asks before it asks
    /// for them.
    #[inline]
    pub fn has_output(&self) -> bool {
        !self.cq.is_empty() || !self.events.is_empty()
    }

    /// A datagram for this QP from `from`, whose port's GID is `to_gid` here: delivered into
    /// the oldest receive behind a GRH, or dropped. `srq`: the shared receive queue of a QP
    /// that uses one.
    pub fn handle_datagram(
        &mut self,
        p: Packet,
        from: UdSource,
        to_gid: [u8; 16],
        mrs: &MrTable,
        mem: &mut dyn Memory,
        srq: Option<&mut Srq>,
    ) {
        let PacketKind::Datagram { src_qpn, qkey, imm } = p.kind else {
            return;
        };
        if !matches!(self.state, QpState::Rtr | QpState::Rts) || qkey != self.qkey {
            self.dropped += 1;
            return;
        }
        let from_srq = srq.is_some();
        let front = match &srq {
            Some(s) => s.front(),
            None => self.rq.front(),
        };
        let Some(front) = front else {
            self.dropped += 1;
            return;
        };
        let room: u64 = front.sges.iter().map(|s| u64::from(s.len)).sum();
        let len = GRH_LEN + p.payload.len();
        if (len as u64) > room && !from_srq {
            // Class D: dropped, the receive stays.
            self.dropped += 1;
            return;
        }
        let r = match srq {
            Some(s) => s.take(),
            None => self.rq.pop_front(),
        };
        let Some(r) = r else {
            return;
        };
        let source = Some((src_qpn, from.lid));
        if (len as u64) > room {
            // Class E (an SRQ's receive): it completes with the error.
            self.dropped += 1;
            self.push(
                r.wr_id,
                Status::RemInvReqErr,
                WcOpcode::Recv,
                0,
                None,
                source,
            );
            return;
        }
        if !r
            .sges
            .iter()
            .all(|s| mrs.check_local(self.cfg.pd, s, true).is_ok())
        {
            self.push(r.wr_id, Status::LocProtErr, WcOpcode::Recv, 0, None, source);
            self.to_error();
            return;
        }
        let mut data = Vec::with_capacity(len);
        data.extend_from_slice(&grh(from.gid, to_gid, p.payload.len()));
        data.extend_from_slice(&p.payload);
        scatter(&r.sges, &data, mem);
        self.push(
            r.wr_id,
            Status::Success,
            WcOpcode::Recv,
            len as u32,
            imm,
            source,
        );
        if p.solicited {
            if let Some(c) = self.cq.back_mut() {
                c.solicited = true;
            }
        }
    }

    /// A completion; `source` (QP, LID) marks a UD receive, which carries a GRH.
    fn push(
        &mut self,
        wr_id: u64,
        status: Status,
        opcode: WcOpcode,
        byte_len: u32,
        imm: Option<u32>,
        source: Option<(u32, u16)>,
    ) {
        let (src_qp, slid) = source.unwrap_or((0, 0));
        self.cq.push_back(Completion {
            wr_id,
            status,
            opcode,
            byte_len,
            imm,
            invalidated_rkey: None,
            qp_num: self.cfg.qp_num,
            src_qp,
            slid,
            grh: source.is_some() && status == Status::Success,
            // Marked after a solicited datagram landed ([`UdQp::handle_datagram`]); a
            // failed receive wakes a solicited-only arm, as rxe's do.
            solicited: status != Status::Success,
        });
    }
}

/// The GRH a UD receive starts with: an IPv6-form header (version 6, payload length, next
/// header 0x1b for the InfiniBand transport, hop limit 64) naming both GIDs, as InfiniBand
/// and RoCE over IPv6 deliver it (RoCE v2 over IPv4 NICs write an IPv4 header in the last 20
/// bytes instead; readers such as libibverbs' `ibv_init_ah_from_wc` take both).
pub fn grh(sgid: [u8; 16], dgid: [u8; 16], payload_len: usize) -> [u8; GRH_LEN] {
    let mut g = [0u8; GRH_LEN];
    g[0] = 0x60;
    g[4..6].copy_from_slice(&(payload_len.min(0xffff) as u16).to_be_bytes());
    g[6] = 0x1b;
    g[7] = 64;
    g[8..24].copy_from_slice(&sgid);
    g[24..40].copy_from_slice(&dgid);
    g
}
