//! The header and Params codecs (round trips, every malformed case, fuzzed input that must
//! give an error or a value, never a panic) and the settle rules.

use proptest::prelude::*;
use rsrdma_proto::frame::{FLAG_FIRST, FLAG_LAST};
use rsrdma_proto::params::{MAGIC, VERSION_MAJOR};
use rsrdma_proto::{settle, Config, FrameType, Header, Params, ProtoError, HEADER_LEN, PARAMS_LEN};

fn data(flags: u8, msg_id: u16, len: u32, aux: u32) -> Header {
    Header {
        kind: FrameType::Data,
        flags,
        msg_id,
        credit_limit: 0x1234_5678,
        payload_len: len,
        aux,
    }
}

fn valid_headers() -> Vec<Header> {
    let mut v = vec![
        data(FLAG_FIRST | FLAG_LAST, 7, 5, 5),
        data(FLAG_FIRST | FLAG_LAST, 0, 0, 0),
        data(FLAG_FIRST, 65535, 100, 1000),
        data(0, 3, 100, 0),
        data(FLAG_LAST, 3, 0, 0),
    ];
    for kind in [
        FrameType::Credit,
        FrameType::Ping,
        FrameType::Pong,
        FrameType::Abort,
    ] {
        let aux = if kind == FrameType::Credit {
            0
        } else {
            0xdead_beef
        };
        v.push(Header::control(kind, 0, u32::MAX, aux));
    }
    v.push(Header::control(FrameType::Fin, 42, 9, 0));
    v.push(Header {
        kind: FrameType::Rts,
        flags: 0,
        msg_id: 7,
        credit_limit: 1,
        payload_len: 16,
        aux: 1 << 20,
    });
    v.push(Header::control(FrameType::Done, 7, 1, 0));
    v.push(Header::control(FrameType::Withdraw, 7, 1, 0));
    v.push(Header::control(FrameType::Withdrawn, 65535, 1, 0));
    v
}

#[test]
fn every_header_round_trips_byte_exact() {
    for h in valid_headers() {
        let b = h.encode();
        assert_eq!(Header::decode(&b), Ok(h));
        assert_eq!(b[0], h.kind as u8);
    }
    // The documented layout, byte by byte.
    let b = data(FLAG_FIRST, 0x0102, 0x0304_0506, 0x0708_090a).encode();
    assert_eq!(
        b,
        [
            1, 1, 0x02, 0x01, 0x78, 0x56, 0x34, 0x12, 0x06, 0x05, 0x04, 0x03, 0x0a, 0x09, 0x08,
            0x07
        ]
    );
}

#[test]
fn every_malformed_header_is_refused() {
    let reason = |b: &[u8]| match Header::decode(b) {
        Err(ProtoError::BadFrame { reason }) => reason,
        other => panic!("{b:?} decoded as {other:?}"),
    };
    let good = data(FLAG_FIRST | FLAG_LAST, 1, 5, 5).encode();
    for cut in 0..HEADER_LEN {
        assert_eq!(reason(&good[..cut]), "shorter than the 16-byte header");
    }
    for t in [0u8, 11, 0x7f, 0xff] {
        let mut b = good;
        b[0] = t;
        assert_eq!(reason(&b), "unknown frame type");
    }
    let mut b = good;
    b[1] = 0x04 | FLAG_FIRST | FLAG_LAST;
    assert_eq!(reason(&b), "unknown flag bits");
    let cases: Vec<(Header, &str)> = vec![
        (
            Header {
                flags: FLAG_LAST,
                ..Header::control(FrameType::Credit, 0, 0, 0)
            },
            "flags on a control frame",
        ),
        (
            Header {
                payload_len: 1,
                ..Header::control(FrameType::Ping, 0, 0, 0)
            },
            "payload on a control frame",
        ),
        (
            Header::control(FrameType::Pong, 1, 0, 0),
            "message id on a control frame",
        ),
        (
            Header::control(FrameType::Credit, 0, 0, 1),
            "aux set on a frame type that has none",
        ),
        (
            Header::control(FrameType::Fin, 0, 0, 1),
            "aux set on a frame type that has none",
        ),
        (
            Header::control(FrameType::Withdraw, 3, 0, 1),
            "aux set on a frame type that has none",
        ),
        (
            Header {
                payload_len: 16,
                ..Header::control(FrameType::Withdrawn, 3, 0, 0)
            },
            "payload on a control frame",
        ),
        (
            data(0, 0, 10, 10),
            "message length on a continuation fragment",
        ),
        (
            data(FLAG_FIRST, 0, 11, 10),
            "first fragment longer than its message",
        ),
        (
            data(FLAG_FIRST | FLAG_LAST, 0, 9, 10),
            "single-fragment message whose length differs from its fragment",
        ),
        (data(0, 0, 0, 0), "empty fragment that is not the last"),
    ];
    for (h, want) in cases {
        assert_eq!(reason(&h.encode()), want, "{h:?}");
    }
}

fn params() -> Params {
    Config::default().params()
}

#[test]
fn params_round_trip_and_documented_layout() {
    let p = Params {
        inline_size: 220,
        features: 0x8000_0001,
        rdv_threshold: 0x0004_0000,
        ..params()
    };
    let b = p.encode();
    assert_eq!(b.len(), PARAMS_LEN);
    assert_eq!(Params::decode(&b), Ok(p));
    assert_eq!(&b[0..4], b"RSCP");
    assert_eq!((b[4], b[5]), (1, 2));
    assert_eq!(&b[8..12], &(32u32 * 1024 + 16).to_le_bytes());
    assert_eq!(&b[12..14], &32u16.to_le_bytes());
    assert_eq!(&b[14..16], &220u16.to_le_bytes());
    assert_eq!(&b[16..20], &(16u32 << 20).to_le_bytes());
    assert_eq!(&b[20..24], &0x8000_0001u32.to_le_bytes());
    assert_eq!(&b[24..28], &0x0004_0000u32.to_le_bytes());
    assert!(b[6..8].iter().chain(&b[28..32]).all(|&x| x == 0));
    // Without the feature the threshold is sent as 0.
    let plain = Config::default().with_rdv_threshold(77).params().encode();
    assert!(plain[24..28].iter().all(|&x| x == 0));
}

#[test]
fn every_malformed_params_is_refused() {
    let good = params().encode();
    for cut in 0..PARAMS_LEN {
        assert!(matches!(
            Params::decode(&good[..cut]),
            Err(ProtoError::BadParams { .. })
        ));
    }
    let mut long = good.to_vec();
    long.push(0);
    assert!(Params::decode(&long).is_err());
    let mut b = good;
    b[1] ^= 0xff;
    assert_eq!(
        Params::decode(&b),
        Err(ProtoError::BadParams {
            reason: "bad magic"
        })
    );
    let bad = |f: fn(&mut Params)| {
        let mut p = params();
        f(&mut p);
        Params::decode(&p.encode())
    };
    assert!(bad(|p| p.slot_size = 63).is_err());
    assert!(bad(|p| p.slot_size = (1 << 24) + 1).is_err());
    assert!(bad(|p| p.recv_slots = 7).is_err());
    assert!(bad(|p| p.recv_slots = 32769).is_err());
    assert!(bad(|p| p.max_message = 0).is_err());
    assert!(bad(|p| {
        p.features = rsrdma_proto::FEATURE_RENDEZVOUS;
        p.rdv_threshold = 0;
    })
    .is_err());
    assert!(bad(|p| p.slot_size = 64).is_ok());
    assert!(bad(|p| p.recv_slots = 8).is_ok());
}

#[test]
fn settle_takes_minimums_intersection_and_mirrors() {
    let a = Params {
        slot_size: 4096,
        recv_slots: 64,
        max_message: 1 << 20,
        features: 0b11,
        minor: 3,
        rdv_threshold: 4096,
        ..params()
    };
    let b = Params {
        slot_size: 65536,
        recv_slots: 16,
        max_message: 1 << 30,
        features: 0b01,
        minor: 0,
        rdv_threshold: 1 << 18,
        ..params()
    };
    let ab = settle(&a, &b).unwrap();
    let ba = settle(&b, &a).unwrap();
    assert_eq!(ab.frame_size, 4096);
    assert_eq!(ab.max_message, 1 << 20);
    assert_eq!(ab.minor, 0);
    assert_eq!(ab.features, 0b01, "the intersection of what is known");
    assert_eq!(ab.rendezvous(), Some(1 << 18), "the larger threshold");
    assert_eq!(ba.rendezvous(), Some(1 << 18));
    let c = Params {
        features: 0,
        rdv_threshold: 0,
        ..b
    };
    assert_eq!(settle(&a, &c).unwrap().rendezvous(), None);
    assert_eq!((ab.local_recv_slots, ab.peer_recv_slots), (64, 16));
    assert_eq!((ba.local_recv_slots, ba.peer_recv_slots), (16, 64));
    assert_eq!(
        (ab.frame_size, ab.max_message, ab.features, ab.minor),
        (ba.frame_size, ba.max_message, ba.features, ba.minor)
    );
    assert_eq!(ab.frame_payload(), 4096 - HEADER_LEN as u32);
}

#[test]
fn settle_refuses_another_major_version_clearly() {
    let mut p = params();
    p.major = 2;
    p.slot_size = 0; // a version-2 layout need not pass version-1 range checks
    let decoded = Params::decode(&p.encode()).unwrap();
    let err = settle(&params(), &decoded).unwrap_err();
    assert_eq!(
        err,
        ProtoError::IncompatibleVersion {
            local: VERSION_MAJOR,
            peer: 2
        }
    );
    assert_eq!(
        err.to_string(),
        "the peer speaks protocol version 2, this side version 1"
    );
}

#[test]
fn config_checks_its_local_fields() {
    assert!(Config::default().check().is_ok());
    assert!(Config::default().with_send_slots(1).check().is_err());
    assert!(Config::default().with_sq_depth(1).check().is_err());
    assert!(Config::default().with_signal_interval(0).check().is_err());
    assert!(Config::default().with_inline_size(1025).check().is_err());
    let slow = Config::default().with_keepalive(Some(std::time::Duration::from_secs(9)));
    assert!(
        slow.check().is_err(),
        "keepalive longer than the peer timeout"
    );
    assert_eq!(Config::default().slot_memory(), (2 << 20) + 64 * 16);
    assert_eq!(
        Config::default().slot_size - 16,
        32 * 1024,
        "32 KiB of payload a frame"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn any_bytes_decode_to_a_header_that_re_encodes_or_an_error(bytes in proptest::collection::vec(any::<u8>(), 0..24)) {
        if let Ok(h) = Header::decode(&bytes) {
            prop_assert_eq!(&h.encode()[..], &bytes[..HEADER_LEN]);
        }
    }

    #[test]
    fn any_bytes_decode_to_params_or_an_error(mut bytes in proptest::collection::vec(any::<u8>(), 28..36), magic in any::<bool>()) {
        if magic && bytes.len() >= 4 {
            bytes[..4].copy_from_slice(&MAGIC);
        }
        if let Ok(p) = Params::decode(&bytes) {
            prop_assert_eq!(bytes.len(), PARAMS_LEN);
            let again = Params::decode(&p.encode()).unwrap();
            prop_assert_eq!(again, p);
        }
    }
}
