//! The exchanges before any resource exists (spec 1.2–1.3): the version (with the rs trailer),
//! the page and cache-line sizes, and the MTU.

use crate::args::Params;
use crate::device::PortInfo;
use crate::error::{Error, Result};
use crate::oob::{Oob, Wait};
use crate::out::Out;
use crate::wire::{self, Trailer};
use rsrdma::Mtu;

/// Exchanges versions; returns the peer's rs trailer (`None` from perftest).
///
/// # Errors
/// A peer that is not perftest, or an rs peer started with other options.
pub fn version(p: &Params, oob: &mut Oob) -> Result<Option<Trailer>> {
    let mine = Trailer::of(p);
    let mut ver = [0u8; wire::VER_LEN];
    oob.exchange(
        "the version",
        &wire::encode_version(Some(&mine)),
        &mut ver,
        Wait::Prompt,
    )?;
    let (version, peer_trailer) = wire::parse_version(&ver);
    if version < wire::MIN_VERSION {
        return Err(Error::Protocol(format!(
            "Current implementation is not compatible with versions older than 5.70\n (the peer {} sent \"{}\" instead of a perftest version: is it a perftest tool? On soft0 a client with -R, where this side has none, is one: give both ends -R, or neither)",
            oob.peer(),
            wire::printable(&ver)
        )));
    }
    if let Some((option, a, b)) = peer_trailer.as_ref().and_then(|t| mine.first_difference(t)) {
        return Err(Error::Mismatch {
            option: option.into(),
            mine: a,
            theirs: b,
        });
    }
    Ok(peer_trailer)
}

/// Exchanges page size and cache line; both ends use the larger of each.
///
/// # Errors
/// A failed exchange.
pub fn sys(oob: &mut Oob) -> Result<(usize, usize)> {
    let mut b4 = [0u8; 4];
    let local_page = page_size();
    oob.exchange(
        "the page size",
        &wire::encode_sys(local_page),
        &mut b4,
        Wait::Prompt,
    )?;
    let page = settle_page(local_page, wire::parse_sys(&b4));
    let local_line = cache_line();
    oob.exchange(
        "the cache line size",
        &wire::encode_sys(local_line),
        &mut b4,
        Wait::Prompt,
    )?;
    let line = local_line.max(wire::parse_sys(&b4)).clamp(16, 4096) as usize;
    Ok((page, line))
}

/// The largest page size taken from a peer: the largest base page of any Linux platform.
const MAX_PEER_PAGE: u32 = 64 << 10;

/// The page size both ends use: the larger of the two, the peer's cut to [`MAX_PEER_PAGE`]. The
/// buffers are sized by it before the peer has shown its endpoint: a peer that announced
/// 2 GiB once made a tool server fill about 4 GiB of memory before it gave up on that peer.
fn settle_page(local: u32, peer: u32) -> usize {
    local.max(peer.min(MAX_PEER_PAGE)).clamp(64, 1 << 30) as usize
}

/// Exchanges MTUs; both ends use the smaller one. An explicit `-m` on either end must match.
///
/// # Errors
/// A failed exchange, or different explicit MTUs.
pub fn mtu(
    p: &Params,
    port: &PortInfo,
    peer_trailer: Option<&Trailer>,
    oob: &mut Oob,
    o: &mut Out<'_>,
) -> Result<Mtu> {
    let local = local_mtu(p, port, o);
    let mut b2 = [0u8; 2];
    oob.exchange("the MTU", &wire::encode_mtu(local), &mut b2, Wait::Prompt)?;
    let Some(remote) = wire::parse_mtu(&b2) else {
        return Ok(local);
    };
    let explicit = p.mtu.is_some() || peer_trailer.is_some_and(|t| t.mtu_explicit());
    if explicit && remote != local {
        return Err(Error::Mismatch {
            option: "-m (MTU)".into(),
            mine: local.bytes().to_string(),
            theirs: remote.bytes().to_string(),
        });
    }
    Ok(local.min(remote))
}

/// `-m` if valid and not above the port's active MTU (perftest's warnings otherwise).
fn local_mtu(p: &Params, port: &PortInfo, o: &mut Out<'_>) -> Mtu {
    if let Some(bad) = p.mtu_invalid {
        eprint!(
            " Invalid MTU - {bad} \n Please choose mtu from {{256,512,1024,2048,4096}}\n Will run with the port active mtu - {}\n",
            port.active_mtu as u32
        );
    }
    match p.mtu.and_then(Mtu::from_bytes) {
        Some(m) if m > port.active_mtu => {
            o.text(&format!(
                "Requested mtu is higher than active mtu \nChanging to active mtu - {}\n",
                port.active_mtu as u32
            ));
            port.active_mtu
        }
        Some(m) => m,
        None => port.active_mtu,
    }
}

fn page_size() -> u32 {
    // SAFETY: sysconf has no preconditions.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if v > 0 {
        v as u32
    } else {
        4096
    }
}

fn cache_line() -> u32 {
    // SAFETY: sysconf has no preconditions.
    let v = unsafe { libc::sysconf(libc::_SC_LEVEL1_DCACHE_LINESIZE) };
    if v > 0 {
        return v as u32;
    }
    std::fs::read_to_string("/sys/devices/system/cpu/cpu0/cache/index0/coherency_line_size")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peers_page_size_is_taken_up_to_64_kib() {
        assert_eq!(settle_page(4096, 4096), 4096);
        assert_eq!(settle_page(4096, 65536), 65536);
        assert_eq!(settle_page(65536, 4096), 65536);
        // A peer's absurd page size (a bad or hostile peer) no longer sizes the buffers.
        assert_eq!(settle_page(4096, 0x7fff_ffff), 65536);
        assert_eq!(settle_page(4096, u32::MAX), 65536);
        assert_eq!(settle_page(4096, 0), 4096);
    }
}
