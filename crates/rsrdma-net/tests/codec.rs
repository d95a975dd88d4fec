//! The handshake codec: round trips, every truncation, and fuzzed input (proptest), which must
//! give an error or a message, never a panic.

use proptest::prelude::*;
use rsrdma::{Gid, RemoteMemory};
use rsrdma_net::handshake::codec::{
    decode, decode_body, DecodeError, EncodeError, Endpoint, Hello, Message, MessageKind, Proof,
    Regions, Role, HEADER_LEN, MAGIC, MAX_BODY, MAX_PARAMS, MAX_REASON, MAX_REGIONS, REGION_LEN,
    VERSION,
};

fn samples() -> Vec<Message> {
    vec![
        Message::Hello(Hello {
            role: Role::Client,
            auth_required: true,
            nonce: [7; 32],
        }),
        Message::Hello(Hello {
            role: Role::Server,
            auth_required: false,
            nonce: [0; 32],
        }),
        Message::Proof(Proof { tag: [0xab; 32] }),
        Message::Endpoint(Endpoint {
            qp_num: 0x12_3456,
            psn: 0xab_cdef,
            lid: 7,
            gid: Gid([1; 16]),
            gid_index: 3,
            mtu: 4096,
            qp_type: 2,
            send_depth: 128,
            recv_depth: 512,
            max_inline: 220,
            max_rd_atomic: 16,
            max_dest_rd_atomic: 16,
            params: vec![(1, 65536), (2, 1000)],
        }),
        Message::Regions(Regions(vec![
            RemoteMemory {
                addr: 0x7f00_0000_1000,
                len: 1 << 20,
                rkey: 0x1234,
            },
            RemoteMemory {
                addr: 0,
                len: 0,
                rkey: 0,
            },
        ])),
        Message::Regions(Regions::default()),
        Message::Sync(42),
        Message::Abort("options differ: size".into()),
        Message::Keepalive,
        Message::Close,
    ]
}

#[test]
fn every_message_round_trips() {
    for m in samples() {
        let bytes = m.to_bytes().unwrap();
        let (back, used) = decode(&bytes).unwrap().unwrap();
        assert_eq!(back, m);
        assert_eq!(used, bytes.len());
    }
}

#[test]
fn every_truncation_asks_for_more_and_two_frames_split_cleanly() {
    for m in samples() {
        let bytes = m.to_bytes().unwrap();
        for cut in 0..bytes.len() {
            assert_eq!(decode(&bytes[..cut]), Ok(None), "{} cut at {cut}", m.name());
        }
    }
    let mut two = Message::Sync(1).to_bytes().unwrap();
    two.extend(Message::Sync(2).to_bytes().unwrap());
    let (a, n) = decode(&two).unwrap().unwrap();
    let (b, _) = decode(&two[n..]).unwrap().unwrap();
    assert_eq!((a, b), (Message::Sync(1), Message::Sync(2)));
}

#[test]
fn garbage_is_named() {
    assert!(matches!(
        decode(b"GET / HTTP/1.1\r\n\r\n"),
        Err(DecodeError::BadMagic(_))
    ));
    assert!(
        matches!(decode(b"X"), Err(DecodeError::BadMagic(_))),
        "rejected from the first byte"
    );
    let mut v = Message::Sync(1).to_bytes().unwrap();
    v[4] = 9;
    assert_eq!(decode(&v), Err(DecodeError::Version(9)));
    let mut v = Message::Sync(1).to_bytes().unwrap();
    v[5] = 99;
    assert_eq!(decode(&v), Err(DecodeError::Kind(99)));
    let mut v = Message::Sync(1).to_bytes().unwrap();
    v[8..12].copy_from_slice(&((MAX_BODY as u32) + 1).to_be_bytes());
    assert!(matches!(decode(&v), Err(DecodeError::TooLong(_))));
    // A body longer than its fields.
    let mut v = Message::Sync(1).to_bytes().unwrap();
    v[11] += 1;
    v.push(0);
    assert!(matches!(decode(&v), Err(DecodeError::Trailing { .. })));
    // A region count larger than the bytes that follow is refused before allocating.
    let mut v = Message::Regions(Regions::default()).to_bytes().unwrap();
    v[HEADER_LEN..HEADER_LEN + 2].copy_from_slice(&100u16.to_be_bytes());
    assert!(matches!(decode(&v), Err(DecodeError::Truncated { .. })));
    // Out-of-range fields.
    let mut e = match &samples()[3] {
        Message::Endpoint(e) => e.clone(),
        _ => unreachable!(),
    };
    e.mtu = 1500;
    assert!(matches!(
        decode(&Message::Endpoint(e).to_bytes().unwrap()),
        Err(DecodeError::Invalid { field: "mtu", .. })
    ));
}

fn regions(n: usize) -> Regions {
    Regions(
        (0..n as u64)
            .map(|i| RemoteMemory {
                addr: i << 20,
                len: 4096 + i,
                rkey: i as u32,
            })
            .collect(),
    )
}

/// A regions frame of `n` descriptors, built by hand (the encoder refuses too many).
fn raw_regions_frame(n: usize) -> Vec<u8> {
    let body_len = 2 + n * REGION_LEN;
    let mut v = MAGIC.to_vec();
    v.extend_from_slice(&[1, MessageKind::Regions.code(), 0, 0]);
    v.extend_from_slice(&(body_len as u32).to_be_bytes());
    v.extend_from_slice(&(n as u16).to_be_bytes());
    v.resize(HEADER_LEN + body_len, 0);
    v
}

#[test]
fn the_largest_region_list_round_trips() {
    let m = Message::Regions(regions(MAX_REGIONS));
    let bytes = m.to_bytes().unwrap();
    assert_eq!(
        bytes.len(),
        HEADER_LEN + MAX_BODY,
        "the largest message is MAX_BODY"
    );
    assert_eq!(decode(&bytes).unwrap().unwrap(), (m, bytes.len()));
}

#[test]
fn one_region_more_is_refused_on_encode_and_on_decode() {
    let e = Message::Regions(regions(MAX_REGIONS + 1))
        .to_bytes()
        .unwrap_err();
    assert!(
        matches!(e, EncodeError::TooLarge { len, limit, .. } if len == MAX_REGIONS + 1 && limit == MAX_REGIONS),
        "{e:?}"
    );
    let text = e.to_string();
    assert!(
        text.contains("4097") && text.contains("MAX_REGIONS"),
        "{text}"
    );
    // Nothing is appended on refusal.
    let mut out = vec![1, 2, 3];
    assert!(Message::Regions(regions(MAX_REGIONS + 1))
        .encode(&mut out)
        .is_err());
    assert_eq!(out, [1, 2, 3]);

    // The frame a careless encoder would send: its header is refused before the body is read.
    let frame = raw_regions_frame(MAX_REGIONS + 1);
    let e = decode(&frame[..HEADER_LEN]).unwrap_err();
    assert_eq!(e, DecodeError::TooLong(MAX_BODY + REGION_LEN));
    assert!(e.to_string().contains(&MAX_BODY.to_string()), "{e}");
    // The body alone, by its count.
    let e = decode_body(MessageKind::Regions.code(), &frame[HEADER_LEN..]).unwrap_err();
    assert!(
        matches!(
            e,
            DecodeError::Invalid {
                field: "region count",
                ..
            } | DecodeError::TooLong(_)
        ),
        "{e:?}"
    );
    // A count over the limit in a body that is short enough is refused by the count.
    let mut body = (MAX_REGIONS as u16 + 1).to_be_bytes().to_vec();
    body.resize(100, 0);
    let e = decode_body(MessageKind::Regions.code(), &body).unwrap_err();
    assert!(
        matches!(
            e,
            DecodeError::Invalid {
                field: "region count",
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("MAX_REGIONS"), "{e}");
    // The hand-built frame of exactly the limit decodes.
    assert!(decode(&raw_regions_frame(MAX_REGIONS)).unwrap().is_some());
}

#[test]
fn parameter_and_reason_limits_hold_on_both_sides() {
    let mut e = match &samples()[3] {
        Message::Endpoint(e) => e.clone(),
        _ => unreachable!(),
    };
    e.params = (0..MAX_PARAMS as u16).map(|k| (k, 1)).collect();
    let m = Message::Endpoint(e.clone());
    let bytes = m.to_bytes().unwrap();
    assert_eq!(decode(&bytes).unwrap().unwrap().0, m);
    e.params.push((999, 1));
    assert!(matches!(
        Message::Endpoint(e).to_bytes(),
        Err(EncodeError::TooLarge {
            limit: MAX_PARAMS,
            ..
        })
    ));

    let longest = "é".repeat(MAX_REASON / 2);
    let m = Message::Abort(longest.clone());
    assert_eq!(decode(&m.to_bytes().unwrap()).unwrap().unwrap().0, m);
    assert!(matches!(
        Message::Abort(format!("{longest}x")).to_bytes(),
        Err(EncodeError::TooLarge {
            limit: MAX_REASON,
            ..
        })
    ));
    // Message::abort shortens a long reason at a character boundary instead.
    let Message::Abort(cut) = Message::abort(&format!("x{longest}")) else {
        unreachable!()
    };
    assert_eq!(cut.len(), MAX_REASON - 1);
    // A reason over the limit from the peer is refused.
    let mut v = Message::Abort("ok".into()).to_bytes().unwrap();
    v.truncate(HEADER_LEN);
    v[8..12].copy_from_slice(&((MAX_REASON + 1) as u32).to_be_bytes());
    v.resize(HEADER_LEN + MAX_REASON + 1, b'a');
    assert!(matches!(
        decode(&v),
        Err(DecodeError::Invalid {
            field: "reason",
            ..
        })
    ));
}

#[test]
fn versions_one_and_two_decode_and_new_kinds_need_version_two() {
    for m in [Message::Keepalive, Message::Close] {
        let bytes = m.to_bytes().unwrap();
        assert_eq!(bytes[4], 2, "{} is a version-2 kind", m.name());
        assert_eq!(bytes.len(), HEADER_LEN);
        assert_eq!(decode(&bytes).unwrap().unwrap(), (m, HEADER_LEN));
    }
    // The hello announces version 2: a version-1 peer refuses it at once, with a clear error.
    let hello = Message::Hello(Hello {
        role: Role::Client,
        auth_required: false,
        nonce: [7; 32],
    });
    assert_eq!(hello.to_bytes().unwrap()[4], VERSION);
    // Other version-1 kinds go out as version 1.
    let mut sync = Message::Sync(3).to_bytes().unwrap();
    assert_eq!(sync[4], 1);
    // The same frame marked version 2 decodes too.
    sync[4] = VERSION;
    assert_eq!(decode(&sync).unwrap().unwrap().0, Message::Sync(3));
    // A version-1 frame cannot carry a version-2 kind.
    let mut ka = Message::Keepalive.to_bytes().unwrap();
    ka[4] = 1;
    assert_eq!(decode(&ka), Err(DecodeError::Kind(7)));
    ka[4] = VERSION + 1;
    assert_eq!(decode(&ka), Err(DecodeError::Version(VERSION + 1)));
    ka[4] = 0;
    assert_eq!(decode(&ka), Err(DecodeError::Version(0)));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4000, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode(&bytes);
    }

    #[test]
    fn mutated_frames_never_panic_and_never_decode_past_their_length(
        which in 0usize..10,
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6),
        cut in any::<usize>(),
    ) {
        let mut bytes = samples()[which].to_bytes().unwrap();
        for (pos, val) in flips {
            let i = pos % bytes.len();
            bytes[i] = val;
        }
        let cut = cut % (bytes.len() + 1);
        if let Ok(Some((_, used))) = decode(&bytes[..cut]) {
            prop_assert!(used <= cut);
        }
    }

    #[test]
    fn endpoints_round_trip(qp in 0u32..0x100_0000, psn in 0u32..0x100_0000, lid: u16, gid: [u8; 16],
                            mtu_code in 0usize..5, depth: u32, params in proptest::collection::vec((any::<u16>(), any::<u64>()), 0..8)) {
        let m = Message::Endpoint(Endpoint {
            qp_num: qp, psn, lid, gid: Gid(gid), gid_index: 1, mtu: [256, 512, 1024, 2048, 4096][mtu_code],
            qp_type: 0, send_depth: depth, recv_depth: depth / 2, max_inline: 0, max_rd_atomic: 1,
            max_dest_rd_atomic: 1, params,
        });
        let bytes = m.to_bytes().unwrap();
        prop_assert_eq!(decode(&bytes).unwrap().unwrap(), (m, bytes.len()));
    }
}
