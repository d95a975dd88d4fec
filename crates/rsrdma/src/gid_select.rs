//! The one GID-selection policy: which GID table entry a connection uses when the user names
//! none. RawConn, the tools and every example go through [`Context::resolve_gid_index`].

use crate::context::{Context, GidEntry, GidType, LinkLayer};
use crate::error::{Error, Result};

impl Context {
    /// The GID index to use on `port`: `requested` if given (checked against the port's
    /// table), else the default choice of [`Context::default_gid_index`].
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an index past the port's table or an empty entry; the
    /// errors of [`Context::query_port`] and [`Context::gid_table`].
    pub fn resolve_gid_index(&self, port: u8, requested: Option<u8>) -> Result<Option<u8>> {
        let Some(index) = requested else {
            return self.default_gid_index(port);
        };
        let len = self.query_port(port)?.gid_tbl_len;
        if u32::from(index) >= len {
            return Err(Error::InvalidArgument(format!(
                "GID index {index} is past the {len}-entry GID table of port {port} of {}",
                self.name()
            )));
        }
        self.query_gid(port, index.into()).map_err(|e| {
            Error::InvalidArgument(format!(
                "GID index {index} of port {port} of {} is empty ({e})",
                self.name()
            ))
        })?;
        Ok(Some(index))
    }

    /// The GID index a connection on `port` uses when none is named: `None` on InfiniBand
    /// (the LID routes), and on RoCE the entry perftest would pick: an IPv4-mapped GID before
    /// any other, RoCE v2 (routable) before v1, the lowest index on a tie.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a RoCE port with no usable GID; the errors of
    /// [`Context::query_port`] and [`Context::gid_table`].
    pub fn default_gid_index(&self, port: u8) -> Result<Option<u8>> {
        if self.query_port(port)?.link_layer != LinkLayer::Ethernet {
            return Ok(None);
        }
        let table = self.gid_table()?;
        match best_gid(&table, port) {
            Some(i) => Ok(Some(i)),
            None => Err(Error::InvalidArgument(format!(
                "port {port} of {} is RoCE but has no usable GID (is its netdev up, with an address?)",
                self.name()
            ))),
        }
    }
}

/// The policy itself, on a GID table: the best non-zero entry of `port` below index 256.
fn best_gid(table: &[GidEntry], port: u8) -> Option<u8> {
    let rank = |e: &GidEntry| (e.gid.to_ipv4().is_some(), e.gid_type == GidType::RoceV2);
    table
        .iter()
        .filter(|e| e.port == port && !e.gid.is_zero() && e.index < 256)
        // max_by_key keeps the last of equals: reverse the index so the lowest wins.
        .max_by_key(|e| (rank(e), std::cmp::Reverse(e.index)))
        .map(|e| e.index as u8)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::Gid;
    use std::net::Ipv6Addr;

    fn entry(index: u32, addr: &str, gid_type: GidType) -> GidEntry {
        GidEntry {
            port: 1,
            index,
            gid: Gid::from(addr.parse::<Ipv6Addr>().unwrap()),
            gid_type,
            netdev: None,
        }
    }

    #[test]
    fn prefers_ipv4_mapped_then_roce_v2_then_lowest_index() {
        let t = [
            entry(0, "fe80::1", GidType::RoceV1),
            entry(1, "fe80::1", GidType::RoceV2),
            entry(2, "::ffff:10.0.0.1", GidType::RoceV1),
            entry(3, "::ffff:10.0.0.1", GidType::RoceV2),
            entry(4, "::ffff:10.0.0.2", GidType::RoceV2),
        ];
        assert_eq!(best_gid(&t, 1), Some(3));
        assert_eq!(best_gid(&t[..3], 1), Some(2));
        assert_eq!(best_gid(&t[..2], 1), Some(1));
        assert_eq!(best_gid(&t[..1], 1), Some(0));
    }

    #[test]
    fn skips_zero_entries_and_other_ports() {
        let mut other = entry(5, "::ffff:10.0.0.9", GidType::RoceV2);
        other.port = 2;
        let t = [entry(0, "::", GidType::RoceV2), other];
        assert_eq!(best_gid(&t, 1), None);
        assert_eq!(best_gid(&t, 2), Some(5));
    }
}
