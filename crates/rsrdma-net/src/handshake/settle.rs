//! Settling on what both sides can do: the minimum of each capability, and equality of the
//! options that must match.

use super::codec::Endpoint;
use crate::error::NetError;

/// What two endpoints agreed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settled {
    /// Path MTU in bytes: the smaller of the two.
    pub mtu: u16,
    /// Sends this side may have in flight: no more than the peer's receive queue holds.
    pub send_depth: u32,
    /// RDMA reads/atomics this side may initiate at once: no more than the peer serves.
    pub max_rd_atomic: u8,
    /// RDMA reads/atomics this side serves at once: no more than the peer initiates.
    pub max_dest_rd_atomic: u8,
}

/// Compares `local` with `peer`: the transport and every application parameter both name
/// must match; capabilities settle on the minimum.
///
/// # Errors
/// [`NetError::Mismatch`] naming the first option that differs, with both values.
pub fn settle(
    local: &Endpoint,
    peer: &Endpoint,
    param_name: impl Fn(u16) -> String,
) -> Result<Settled, NetError> {
    if local.qp_type != peer.qp_type {
        let name = |t: u8| {
            ["RC", "UC", "UD"]
                .get(t as usize)
                .copied()
                .unwrap_or("?")
                .to_string()
        };
        return Err(NetError::Mismatch {
            option: "connection type".into(),
            local: name(local.qp_type),
            peer: name(peer.qp_type),
        });
    }
    for (k, v) in &local.params {
        if let Some((_, pv)) = peer.params.iter().find(|(pk, _)| pk == k) {
            if pv != v {
                return Err(NetError::Mismatch {
                    option: param_name(*k),
                    local: v.to_string(),
                    peer: pv.to_string(),
                });
            }
        }
    }
    Ok(Settled {
        mtu: local.mtu.min(peer.mtu),
        send_depth: local.send_depth.min(peer.recv_depth),
        max_rd_atomic: local.max_rd_atomic.min(peer.max_dest_rd_atomic),
        max_dest_rd_atomic: local.max_dest_rd_atomic.min(peer.max_rd_atomic),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rsrdma::Gid;

    fn ep(mtu: u16, send: u32, recv: u32, rd: u8, dest: u8) -> Endpoint {
        Endpoint {
            qp_num: 1,
            psn: 2,
            lid: 0,
            gid: Gid::default(),
            gid_index: 0,
            mtu,
            qp_type: 0,
            send_depth: send,
            recv_depth: recv,
            max_inline: 0,
            max_rd_atomic: rd,
            max_dest_rd_atomic: dest,
            params: vec![(1, 65536)],
        }
    }

    #[test]
    fn capabilities_settle_on_the_minimum() {
        let s = settle(&ep(4096, 128, 512, 16, 8), &ep(1024, 64, 32, 4, 2), |k| {
            k.to_string()
        })
        .unwrap();
        assert_eq!(
            s,
            Settled {
                mtu: 1024,
                send_depth: 32,
                max_rd_atomic: 2,
                max_dest_rd_atomic: 4
            }
        );
    }

    #[test]
    fn differing_options_are_named() {
        let a = ep(1024, 1, 1, 1, 1);
        let mut b = a.clone();
        b.params = vec![(1, 4096)];
        let e = settle(&a, &b, |_| "size".into()).unwrap_err().to_string();
        assert!(
            e.contains("size") && e.contains("65536") && e.contains("4096"),
            "{e}"
        );
        let mut c = a.clone();
        c.qp_type = 2;
        let e = settle(&a, &c, |_| String::new()).unwrap_err().to_string();
        assert!(
            e.contains("connection type") && e.contains("RC") && e.contains("UD"),
            "{e}"
        );
    }
}
