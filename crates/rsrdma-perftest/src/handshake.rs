//! The DEST handshakes (spec 1.4): the endpoint exchange of the setup phase, in each tool's
//! order, and the sync handshakes of the test phase.

use crate::error::{Error, Result};
use crate::oob::{Oob, Wait};
use crate::out::Out;
use crate::report;
use crate::wire::{self, Dest};
use crate::{Kind, Tool, Verb};

/// The DEST handshakes of a run: this side's endpoints and what the peer sent.
pub struct Handshake<'a> {
    my: &'a [Dest],
    with_gid: bool,
    /// The peer's endpoints, from the first round.
    pub remote: Vec<Dest>,
}

/// The connection to the peer during the test phase.
pub struct Ends<'a> {
    /// The TCP channel.
    pub oob: &'a mut Oob,
    /// The peer's endpoints.
    pub remote: &'a [Dest],
    /// The handshakes.
    pub hs: Handshake<'a>,
}

impl<'a> Handshake<'a> {
    /// Handshakes that send `my` (with their GIDs when `with_gid`).
    pub fn new(my: &'a [Dest], with_gid: bool) -> Handshake<'a> {
        Handshake {
            my,
            with_gid,
            remote: Vec::new(),
        }
    }

    fn exchange(&self, oob: &mut Oob, i: usize, wait: Wait) -> Result<Dest> {
        if oob.is_rdma_cm() {
            return exchange_cm(oob, &self.my[i], wait);
        }
        let len = if self.with_gid {
            wire::DEST_LEN_GID
        } else {
            wire::DEST_LEN_NO_GID
        };
        let mut b = vec![0u8; len];
        oob.exchange(
            "remote address",
            &self.my[i].encode(self.with_gid),
            &mut b,
            wait,
        )?;
        Dest::parse(&b, self.with_gid)
    }

    /// One round over QPs `0..n`; the first round records the peer's endpoints, later ones
    /// check that the peer is in step (a different `-q` or test shows up here).
    fn round(&mut self, oob: &mut Oob, n: usize, first: bool) -> Result<()> {
        for i in 0..n {
            let d = self.exchange(oob, i, Wait::Prompt)?;
            if first {
                if self.remote.iter().any(|r| r.qpn == d.qpn) {
                    return Err(out_of_step());
                }
                self.remote.push(d);
            } else if self.remote.get(i) != Some(&d) {
                return Err(out_of_step());
            }
        }
        Ok(())
    }

    /// A sync handshake with QP 0's endpoint.
    pub fn one(&mut self, oob: &mut Oob, wait: Wait) -> Result<()> {
        let d = self.exchange(oob, 0, wait)?;
        if self.remote.first() != Some(&d) {
            return Err(out_of_step());
        }
        Ok(())
    }

    /// The setup phase's exchanges in `tool`'s order: the first round gives the peer's
    /// endpoints, `connect` brings the QPs up to them, and the address lines are printed where
    /// perftest prints them.
    ///
    /// # Errors
    /// A failed exchange, a peer out of step, or what `connect` returns.
    pub fn setup(
        &mut self,
        tool: Tool,
        oob: &mut Oob,
        o: &mut Out<'_>,
        connect: impl FnOnce(&[Dest]) -> Result<()>,
    ) -> Result<()> {
        let q = self.my.len();
        // Over rdma_cm perftest prints the address lines of its exchange QP's verb (SEND):
        // LID, QPN and PSN only.
        let shown = if oob.is_rdma_cm() {
            Verb::Send
        } else {
            tool.verb
        };
        match (tool.verb, tool.kind) {
            (Verb::Write | Verb::Read | Verb::Atomic, Kind::Bw) => {
                self.round(oob, q, true)?;
                connect(&self.remote)?;
                self.local_lines(o, shown);
                self.round(oob, q, false)?;
                self.remote_lines(o, shown);
                self.one(oob, Wait::Prompt)?;
            }
            (Verb::Send, Kind::Bw) => {
                self.round(oob, q, true)?;
                connect(&self.remote)?;
                self.one(oob, Wait::Prompt)?;
                self.local_lines(o, shown);
                self.round(oob, q, false)?;
                self.remote_lines(o, shown);
            }
            (_, Kind::Lat) => {
                self.round(oob, 1, true)?;
                connect(&self.remote)?;
                self.local_lines(o, shown);
                self.one(oob, Wait::Prompt)?;
                self.one(oob, Wait::Prompt)?;
                if tool.verb != Verb::Send {
                    self.one(oob, Wait::Prompt)?;
                }
                self.remote_lines(o, shown);
            }
        }
        Ok(())
    }

    fn local_lines(&self, o: &mut Out<'_>, verb: Verb) {
        for d in self.my {
            o.text(&report::address_line(true, d, verb, self.with_gid));
        }
    }

    fn remote_lines(&self, o: &mut Out<'_>, verb: Verb) {
        for d in &self.remote {
            o.text(&report::address_line(false, d, verb, self.with_gid));
        }
    }
}

/// One DEST exchange in rdma_cm's binary form.
fn exchange_cm(oob: &mut Oob, my: &Dest, wait: Wait) -> Result<Dest> {
    let mut b = [0u8; wire::DEST_LEN_CM];
    oob.exchange("remote address", &my.encode_cm(), &mut b, wait)?;
    Dest::parse_cm(&b)
}

/// The exchange of empty endpoints perftest makes before and after connecting its QPs with
/// rdma_cm (`-R`): a sync point only, what arrives is not used.
///
/// # Errors
/// A failed exchange.
pub fn empty_sync(oob: &mut Oob, wait: Wait) -> Result<()> {
    exchange_cm(oob, &Dest::default(), wait).map(drop)
}

fn out_of_step() -> Error {
    Error::Protocol(
        " The peer's handshake is out of step with this side's: the two ends were probably started with a different -q (number of QPs), a different test (send/write/read, bw/lat) or -a/-b on one side only".into(),
    )
}
