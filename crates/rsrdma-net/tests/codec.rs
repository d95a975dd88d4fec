//! The handshake codec: round trips, every truncation, and fuzzed input (proptest), which must
//! give an error or a message, never a panic.

use proptest::prelude::*;
use rsrdma::{Gid, RemoteMemory};
use rsrdma_net::handshake::codec::{
    decode, DecodeError, Endpoint, Hello, Message, Proof, Regions, Role, HEADER_LEN, MAX_BODY,
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
    ]
}

#[test]
fn every_message_round_trips() {
    for m in samples() {
        let bytes = m.to_bytes();
        let (back, used) = decode(&bytes).unwrap().unwrap();
        assert_eq!(back, m);
        assert_eq!(used, bytes.len());
    }
}

#[test]
fn every_truncation_asks_for_more_and_two_frames_split_cleanly() {
    for m in samples() {
        let bytes = m.to_bytes();
        for cut in 0..bytes.len() {
            assert_eq!(decode(&bytes[..cut]), Ok(None), "{} cut at {cut}", m.name());
        }
    }
    let mut two = Message::Sync(1).to_bytes();
    two.extend(Message::Sync(2).to_bytes());
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
    let mut v = Message::Sync(1).to_bytes();
    v[4] = 9;
    assert_eq!(decode(&v), Err(DecodeError::Version(9)));
    let mut v = Message::Sync(1).to_bytes();
    v[5] = 99;
    assert_eq!(decode(&v), Err(DecodeError::Kind(99)));
    let mut v = Message::Sync(1).to_bytes();
    v[8..12].copy_from_slice(&((MAX_BODY as u32) + 1).to_be_bytes());
    assert!(matches!(decode(&v), Err(DecodeError::TooLong(_))));
    // A body longer than its fields.
    let mut v = Message::Sync(1).to_bytes();
    v[11] += 1;
    v.push(0);
    assert!(matches!(decode(&v), Err(DecodeError::Trailing { .. })));
    // A region count larger than the bytes that follow is refused before allocating.
    let mut v = Message::Regions(Regions::default()).to_bytes();
    v[HEADER_LEN..HEADER_LEN + 2].copy_from_slice(&100u16.to_be_bytes());
    assert!(matches!(decode(&v), Err(DecodeError::Truncated { .. })));
    // Out-of-range fields.
    let mut e = match &samples()[3] {
        Message::Endpoint(e) => e.clone(),
        _ => unreachable!(),
    };
    e.mtu = 1500;
    assert!(matches!(
        decode(&Message::Endpoint(e).to_bytes()),
        Err(DecodeError::Invalid { field: "mtu", .. })
    ));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4000, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode(&bytes);
    }

    #[test]
    fn mutated_frames_never_panic_and_never_decode_past_their_length(
        which in 0usize..8,
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6),
        cut in any::<usize>(),
    ) {
        let mut bytes = samples()[which].to_bytes();
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
        let bytes = m.to_bytes();
        prop_assert_eq!(decode(&bytes).unwrap().unwrap(), (m, bytes.len()));
    }
}
