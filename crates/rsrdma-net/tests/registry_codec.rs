//! The registry's wire format: round trips, every truncation, limits, and fuzzed input
//! (proptest), which must give an error or a message, never a panic.

use proptest::prelude::*;
use rsrdma::Gid;
use rsrdma_net::packet::Addr;
use rsrdma_net::registry::codec::{
    decode_body, encode, split_frame, DecodeError, EncodeError, Message, LEN_PREFIX, MAX_FRAME,
    MAX_NAME, MAX_TEXT, VERSION,
};
use rsrdma_net::registry::ErrorCode;

fn addr() -> Addr {
    Addr::new(Gid([3; 16]), 0x12_3456).with_qkey(0xdead_beef)
}

fn samples() -> Vec<Message> {
    vec![
        Message::Hello { nonce: [1; 32] },
        Message::Welcome {
            auth_required: true,
            nonce: [2; 32],
        },
        Message::Welcome {
            auth_required: false,
            nonce: [0; 32],
        },
        Message::Proof { tag: [9; 32] },
        Message::Register {
            name: "node-a".into(),
            addr: addr(),
            lease_ms: 30_000,
            owner: [3; 16],
        },
        Message::Register {
            name: "n".repeat(MAX_NAME),
            addr: addr(),
            lease_ms: 0,
            owner: [0xff; 16],
        },
        Message::Lookup {
            name: "ünïcödé".into(),
        },
        Message::Unregister {
            name: "x".into(),
            owner: [4; 16],
        },
        Message::Ping,
        Message::Registered { lease_ms: 1234 },
        Message::Found {
            addr: addr(),
            lease_left_ms: 99,
        },
        Message::Done,
        Message::Error {
            code: ErrorCode::NotFound,
            text: "no live entry named \"b\"".into(),
        },
        Message::Error {
            code: ErrorCode::Other(200),
            text: String::new(),
        },
    ]
}

fn frame(msg: &Message) -> Vec<u8> {
    let mut out = Vec::new();
    encode(msg, &mut out).unwrap();
    out
}

#[test]
fn every_message_round_trips() {
    for m in samples() {
        let bytes = frame(&m);
        let (body, used) = split_frame(&bytes).unwrap().unwrap();
        assert_eq!(used, bytes.len(), "{m}");
        assert_eq!(body[0], VERSION);
        assert_eq!(decode_body(body).unwrap(), m);
    }
}

#[test]
fn every_truncation_is_incomplete_or_short() {
    for m in samples() {
        let bytes = frame(&m);
        for cut in 0..bytes.len() {
            assert_eq!(split_frame(&bytes[..cut]), Ok(None), "{m} cut at {cut}");
        }
        let body = &bytes[LEN_PREFIX..];
        for cut in 0..body.len() {
            assert!(
                matches!(decode_body(&body[..cut]), Err(DecodeError::Short { .. })),
                "{m} body cut at {cut}"
            );
        }
    }
}

#[test]
fn frames_follow_each_other() {
    let mut stream = Vec::new();
    for m in samples() {
        encode(&m, &mut stream).unwrap();
    }
    let mut rest = &stream[..];
    let mut got = Vec::new();
    while let Some((body, used)) = split_frame(rest).unwrap() {
        got.push(decode_body(body).unwrap());
        rest = &rest[used..];
    }
    assert_eq!(got, samples());
    assert!(rest.is_empty());
}

#[test]
fn limits_are_enforced_on_both_sides() {
    // Oversized frames are refused from the prefix alone.
    let big = ((MAX_FRAME + 1) as u32).to_be_bytes();
    assert_eq!(
        split_frame(&big),
        Err(DecodeError::FrameSize {
            len: MAX_FRAME as u32 + 1
        })
    );
    assert_eq!(
        split_frame(&u32::MAX.to_be_bytes()).unwrap_err().code(),
        ErrorCode::TooLarge
    );
    assert!(
        split_frame(&1u32.to_be_bytes()).is_err(),
        "no room for version and op"
    );
    // Names: the encoder refuses, the decoder refuses a crafted one.
    let long = "n".repeat(MAX_NAME + 1);
    let mut out = vec![7];
    assert_eq!(
        encode(&Message::Lookup { name: long.clone() }, &mut out),
        Err(EncodeError::Name { len: MAX_NAME + 1 })
    );
    assert_eq!(
        out,
        vec![7],
        "a refused message leaves the buffer as it was"
    );
    assert!(encode(
        &Message::Lookup {
            name: String::new()
        },
        &mut out
    )
    .is_err());
    let mut body = vec![VERSION, 0x04];
    body.extend_from_slice(&((MAX_NAME + 1) as u16).to_be_bytes());
    body.extend_from_slice(long.as_bytes());
    let e = decode_body(&body).unwrap_err();
    assert_eq!(e, DecodeError::NameTooLong { len: MAX_NAME + 1 });
    assert_eq!(e.code(), ErrorCode::NameTooLong);
    assert_eq!(
        decode_body(&[VERSION, 0x04, 0, 0]),
        Err(DecodeError::EmptyName)
    );
    // Error text is cut at the limit, on a character boundary.
    let text = "é".repeat(MAX_TEXT);
    let m = Message::Error {
        code: ErrorCode::BadRequest,
        text,
    };
    let bytes = frame(&m);
    match decode_body(split_frame(&bytes).unwrap().unwrap().0).unwrap() {
        Message::Error { text, .. } => assert_eq!(text, "é".repeat(MAX_TEXT / 2)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn bad_bodies_say_what_is_wrong() {
    assert_eq!(
        decode_body(&[VERSION, 0x42]),
        Err(DecodeError::UnknownOp(0x42))
    );
    assert_eq!(
        decode_body(&[VERSION, 0x42]).unwrap_err().code(),
        ErrorCode::UnknownOp
    );
    assert_eq!(
        decode_body(&[VERSION + 1, 0x06]),
        Err(DecodeError::Version { got: VERSION + 1 })
    );
    assert_eq!(
        decode_body(&[VERSION, 0x06, 0]),
        Err(DecodeError::Trailing(1))
    );
    let mut hello = frame(&Message::Hello { nonce: [0; 32] });
    hello[LEN_PREFIX + 2] = b'X';
    assert_eq!(
        decode_body(&hello[LEN_PREFIX..]),
        Err(DecodeError::BadMagic)
    );
    let mut reg = frame(&Message::Register {
        name: "a".into(),
        addr: addr(),
        lease_ms: 0,
        owner: [0; 16],
    });
    // The QPN's top byte: version, op, name len (2) + "a", GID (16).
    let qpn_at = LEN_PREFIX + 2 + 3 + 16;
    reg[qpn_at] = 1;
    assert!(matches!(
        decode_body(&reg[LEN_PREFIX..]),
        Err(DecodeError::BadQpn(_))
    ));
    let mut name = frame(&Message::Lookup { name: "ab".into() });
    let n = name.len();
    name[n - 1] = 0xff;
    assert_eq!(
        decode_body(&name[LEN_PREFIX..]),
        Err(DecodeError::BadText("the name"))
    );
    for code in 0..=255u8 {
        assert_eq!(ErrorCode::from_u8(code).to_u8(), code);
    }
}

proptest! {
    #[test]
    fn arbitrary_bodies_never_panic(body in proptest::collection::vec(any::<u8>(), 0..600)) {
        let _ = decode_body(&body);
    }

    #[test]
    fn arbitrary_streams_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2000)) {
        let mut rest = &bytes[..];
        while let Ok(Some((body, used))) = split_frame(rest) {
            prop_assert!(used <= LEN_PREFIX + MAX_FRAME);
            let _ = decode_body(body);
            rest = &rest[used..];
        }
    }

    #[test]
    fn valid_messages_with_flipped_bytes_never_panic(
        which in 0usize..14, at in any::<usize>(), to in any::<u8>()
    ) {
        let m = &samples()[which];
        let mut bytes = frame(m);
        let i = at % bytes.len();
        bytes[i] = to;
        if let Ok(Some((body, _))) = split_frame(&bytes) {
            let _ = decode_body(body);
        }
    }

    #[test]
    fn registrations_round_trip(
        name in "[a-z0-9._-]{1,255}", gid in any::<[u8; 16]>(), qpn in 0u32..=0xff_ffff,
        qkey in any::<u32>(), lease in any::<u32>(), owner in any::<[u8; 16]>()
    ) {
        let m = Message::Register {
            name, addr: Addr { gid: Gid(gid), qpn, qkey }, lease_ms: lease, owner,
        };
        let bytes = frame(&m);
        let (body, _) = split_frame(&bytes).unwrap().unwrap();
        prop_assert_eq!(decode_body(body).unwrap(), m);
    }
}
