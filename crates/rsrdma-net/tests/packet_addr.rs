//! Addr's text form (gordma's `<gid>%0x<qpn>[#0x<qkey>]`): round trips, accepted variants,
//! and refusals. No device needed.

use proptest::prelude::*;
use rsrdma::qp::DEFAULT_QKEY;
use rsrdma::Gid;
use rsrdma_net::packet::{Addr, MAX_QPN};
use std::net::Ipv6Addr;

fn mapped(ip: &str) -> Gid {
    Gid::from(ip.parse::<std::net::Ipv4Addr>().unwrap().to_ipv6_mapped())
}

#[test]
fn prints_gordmas_form() {
    let a = Addr::new(mapped("10.77.0.1"), 0x1a2b);
    assert_eq!(
        a.to_string(),
        "0000:0000:0000:0000:0000:ffff:0a4d:0001%0x1a2b",
        "the default Q_Key is left out"
    );
    let b = a.with_qkey(0x2a);
    assert_eq!(
        b.to_string(),
        "0000:0000:0000:0000:0000:ffff:0a4d:0001%0x1a2b#0x2a"
    );
    // Q_Key 0 is not the default here, so it is printed (gordma dropped it, losing it).
    assert!(a.with_qkey(0).to_string().ends_with("#0x0"));
}

#[test]
fn parses_gordma_text_and_friendlier_forms() {
    let want = Addr::new(mapped("10.77.0.1"), 0x1a2b);
    for s in [
        "0000:0000:0000:0000:0000:ffff:0a4d:0001%0x1a2b",
        "0:0:0:0:0:ffff:a4d:1%0x1a2b",
        "::ffff:10.77.0.1%0x1a2b",
        "::ffff:10.77.0.1%6699",
        "::ffff:10.77.0.1%0x1A2B#0x11111111",
        "::ffff:10.77.0.1%0x1a2b#286331153",
    ] {
        assert_eq!(s.parse::<Addr>(), Ok(want), "{s}");
    }
    let fe80: Ipv6Addr = "fe80::1".parse().unwrap();
    assert_eq!(
        "fe80::1%0x7#0x0".parse::<Addr>(),
        Ok(Addr::new(Gid::from(fe80), 7).with_qkey(0))
    );
}

#[test]
fn refuses_what_is_not_an_address() {
    for (s, why) in [
        ("", "no '%'"),
        ("::1", "no '%'"),
        ("::1%", "QPN"),
        ("::1%0x", "QPN"),
        ("::1%0x1000000", "24 bits"),
        ("::1%-1", "QPN"),
        ("::1%0x+5", "QPN"),
        ("::1%12abc", "QPN"),
        ("::1%0x1#", "Q_Key"),
        ("::1%0x1#0x100000000", "Q_Key"),
        ("1:2:3%0x1", "GID"),
        ("0000:0000:0000:0000:0000:ffff:0a4d:0001:0002%0x1", "GID"),
        ("zzzz::1%0x1", "GID"),
        ("::1%0x1#0x1#0x2", "Q_Key"),
    ] {
        let e = s.parse::<Addr>().expect_err(s);
        let text = e.to_string();
        assert!(text.contains(why), "{s:?}: {text}");
        assert!(text.contains("expected <gid>%0x<qpn>"), "{text}");
    }
    // A huge input gives a small error.
    let long = "x".repeat(100_000);
    assert!(long.parse::<Addr>().unwrap_err().to_string().len() < 400);
}

proptest! {
    #[test]
    fn display_then_parse_is_identity(gid in any::<[u8; 16]>(), qpn in 0..=MAX_QPN, qkey in any::<u32>()) {
        let a = Addr { gid: Gid(gid), qpn, qkey };
        let text = a.to_string();
        prop_assert_eq!(text.parse::<Addr>(), Ok(a));
        prop_assert_eq!(text.contains('#'), qkey != DEFAULT_QKEY);
    }

    #[test]
    fn parsing_garbage_never_panics(s in ".{0,80}") {
        let _ = s.parse::<Addr>();
    }
}
