//! Work completions: what the NIC reports when a work request finishes.

use crate::error::{Error, Result};
use crate::ffi;
use std::fmt;

/// A work completion's status (`ibv_wc_status`). A newtype over the integer, so a value this
/// version does not know is still representable (and printed by number).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct WcStatus(pub u32);

macro_rules! wc_statuses {
    ($($name:ident = $v:expr, $c:literal, $text:literal;)*) => {
        impl WcStatus {
            $(
                #[doc = $text]
                pub const $name: WcStatus = WcStatus($v);
            )*

            /// The C name (`IBV_WC_REM_ACCESS_ERR`), or `None` for an unknown value.
            pub fn name(self) -> Option<&'static str> {
                match self.0 { $($v => Some($c),)* _ => None }
            }

            /// A short description, as `ibv_wc_status_str` gives.
            pub fn description(self) -> &'static str {
                match self.0 { $($v => $text,)* _ => "unknown status" }
            }
        }
    };
}

wc_statuses! {
    SUCCESS = 0, "IBV_WC_SUCCESS", "success";
    LOC_LEN_ERR = 1, "IBV_WC_LOC_LEN_ERR", "local length error";
    LOC_QP_OP_ERR = 2, "IBV_WC_LOC_QP_OP_ERR", "local QP operation error";
    LOC_EEC_OP_ERR = 3, "IBV_WC_LOC_EEC_OP_ERR", "local EE context operation error";
    LOC_PROT_ERR = 4, "IBV_WC_LOC_PROT_ERR", "local protection error";
    WR_FLUSH_ERR = 5, "IBV_WC_WR_FLUSH_ERR", "Work Request Flushed Error";
    MW_BIND_ERR = 6, "IBV_WC_MW_BIND_ERR", "memory management operation error";
    BAD_RESP_ERR = 7, "IBV_WC_BAD_RESP_ERR", "bad response error";
    LOC_ACCESS_ERR = 8, "IBV_WC_LOC_ACCESS_ERR", "local access error";
    REM_INV_REQ_ERR = 9, "IBV_WC_REM_INV_REQ_ERR", "remote invalid request error";
    REM_ACCESS_ERR = 10, "IBV_WC_REM_ACCESS_ERR", "remote access error";
    REM_OP_ERR = 11, "IBV_WC_REM_OP_ERR", "remote operation error";
    RETRY_EXC_ERR = 12, "IBV_WC_RETRY_EXC_ERR", "transport retry counter exceeded";
    RNR_RETRY_EXC_ERR = 13, "IBV_WC_RNR_RETRY_EXC_ERR", "RNR retry counter exceeded";
    LOC_RDD_VIOL_ERR = 14, "IBV_WC_LOC_RDD_VIOL_ERR", "local RDD violation error";
    REM_INV_RD_REQ_ERR = 15, "IBV_WC_REM_INV_RD_REQ_ERR", "remote invalid RD request";
    REM_ABORT_ERR = 16, "IBV_WC_REM_ABORT_ERR", "aborted error";
    INV_EECN_ERR = 17, "IBV_WC_INV_EECN_ERR", "invalid EE context number";
    INV_EEC_STATE_ERR = 18, "IBV_WC_INV_EEC_STATE_ERR", "invalid EE context state";
    FATAL_ERR = 19, "IBV_WC_FATAL_ERR", "fatal error";
    RESP_TIMEOUT_ERR = 20, "IBV_WC_RESP_TIMEOUT_ERR", "response timeout error";
    GENERAL_ERR = 21, "IBV_WC_GENERAL_ERR", "general error";
    TM_ERR = 22, "IBV_WC_TM_ERR", "TM error";
    TM_RNDV_INCOMPLETE = 23, "IBV_WC_TM_RNDV_INCOMPLETE", "TM software rendezvous";
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => write!(f, "{} ({name}, {})", self.description(), self.0),
            None => write!(f, "unknown status {}", self.0),
        }
    }
}

impl fmt::Debug for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "WcStatus({})", self.0),
        }
    }
}

/// A work completion's opcode (`ibv_wc_opcode`): which kind of work request finished.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct WcOpcode(pub u32);

macro_rules! wc_opcodes {
    ($($name:ident = $v:expr, $c:literal;)*) => {
        impl WcOpcode {
            $(
                #[doc = $c]
                pub const $name: WcOpcode = WcOpcode($v);
            )*

            /// The C name (`IBV_WC_RECV`), or `None` for an unknown value.
            pub fn name(self) -> Option<&'static str> {
                match self.0 { $($v => Some($c),)* _ => None }
            }
        }
    };
}

wc_opcodes! {
    SEND = 0, "IBV_WC_SEND";
    RDMA_WRITE = 1, "IBV_WC_RDMA_WRITE";
    RDMA_READ = 2, "IBV_WC_RDMA_READ";
    COMP_SWAP = 3, "IBV_WC_COMP_SWAP";
    FETCH_ADD = 4, "IBV_WC_FETCH_ADD";
    BIND_MW = 5, "IBV_WC_BIND_MW";
    LOCAL_INV = 6, "IBV_WC_LOCAL_INV";
    TSO = 7, "IBV_WC_TSO";
    ATOMIC_WRITE = 9, "IBV_WC_ATOMIC_WRITE";
    RECV = 128, "IBV_WC_RECV";
    RECV_RDMA_WITH_IMM = 129, "IBV_WC_RECV_RDMA_WITH_IMM";
}

impl WcOpcode {
    /// True for completions of the receive queue (`IBV_WC_RECV*`).
    pub fn is_recv(self) -> bool {
        self.0 & ffi::ibv_wc_opcode::IBV_WC_RECV.0 != 0
    }
}

impl fmt::Display for WcOpcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "opcode {}", self.0),
        }
    }
}

impl fmt::Debug for WcOpcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// One work completion, laid out exactly as `struct ibv_wc` so that [`crate::Cq::poll`] fills
/// a caller's slice of them directly, without copying or allocating.
#[derive(Clone, Copy, Default)]
#[repr(transparent)]
pub struct Wc(ffi::ibv_wc);

impl Wc {
    /// The id the work request was posted with.
    pub fn wr_id(&self) -> u64 {
        self.0.wr_id
    }

    /// Whether it succeeded, and if not why.
    pub fn status(&self) -> WcStatus {
        WcStatus(self.0.status.0)
    }

    /// True on success.
    pub fn is_ok(&self) -> bool {
        self.0.status.0 == 0
    }

    /// The completion as a `Result`: the error names the status, the WR id and the vendor code.
    ///
    /// # Errors
    /// [`Error::WorkCompletion`] when the status is not success.
    pub fn ok(&self) -> Result<&Wc> {
        if self.is_ok() {
            Ok(self)
        } else {
            Err(Error::WorkCompletion {
                status: self.status(),
                wr_id: self.wr_id(),
                opcode: self.opcode(),
                vendor_err: self.vendor_err(),
            })
        }
    }

    /// Which kind of work request finished. Only valid on success (the verbs leave it
    /// undefined for errors).
    pub fn opcode(&self) -> WcOpcode {
        WcOpcode(self.0.opcode.0)
    }

    /// Bytes received (receive completions), or transferred by an RDMA read or atomic.
    pub fn byte_len(&self) -> u32 {
        self.0.byte_len
    }

    /// The immediate data, in host order, if the sender attached any.
    pub fn imm_data(&self) -> Option<u32> {
        if self.0.wc_flags & ffi::ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0 {
            // SAFETY: with IBV_WC_WITH_IMM set, the union holds immediate data (plain u32).
            Some(u32::from_be(unsafe { self.0.__bindgen_anon_1.imm_data }))
        } else {
            None
        }
    }

    /// True when a 40-byte GRH precedes the payload in the receive buffer (UD).
    pub fn has_grh(&self) -> bool {
        self.0.wc_flags & ffi::ibv_wc_flags::IBV_WC_GRH.0 != 0
    }

    /// The local QP the completion belongs to.
    pub fn qp_num(&self) -> u32 {
        self.0.qp_num
    }

    /// The sending QP (UD receives).
    pub fn src_qp(&self) -> u32 {
        self.0.src_qp
    }

    /// The sender's LID (UD receives on InfiniBand).
    pub fn slid(&self) -> u16 {
        self.0.slid
    }

    /// The provider's own error code.
    pub fn vendor_err(&self) -> u32 {
        self.0.vendor_err
    }

    /// The raw `ibv_wc`.
    pub fn as_raw(&self) -> &ffi::ibv_wc {
        &self.0
    }
}

impl fmt::Debug for Wc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Wc");
        d.field("wr_id", &self.wr_id())
            .field("status", &self.status());
        if self.is_ok() {
            d.field("opcode", &self.opcode())
                .field("byte_len", &self.byte_len());
            if let Some(imm) = self.imm_data() {
                d.field("imm_data", &imm);
            }
        } else {
            d.field("vendor_err", &self.vendor_err());
        }
        d.field("qp_num", &self.qp_num()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_is_named() {
        for v in 0..=23 {
            let s = WcStatus(v);
            assert!(s.name().is_some(), "status {v} has no name");
            assert!(s.to_string().contains(&v.to_string()));
        }
        assert_eq!(WcStatus(99).name(), None);
        assert_eq!(WcStatus(99).to_string(), "unknown status 99");
        assert_eq!(
            WcStatus::REM_ACCESS_ERR.to_string(),
            "remote access error (IBV_WC_REM_ACCESS_ERR, 10)"
        );
    }

    #[test]
    fn statuses_match_the_headers() {
        assert_eq!(
            WcStatus::WR_FLUSH_ERR.0,
            ffi::ibv_wc_status::IBV_WC_WR_FLUSH_ERR.0
        );
        assert_eq!(
            WcStatus::TM_RNDV_INCOMPLETE.0,
            ffi::ibv_wc_status::IBV_WC_TM_RNDV_INCOMPLETE.0
        );
        assert_eq!(
            WcOpcode::RECV_RDMA_WITH_IMM.0,
            ffi::ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM.0
        );
        assert_eq!(
            WcOpcode::ATOMIC_WRITE.0,
            ffi::ibv_wc_opcode::IBV_WC_ATOMIC_WRITE.0
        );
    }

    #[test]
    fn failed_completion_becomes_an_error_naming_status_wr_id_and_vendor_code() {
        let raw = ffi::ibv_wc {
            wr_id: 42,
            status: ffi::ibv_wc_status::IBV_WC_REM_ACCESS_ERR,
            vendor_err: 0x88,
            ..Default::default()
        };
        let wc = Wc(raw);
        let text = wc.ok().unwrap_err().to_string();
        assert!(
            text.contains("42") && text.contains("IBV_WC_REM_ACCESS_ERR") && text.contains("0x88"),
            "{text}"
        );
    }

    #[test]
    fn immediate_data_only_when_flagged_and_in_host_order() {
        let mut raw = ffi::ibv_wc::default();
        raw.__bindgen_anon_1.imm_data = 0x1234_5678u32.to_be();
        assert_eq!(Wc(raw).imm_data(), None);
        raw.wc_flags = ffi::ibv_wc_flags::IBV_WC_WITH_IMM.0;
        assert_eq!(Wc(raw).imm_data(), Some(0x1234_5678));
        assert!(WcOpcode::RECV.is_recv() && !WcOpcode::SEND.is_recv());
    }
}
