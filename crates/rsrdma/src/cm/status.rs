//! What an rdma_cm event's status means, in words.
//!
//! A status is 0 on success. A REJECTED event carries the transport's reject reason (on IB and
//! RoCE, the IB CM's `ib_cm_rej_reason`); the other failures carry a negative errno.

use super::event::CmEventType;
use std::fmt::Write;
use std::io;

/// The IB CM reject reasons (`enum ib_cm_rej_reason` in the kernel's `rdma/ib_cm.h`): value,
/// name, and what it means to the side that was rejected.
const REJECT_REASONS: &[(i32, &str, &str)] = &[
    (1, "NO_QP", "the peer has no QP for the connection"),
    (2, "NO_EEC", "the peer has no end-to-end context"),
    (3, "NO_RESOURCES", "the peer is out of resources"),
    (
        4,
        "TIMEOUT",
        "the peer's CM timed out waiting for this side",
    ),
    (5, "UNSUPPORTED", "the peer does not support the request"),
    (
        6,
        "INVALID_COMM_ID",
        "the peer does not know this connection",
    ),
    (
        7,
        "INVALID_COMM_INSTANCE",
        "the peer does not know this connection instance",
    ),
    (
        8,
        "INVALID_SERVICE_ID",
        "no listener on that address and port (invalid service ID)",
    ),
    (
        9,
        "INVALID_TRANSPORT_TYPE",
        "the peer does not support this transport type",
    ),
    (
        10,
        "STALE_CONN",
        "the peer still holds an old connection with this QP",
    ),
    (
        11,
        "RDC_NOT_EXIST",
        "the peer has no such reliable datagram channel",
    ),
    (12, "INVALID_GID", "the peer does not accept this GID"),
    (13, "INVALID_LID", "the peer does not accept this LID"),
    (
        14,
        "INVALID_SL",
        "the peer does not accept this service level",
    ),
    (
        15,
        "INVALID_TRAFFIC_CLASS",
        "the peer does not accept this traffic class",
    ),
    (
        16,
        "INVALID_HOP_LIMIT",
        "the peer does not accept this hop limit",
    ),
    (
        17,
        "INVALID_PACKET_RATE",
        "the peer does not accept this packet rate",
    ),
    (
        18,
        "INVALID_ALT_GID",
        "the peer does not accept the alternate path's GID",
    ),
    (
        19,
        "INVALID_ALT_LID",
        "the peer does not accept the alternate path's LID",
    ),
    (
        20,
        "INVALID_ALT_SL",
        "the peer does not accept the alternate path's SL",
    ),
    (
        21,
        "INVALID_ALT_TRAFFIC_CLASS",
        "the peer does not accept the alternate path's traffic class",
    ),
    (
        22,
        "INVALID_ALT_HOP_LIMIT",
        "the peer does not accept the alternate path's hop limit",
    ),
    (
        23,
        "INVALID_ALT_PACKET_RATE",
        "the peer does not accept the alternate path's packet rate",
    ),
    (
        24,
        "PORT_CM_REDIRECT",
        "the peer redirects to another CM port",
    ),
    (25, "PORT_REDIRECT", "the peer redirects to another port"),
    (26, "INVALID_MTU", "the peer does not accept this path MTU"),
    (
        27,
        "INSUFFICIENT_RESP_RESOURCES",
        "the peer cannot serve that many RDMA reads/atomics (lower initiator_depth)",
    ),
    (
        28,
        "CONSUMER_DEFINED",
        "consumer reject: the peer's application refused the connection (rdma_reject)",
    ),
    (
        29,
        "INVALID_RNR_RETRY",
        "the peer does not accept this RNR retry count",
    ),
    (
        30,
        "DUPLICATE_LOCAL_COMM_ID",
        "the peer already has a connection with this id",
    ),
    (
        31,
        "INVALID_CLASS_VERSION",
        "the peer does not speak this CM version",
    ),
    (
        32,
        "INVALID_FLOW_LABEL",
        "the peer does not accept this flow label",
    ),
    (
        33,
        "INVALID_ALT_FLOW_LABEL",
        "the peer does not accept the alternate flow label",
    ),
    (
        35,
        "VENDOR_OPTION_NOT_SUPPORTED",
        "the peer does not support a vendor option",
    ),
];

/// The meaning of an IB CM reject reason (the status of a REJECTED event on IB and RoCE), and
/// its name in the kernel's `ib_cm_rej_reason` without the `IB_CM_REJ_` prefix. `None` for a
/// value the IB CM does not define (iWARP reports a negative errno instead).
///
/// ```
/// let (name, meaning) = rsrdma::cm::reject_reason(8).unwrap();
/// assert_eq!(name, "INVALID_SERVICE_ID");
/// assert!(meaning.contains("no listener"));
/// ```
pub fn reject_reason(reason: i32) -> Option<(&'static str, &'static str)> {
    REJECT_REASONS
        .iter()
        .find(|(v, _, _)| *v == reason)
        .map(|&(_, name, meaning)| (name, meaning))
}

/// What a negative errno means for the event that carried it, where rdma_cm gives it a
/// meaning of its own.
fn errno_meaning(kind: CmEventType, errno: i32) -> Option<&'static str> {
    Some(match (kind, errno) {
        (CmEventType::UNREACHABLE, libc::ETIMEDOUT) => {
            "the peer did not answer the connect request in time (is it up, and is the address right?)"
        }
        (CmEventType::UNREACHABLE, libc::EHOSTUNREACH) => {
            "the peer's RDMA device cannot be reached from this host at that address (soft0: \
             a listener whose device is on loopback, without RSRDMA_SOFT_ADDR, serves its own \
             host only)"
        }
        (CmEventType::UNREACHABLE, _) => "the peer cannot be reached",
        (CmEventType::ADDR_ERROR, libc::ETIMEDOUT) => {
            "address resolution timed out: nothing answered for that IP address (ARP/neighbour discovery)"
        }
        (CmEventType::ADDR_ERROR, libc::ENETUNREACH | libc::EHOSTUNREACH) => {
            "no route to that IP address"
        }
        (CmEventType::ADDR_ERROR, libc::ENODEV | libc::EADDRNOTAVAIL) => {
            "no RDMA device serves that address"
        }
        (CmEventType::ROUTE_ERROR, libc::ETIMEDOUT) => "route resolution timed out",
        (CmEventType::ROUTE_ERROR, libc::ENODEV) => {
            "no RDMA device on that route (over soft-RoCE, 127.0.0.1 has none: use the device's IP)"
        }
        (CmEventType::ROUTE_ERROR, _) => "route resolution failed",
        (CmEventType::CONNECT_ERROR, _) => "the connection could not be set up",
        _ => return None,
    })
}

/// An event's status in words, e.g. `status 8: no listener on that address and port (invalid
/// service ID) (IB CM reject reason INVALID_SERVICE_ID)`; `None` for status 0.
pub fn describe_status(kind: CmEventType, status: i32) -> Option<String> {
    if status == 0 {
        return None;
    }
    let mut text = format!("status {status}");
    if kind == CmEventType::REJECTED && status > 0 {
        match reject_reason(status) {
            Some((name, meaning)) => {
                let _ = write!(text, ": {meaning} (IB CM reject reason {name})");
            }
            None => text.push_str(": a reject reason the IB CM does not define"),
        }
    } else if let Some(errno) = status.checked_neg().filter(|e| *e > 0) {
        let os = io::Error::from_raw_os_error(errno);
        match errno_meaning(kind, errno) {
            Some(meaning) => {
                let _ = write!(text, ": {meaning} ({os})");
            }
            None => {
                let _ = write!(text, ": {os}");
            }
        }
    }
    Some(text)
}

/// How many bytes of private data an error message shows.
const SHOWN_PRIVATE_DATA: usize = 32;

/// A failed wait's event in words: its status and, for a rejection, the private data the peer
/// sent with it (as hex, trailing zero padding left out).
pub(crate) fn explain(kind: CmEventType, status: i32, private_data: &[u8]) -> String {
    let mut text = describe_status(kind, status).unwrap_or_else(|| "status 0".into());
    let used = private_data
        .iter()
        .rposition(|&b| b != 0)
        .map_or(0, |last| last + 1);
    if kind == CmEventType::REJECTED && used > 0 {
        let _ = write!(
            text,
            "; the peer's private data ({} bytes, {used} before the zero padding): ",
            private_data.len()
        );
        for b in &private_data[..used.min(SHOWN_PRIVATE_DATA)] {
            let _ = write!(text, "{b:02x}");
        }
        if used > SHOWN_PRIVATE_DATA {
            text.push('…');
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reject_reasons_say_what_they_mean() {
        let no_listener = describe_status(CmEventType::REJECTED, 8).unwrap();
        assert_eq!(
            no_listener,
            "status 8: no listener on that address and port (invalid service ID) \
             (IB CM reject reason INVALID_SERVICE_ID)"
        );
        let refused = describe_status(CmEventType::REJECTED, 28).unwrap();
        assert!(refused.contains("consumer reject"), "{refused}");
        assert!(refused.contains("rdma_reject"), "{refused}");
        for (reason, word) in [
            (1, "no QP"),
            (3, "resources"),
            (4, "timed out"),
            (10, "old"),
        ] {
            let text = describe_status(CmEventType::REJECTED, reason).unwrap();
            assert!(text.contains(word), "{reason}: {text}");
        }
        assert_eq!(reject_reason(34), None);
        assert!(describe_status(CmEventType::REJECTED, 34)
            .unwrap()
            .contains("does not define"));
        assert_eq!(describe_status(CmEventType::REJECTED, 0), None);
    }

    #[test]
    fn every_reject_reason_is_listed_once() {
        let mut values: Vec<i32> = REJECT_REASONS.iter().map(|r| r.0).collect();
        values.dedup();
        assert_eq!(values.len(), REJECT_REASONS.len());
        assert_eq!(values, (1..=33).chain([35]).collect::<Vec<_>>());
    }

    #[test]
    fn negative_statuses_are_errnos_in_words() {
        let t = describe_status(CmEventType::UNREACHABLE, -libc::ETIMEDOUT).unwrap();
        assert!(t.starts_with("status -110: the peer did not answer"), "{t}");
        assert!(t.contains("timed out"), "{t}");
        let t = describe_status(CmEventType::ADDR_ERROR, -libc::ETIMEDOUT).unwrap();
        assert!(t.contains("address resolution timed out"), "{t}");
        let t = describe_status(CmEventType::ADDR_ERROR, -libc::ENETUNREACH).unwrap();
        assert!(t.contains("no route"), "{t}");
        let t = describe_status(CmEventType::ROUTE_ERROR, -libc::ENODEV).unwrap();
        assert!(t.contains("127.0.0.1"), "{t}");
        // An errno without a meaning of its own is still spelled out.
        let t = describe_status(CmEventType::DISCONNECTED, -libc::ECONNRESET).unwrap();
        assert!(t.starts_with("status -104: "), "{t}");
        assert!(t.len() > "status -104: ".len(), "{t}");
    }

    #[test]
    fn rejections_show_the_peers_private_data() {
        let mut data = vec![0u8; 148];
        data[..4].copy_from_slice(b"busy");
        let t = explain(CmEventType::REJECTED, 28, &data);
        assert!(t.contains("consumer reject"), "{t}");
        assert!(
            t.ends_with("the peer's private data (148 bytes, 4 before the zero padding): 62757379"),
            "{t}"
        );
        // All padding: nothing to show.
        let t = explain(CmEventType::REJECTED, 8, &[0; 148]);
        assert!(!t.contains("private data"), "{t}");
        // Long data is cut.
        let t = explain(CmEventType::REJECTED, 28, &[0xab; 148]);
        assert!(t.ends_with(&format!("{}…", "ab".repeat(32))), "{t}");
        // Other events' data is not shown.
        let t = explain(CmEventType::ESTABLISHED, 0, b"hello");
        assert_eq!(t, "status 0");
    }
}
