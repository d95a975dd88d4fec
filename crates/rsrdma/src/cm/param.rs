//! Connection parameters: what [`CmId::connect`](super::CmId::connect) and
//! [`CmId::accept`](super::CmId::accept) offer the peer.

use crate::context::DeviceAttr;
use crate::error::{Error, Result};
use crate::ffi;

/// Most private data a connect request carries on IB/RoCE (the CM REQ's 92 bytes less
/// rdma_cm's 36-byte header).
pub const MAX_CONNECT_PRIVATE_DATA: usize = 56;
/// Most private data an accept carries on IB/RoCE (the CM REP).
pub const MAX_ACCEPT_PRIVATE_DATA: usize = 196;
/// Most private data a reject carries on IB/RoCE (the CM REJ).
pub const MAX_REJECT_PRIVATE_DATA: usize = 148;

/// Connection parameters of [`CmId::connect`](super::CmId::connect) and
/// [`CmId::accept`](super::CmId::accept).
///
/// ```
/// use rsrdma::cm::ConnParam;
/// let p = ConnParam::default().with_private_data(*b"hello").with_initiator_depth(1);
/// assert_eq!(p.private_data, b"hello");
/// assert_eq!(p.initiator_depth, Some(1));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConnParam {
    /// Bytes for the peer (at most [`MAX_CONNECT_PRIVATE_DATA`] / [`MAX_ACCEPT_PRIVATE_DATA`]).
    /// On IB and RoCE the CM carries them in fixed-size fields, so the peer receives them
    /// zero-padded to that size: put a length in the data if the receiver needs it.
    pub private_data: Vec<u8>,
    /// Incoming RDMA reads/atomics served. `None`: on connect, the device's maximum; on
    /// accept, librdmacm's rule: the requester's initiator depth, capped at the device's
    /// maximum (see [`ConnectRequest`](super::ConnectRequest)).
    pub responder_resources: Option<u8>,
    /// Outgoing RDMA reads/atomics in flight. `None`: on connect, the device's maximum; on
    /// accept, the requester's responder resources, capped at the device's maximum.
    pub initiator_depth: Option<u8>,
    /// Transport retries, 0..=7.
    pub retry_count: u8,
    /// RNR retries, 0..=7 (7: forever).
    pub rnr_retry_count: u8,
}

impl Default for ConnParam {
    fn default() -> Self {
        ConnParam {
            private_data: Vec::new(),
            responder_resources: None,
            initiator_depth: None,
            retry_count: 7,
            rnr_retry_count: 7,
        }
    }
}

impl ConnParam {
    /// Sets [`ConnParam::private_data`].
    pub fn with_private_data(mut self, data: impl Into<Vec<u8>>) -> Self {
        self.private_data = data.into();
        self
    }

    /// Sets [`ConnParam::responder_resources`].
    pub fn with_responder_resources(mut self, n: u8) -> Self {
        self.responder_resources = Some(n);
        self
    }

    /// Sets [`ConnParam::initiator_depth`].
    pub fn with_initiator_depth(mut self, n: u8) -> Self {
        self.initiator_depth = Some(n);
        self
    }

    /// Sets [`ConnParam::retry_count`].
    pub fn with_retry_count(mut self, n: u8) -> Self {
        self.retry_count = n;
        self
    }

    /// Sets [`ConnParam::rnr_retry_count`].
    pub fn with_rnr_retry_count(mut self, n: u8) -> Self {
        self.rnr_retry_count = n;
        self
    }

    /// The C form, checked against `max_private` and the device; depths left `None` take
    /// `defaults`. The result points into `self.private_data`.
    pub(super) fn to_raw(
        &self,
        max_private: usize,
        dev: &DeviceAttr,
        defaults: Depths,
    ) -> Result<ffi::rdma_conn_param> {
        if self.private_data.len() > max_private {
            return Err(Error::Limit {
                what: "private data bytes",
                requested: self.private_data.len() as u64,
                limit: max_private as u64,
                source_of_limit: "the IB CM message",
            });
        }
        for (what, v) in [
            ("retry_count", self.retry_count),
            ("rnr_retry_count", self.rnr_retry_count),
        ] {
            if v > 7 {
                return Err(Error::Limit {
                    what,
                    requested: v.into(),
                    limit: 7,
                    source_of_limit: "the 3-bit retry field",
                });
            }
        }
        let responder = self
            .responder_resources
            .unwrap_or(defaults.responder_resources);
        let initiator = self.initiator_depth.unwrap_or(defaults.initiator_depth);
        check_depth(
            "responder_resources",
            responder,
            dev.max_qp_rd_atom,
            "device max_qp_rd_atom",
        )?;
        check_depth(
            "initiator_depth",
            initiator,
            dev.max_qp_init_rd_atom,
            "device max_qp_init_rd_atom",
        )?;
        Ok(ffi::rdma_conn_param {
            private_data: self.private_data.as_ptr().cast(),
            private_data_len: self.private_data.len() as u8,
            responder_resources: responder,
            initiator_depth: initiator,
            retry_count: self.retry_count,
            rnr_retry_count: self.rnr_retry_count,
            ..Default::default()
        })
    }
}

fn check_depth(what: &'static str, v: u8, limit: u32, source: &'static str) -> Result<()> {
    if u32::from(v) > limit {
        return Err(Error::Limit {
            what,
            requested: v.into(),
            limit: limit.into(),
            source_of_limit: source,
        });
    }
    Ok(())
}

/// RDMA read/atomic depths of one side of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Depths {
    /// Incoming reads/atomics served.
    pub(super) responder_resources: u8,
    /// Outgoing reads/atomics in flight.
    pub(super) initiator_depth: u8,
}

fn clamp(v: u32) -> u8 {
    v.min(u8::MAX.into()) as u8
}

impl Depths {
    /// The device's maximum: what a connecting side offers by default.
    pub(super) fn device_max(dev: &DeviceAttr) -> Depths {
        Depths {
            responder_resources: clamp(dev.max_qp_rd_atom),
            initiator_depth: clamp(dev.max_qp_init_rd_atom),
        }
    }

    /// librdmacm's rule for an acceptor (`rdma_accept` with `RDMA_MAX_RESP_RES` /
    /// `RDMA_MAX_INIT_DEPTH`): serve as many reads as the requester will issue, issue as many
    /// as it serves, each capped at what this device can do.
    pub(super) fn accepting(
        requester: Depths,
        max_qp_rd_atom: u32,
        max_qp_init_rd_atom: u32,
    ) -> Depths {
        Depths {
            responder_resources: requester.initiator_depth.min(clamp(max_qp_rd_atom)),
            initiator_depth: requester
                .responder_resources
                .min(clamp(max_qp_init_rd_atom)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(rd_atom: u32, init_rd_atom: u32) -> DeviceAttr {
        DeviceAttr {
            max_qp_rd_atom: rd_atom,
            max_qp_init_rd_atom: init_rd_atom,
            ..Default::default()
        }
    }

    #[test]
    fn acceptor_offers_the_smaller_of_the_request_and_the_device() {
        let asked = Depths {
            responder_resources: 16,
            initiator_depth: 1,
        };
        // Serves the one read the requester issues; issues at most the device's 8.
        assert_eq!(
            Depths::accepting(asked, 128, 8),
            Depths {
                responder_resources: 1,
                initiator_depth: 8
            }
        );
        // A small device caps both.
        let asked = Depths {
            responder_resources: 200,
            initiator_depth: 200,
        };
        assert_eq!(
            Depths::accepting(asked, 4, 2),
            Depths {
                responder_resources: 4,
                initiator_depth: 2
            }
        );
        // Device maxima beyond a byte saturate, as the CM's 8-bit fields do.
        assert_eq!(Depths::accepting(asked, 1000, 1000), asked);
        let zero = Depths {
            responder_resources: 0,
            initiator_depth: 0,
        };
        assert_eq!(Depths::accepting(zero, 16, 16), zero);
    }

    #[test]
    fn defaults_and_limits_are_checked() {
        let d = dev(16, 8);
        let raw = ConnParam::default()
            .to_raw(MAX_CONNECT_PRIVATE_DATA, &d, Depths::device_max(&d))
            .unwrap();
        assert_eq!((raw.responder_resources, raw.initiator_depth), (16, 8));
        assert_eq!((raw.retry_count, raw.rnr_retry_count), (7, 7));
        let p = ConnParam::default()
            .with_initiator_depth(9)
            .with_private_data(*b"x");
        let e = p
            .to_raw(MAX_CONNECT_PRIVATE_DATA, &d, Depths::device_max(&d))
            .unwrap_err();
        assert!(
            matches!(
                e,
                Error::Limit {
                    what: "initiator_depth",
                    requested: 9,
                    limit: 8,
                    ..
                }
            ),
            "{e}"
        );
        let e = ConnParam::default()
            .with_private_data(vec![0; 57])
            .to_raw(MAX_CONNECT_PRIVATE_DATA, &d, Depths::device_max(&d))
            .unwrap_err();
        assert!(matches!(e, Error::Limit { limit: 56, .. }), "{e}");
        let e = ConnParam::default()
            .with_rnr_retry_count(8)
            .to_raw(MAX_ACCEPT_PRIVATE_DATA, &d, Depths::device_max(&d))
            .unwrap_err();
        assert!(
            matches!(
                e,
                Error::Limit {
                    what: "rnr_retry_count",
                    ..
                }
            ),
            "{e}"
        );
        let raw = ConnParam::default()
            .with_private_data(*b"ok")
            .with_retry_count(3)
            .with_responder_resources(2)
            .to_raw(MAX_ACCEPT_PRIVATE_DATA, &d, Depths::device_max(&d))
            .unwrap();
        assert_eq!(
            (
                raw.private_data_len,
                raw.retry_count,
                raw.responder_resources
            ),
            (2, 3, 2)
        );
    }
}
