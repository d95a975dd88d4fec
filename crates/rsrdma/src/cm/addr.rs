//! Socket addresses between Rust and C form.

use crate::ffi;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// A socket address in C form.
pub(super) enum SockAddr {
    V4(libc::sockaddr_in),
    V6(libc::sockaddr_in6),
}

impl From<SocketAddr> for SockAddr {
    fn from(a: SocketAddr) -> Self {
        match a {
            SocketAddr::V4(a) => SockAddr::V4(libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*a.ip()).to_be(),
                },
                sin_zero: [0; 8],
            }),
            SocketAddr::V6(a) => SockAddr::V6(libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            }),
        }
    }
}

impl SockAddr {
    pub(super) fn as_mut_ptr(&mut self) -> *mut ffi::sockaddr {
        match self {
            SockAddr::V4(s) => (s as *mut libc::sockaddr_in).cast(),
            SockAddr::V6(s) => (s as *mut libc::sockaddr_in6).cast(),
        }
    }
}

/// Writes `a` in C form into `out` (the soft device's CM fills its ids' addresses so).
pub(crate) fn write_sockaddr(a: SocketAddr, out: &mut libc::sockaddr_storage) {
    let at: *mut libc::sockaddr_storage = out;
    match SockAddr::from(a) {
        // SAFETY: a sockaddr_storage holds any sockaddr, suitably aligned.
        SockAddr::V4(s) => unsafe { at.cast::<libc::sockaddr_in>().write(s) },
        // SAFETY: as above.
        SockAddr::V6(s) => unsafe { at.cast::<libc::sockaddr_in6>().write(s) },
    }
}

/// # Safety
/// `sa` must be null or point at a valid sockaddr of the family it names.
pub(crate) unsafe fn sockaddr_to_std(sa: *const ffi::sockaddr) -> Option<SocketAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: the family field is the first field of every sockaddr.
    let family = unsafe { (*(sa as *const libc::sockaddr)).sa_family } as i32;
    match family {
        libc::AF_INET => {
            // SAFETY: the family says this is a sockaddr_in.
            let s = unsafe { &*(sa as *const libc::sockaddr_in) };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr)),
                u16::from_be(s.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says this is a sockaddr_in6.
            let s = unsafe { &*(sa as *const libc::sockaddr_in6) };
            let ip = Ipv6Addr::from(s.sin6_addr.s6_addr);
            Some(SocketAddr::V6(SocketAddrV6::new(
                ip,
                u16::from_be(s.sin6_port),
                s.sin6_flowinfo,
                s.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_addresses_round_trip_through_c() {
        for text in ["10.77.0.1:7471", "[fe80::1%3]:18515", "0.0.0.0:0"] {
            let a: SocketAddr = text.parse().unwrap();
            let mut c = SockAddr::from(a);
            // SAFETY: `c` is a valid sockaddr of its family.
            let back = unsafe { sockaddr_to_std(c.as_mut_ptr()) };
            assert_eq!(back, Some(a));
        }
    }
}
