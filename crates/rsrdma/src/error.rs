//! The crate's one error type.
//!
//! Every variant that comes from a failed verb names the verb and the errno it returned, so a
//! log line says what failed and why without a debugger.

use crate::wc::{WcOpcode, WcStatus};
use std::io;

/// Result alias used throughout rsrdma.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The hint printed with [`Error::Unsupported`]: where to get an RDMA stack when this machine
/// has none.
pub const NO_RDMA_HINT: &str = "no RDMA stack on this machine; use the software device soft0 \
                                (RSRDMA_SOFT_DEVICE=1, device \"soft0\"), or run inside a \
                                soft-RoCE VM with `cargo xtask vm -- <command>`";

/// The private data of an rdma_cm event: the bytes as they came (dereferences to them). Its
/// `Debug` shows the bytes up to the zero padding the CM adds (a REJECTED event carries up to
/// 148 bytes, mostly zeros) and how long the whole was, so an error printed by
/// `fn main() -> Result<..>` stays readable.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct PrivateData(pub Vec<u8>);

impl std::ops::Deref for PrivateData {
    type Target = Vec<u8>;

    fn deref(&self) -> &Vec<u8> {
        &self.0
    }
}

impl std::fmt::Debug for PrivateData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let end = self.0.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        write!(f, "PrivateData({} B: b\"", self.0.len())?;
        for &b in &self.0[..end] {
            write!(f, "{}", std::ascii::escape_default(b))?;
        }
        match self.0.len() - end {
            0 => write!(f, "\")"),
            pad => write!(f, "\" + {pad} zero bytes)"),
        }
    }
}

/// What `errno` means, without the standard library's " (os error N)": the messages say
/// "(errno N)" themselves (they said both: "Cannot allocate memory (os error 12) (errno 12)").
fn errno_text(errno: i32) -> String {
    let text = io::Error::from_raw_os_error(errno).to_string();
    match text.strip_suffix(&format!(" (os error {errno})")) {
        Some(bare) => bare.to_owned(),
        None => text,
    }
}

/// Everything that can go wrong in rsrdma.
///
/// Its `Debug` is the variant's name around its message (the `Display`), so that what
/// `fn main() -> rsrdma::Result<()>` prints says what failed and what to do (the hint of
/// [`Error::Unsupported`] included), as its message does.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A verb or rdma_cm call failed.
    #[error("{op} failed: {} (errno {errno})", errno_text(*.errno))]
    Verbs {
        /// The C function that failed.
        op: &'static str,
        /// The errno it reported.
        errno: i32,
    },

    /// ENOSYS, ENODEV or EOPNOTSUPP: either the machine has no RDMA stack at all (then the
    /// message points to `cargo xtask vm`), or the device or its provider lacks what was
    /// asked (then the message says so, without the hint).
    #[error("{op}: {}", unsupported_text(*.errno, *.no_stack))]
    Unsupported {
        /// The call that reported it.
        op: &'static str,
        /// ENOSYS, ENODEV or EOPNOTSUPP.
        errno: i32,
        /// True when the machine has no RDMA stack (no `/sys/class/infiniband` devices).
        no_stack: bool,
    },

    /// No device of that name.
    #[error("no RDMA device named {name:?} (found: {available})")]
    NoDevice {
        /// The name asked for.
        name: String,
        /// The devices that exist, comma-separated (empty when none).
        available: String,
    },

    /// An option is beyond what the device (or the verbs API) allows. Raised before any verb
    /// is called.
    #[error("{what} = {requested} exceeds the limit {limit} ({source_of_limit})")]
    Limit {
        /// The option.
        what: &'static str,
        /// What was asked for.
        requested: u64,
        /// The most allowed.
        limit: u64,
        /// Where the limit comes from, e.g. "device max_qp_wr".
        source_of_limit: &'static str,
    },

    /// An argument that can never be valid (zero length, index out of range, …).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// A queue-pair state change that the verbs state machine does not allow.
    #[error("queue pair {qp_num}: cannot move from {from} to {to}")]
    InvalidTransition {
        /// The QP number.
        qp_num: u32,
        /// The current state.
        from: crate::qp::QpState,
        /// The requested state.
        to: crate::qp::QpState,
    },

    /// A work completion that did not succeed.
    #[error(
        "work request {wr_id} ({opcode}) completed with {status} (vendor error {vendor_err:#x})"
    )]
    WorkCompletion {
        /// The completion's status.
        status: WcStatus,
        /// The work request's id.
        wr_id: u64,
        /// The completion's opcode (only meaningful for some statuses).
        opcode: WcOpcode,
        /// The provider's own error code.
        vendor_err: u32,
    },

    /// A posting call rejected one work request of a list; those before it were posted.
    #[error("{op} rejected work request #{index} (of {count}): {} (errno {errno})", errno_text(*.errno))]
    Post {
        /// `ibv_post_send`, `ibv_post_recv` or `ibv_post_srq_recv`.
        op: &'static str,
        /// Index of the first rejected work request; the ones before it were posted.
        index: usize,
        /// How many were in the list.
        count: usize,
        /// The errno the provider returned.
        errno: i32,
    },

    /// An rdma_cm event other than the one expected arrived. The message says what its
    /// status means (e.g. REJECTED with status 8: no listener on that address and port).
    #[error("{op}: expected {expected}, got {got} ({})", crate::cm::explain_status(*got, *status, private_data))]
    CmEvent {
        /// The operation waiting for the event.
        op: &'static str,
        /// The event it waited for.
        expected: crate::cm::CmEventType,
        /// The event that came.
        got: crate::cm::CmEventType,
        /// The event's status field (a negative errno or a reject reason).
        status: i32,
        /// The private data that came with it (for REJECTED: the peer's, zero-padded).
        private_data: PrivateData,
    },

    /// A wait ran out of time.
    #[error("{op} timed out after {millis} ms")]
    Timeout {
        /// What was waited for.
        op: &'static str,
        /// The time limit.
        millis: u64,
    },
}

impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self {
            Error::Verbs { .. } => "Verbs",
            Error::Unsupported { .. } => "Unsupported",
            Error::NoDevice { .. } => "NoDevice",
            Error::Limit { .. } => "Limit",
            Error::InvalidArgument(_) => "InvalidArgument",
            Error::InvalidTransition { .. } => "InvalidTransition",
            Error::WorkCompletion { .. } => "WorkCompletion",
            Error::Post { .. } => "Post",
            Error::CmEvent { .. } => "CmEvent",
            Error::Timeout { .. } => "Timeout",
        };
        write!(f, "{name}(\"{self}\")")
    }
}

impl Error {
    /// The error for a verb that failed with `errno`; ENOSYS/ENODEV/EOPNOTSUPP become
    /// [`Error::Unsupported`].
    pub fn from_errno(op: &'static str, errno: i32) -> Self {
        match errno {
            libc::ENOSYS | libc::ENODEV | libc::EOPNOTSUPP => Error::Unsupported {
                op,
                errno,
                // The soft device refuses what it lacks with EOPNOTSUPP: a device's answer, not
                // a missing stack.
                no_stack: !(rdma_stack_present()
                    || (errno == libc::EOPNOTSUPP && crate::soft::opened())),
            },
            _ => Error::Verbs { op, errno },
        }
    }

    /// The error for a verb that just failed and left its reason in `errno`. Must be called
    /// right after the failing call, on the same thread.
    pub(crate) fn last_os(op: &'static str) -> Self {
        let errno = io::Error::last_os_error().raw_os_error().unwrap_or(0);
        // A verb that fails without setting errno still failed; EIO says so without lying
        // about a cause.
        Self::from_errno(op, if errno == 0 { libc::EIO } else { errno })
    }

    /// The errno behind this error, where there is one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Verbs { errno, .. }
            | Error::Unsupported { errno, .. }
            | Error::Post { errno, .. } => Some(*errno),
            _ => None,
        }
    }

    /// True when the machine has no RDMA stack or the provider lacks the operation.
    pub fn is_unsupported(&self) -> bool {
        matches!(self, Error::Unsupported { .. })
    }
}

/// What an [`Error::Unsupported`] says: the VM hint only where there is no RDMA stack.
fn unsupported_text(errno: i32, no_stack: bool) -> String {
    if no_stack {
        return format!("RDMA is not supported here (errno {errno}); {NO_RDMA_HINT}");
    }
    let what = match errno {
        libc::ENODEV => "no such device, or the device cannot do this (for rdma_cm: no RDMA device serves that address or route)",
        libc::EOPNOTSUPP => "the device or its provider does not support this operation",
        libc::ENOSYS => "the provider does not implement this verb",
        _ => "not supported",
    };
    format!(
        "{what} ({}, errno {errno})",
        io::Error::from_raw_os_error(errno)
    )
}

/// True when the kernel has an RDMA stack with at least one device: the VM hint is useful
/// only where this is false. Checked once.
pub(crate) fn rdma_stack_present() -> bool {
    static PRESENT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *PRESENT.get_or_init(|| {
        std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some())
    })
}

/// The instant `timeout` from now, clamped far into the future instead of overflowing, so a
/// caller may pass `Duration::MAX` for "no limit".
pub(crate) fn deadline_after(timeout: std::time::Duration) -> std::time::Instant {
    let now = std::time::Instant::now();
    now.checked_add(timeout)
        .or_else(|| now.checked_add(std::time::Duration::from_secs(100 * 365 * 86_400)))
        .unwrap_or(now)
}

/// `poll(2)`'s timeout for a wait until `deadline` (`-1`: none), rounded up so that a
/// sub-millisecond remainder still waits; `None` once the deadline has passed.
pub(crate) fn poll_timeout_ms(deadline: Option<std::time::Instant>) -> Option<i32> {
    let Some(d) = deadline else {
        return Some(-1);
    };
    let left = d.saturating_duration_since(std::time::Instant::now());
    if left.is_zero() {
        return None;
    }
    Some(left.as_millis().saturating_add(1).min(i32::MAX as u128) as i32)
}

/// A verb's return code: 0 is success, anything else an errno value (the convention of
/// `ibv_modify_qp`, `ibv_post_send` and most destroy calls).
pub(crate) fn check_rc(op: &'static str, rc: i32) -> Result<()> {
    match rc {
        0 => Ok(()),
        // Some verbs return -1 and set errno instead of returning it.
        -1 => Err(Error::last_os(op)),
        rc if rc < 0 => Err(Error::from_errno(op, -rc)),
        rc => Err(Error::from_errno(op, rc)),
    }
}

/// The result of a posting call: `rc` is its return code (0 or an errno value, negated by
/// some providers); `index` the first request not posted, of `count`.
pub(crate) fn check_post(op: &'static str, rc: i32, index: usize, count: usize) -> Result<()> {
    if rc == 0 {
        return Ok(());
    }
    Err(Error::Post {
        op,
        index,
        count,
        errno: rc.abs(),
    })
}

impl From<Error> for io::Error {
    fn from(e: Error) -> Self {
        let kind = match &e {
            Error::Timeout { .. } => io::ErrorKind::TimedOut,
            Error::InvalidArgument(_) | Error::Limit { .. } => io::ErrorKind::InvalidInput,
            Error::NoDevice { .. } => io::ErrorKind::NotFound,
            Error::Unsupported { .. } => io::ErrorKind::Unsupported,
            _ => match e.errno() {
                Some(errno) => io::Error::from_raw_os_error(errno).kind(),
                None => io::ErrorKind::Other,
            },
        };
        io::Error::new(kind, e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_errno_is_named_once() {
        let e = Error::from_errno("ibv_reg_mr", libc::ENOMEM);
        assert_eq!(
            e.to_string(),
            "ibv_reg_mr failed: Cannot allocate memory (errno 12)"
        );
        let e = Error::Post {
            op: "ibv_post_send",
            index: 3,
            count: 4,
            errno: libc::EINVAL,
        };
        assert_eq!(
            e.to_string(),
            "ibv_post_send rejected work request #3 (of 4): Invalid argument (errno 22)"
        );
    }

    #[test]
    fn unsupported_gives_the_vm_hint_only_without_a_stack() {
        for errno in [libc::ENOSYS, libc::ENODEV, libc::EOPNOTSUPP] {
            let e = Error::from_errno("ibv_get_device_list", errno);
            assert!(e.is_unsupported());
            let text = e.to_string();
            assert!(text.contains("ibv_get_device_list"), "{text}");
            // This host's kernel has no RDMA (CI and development machines); in the VM the
            // stack is there and the hint must not appear.
            assert_eq!(
                text.contains("cargo xtask vm"),
                !rdma_stack_present(),
                "{text}"
            );
            let with_stack = Error::Unsupported {
                op: "ibv_alloc_mw",
                errno,
                no_stack: false,
            }
            .to_string();
            assert!(!with_stack.contains("cargo xtask vm"), "{with_stack}");
            assert!(
                with_stack.contains(&format!("errno {errno}")),
                "{with_stack}"
            );
        }
        let text = Error::Unsupported {
            op: "ibv_alloc_mw",
            errno: libc::EOPNOTSUPP,
            no_stack: false,
        }
        .to_string();
        assert!(text.contains("does not support this operation"), "{text}");
    }

    #[test]
    fn verb_errors_name_the_call_and_errno() {
        let e = Error::from_errno("ibv_create_qp", libc::EINVAL);
        let text = e.to_string();
        assert!(
            text.contains("ibv_create_qp") && text.contains("errno 22"),
            "{text}"
        );
        assert_eq!(e.errno(), Some(libc::EINVAL));
    }

    #[test]
    fn return_codes() {
        assert!(check_rc("x", 0).is_ok());
        assert_eq!(
            check_rc("x", libc::ENOMEM).unwrap_err().errno(),
            Some(libc::ENOMEM)
        );
        assert_eq!(
            check_rc("x", -libc::EAGAIN).unwrap_err().errno(),
            Some(libc::EAGAIN)
        );
    }

    #[test]
    fn io_error_kinds() {
        let io: io::Error = Error::Timeout {
            op: "wait",
            millis: 5,
        }
        .into();
        assert_eq!(io.kind(), io::ErrorKind::TimedOut);
        let io: io::Error = Error::from_errno("x", libc::ENOSYS).into();
        assert_eq!(io.kind(), io::ErrorKind::Unsupported);
    }
}

#[cfg(test)]
mod private_data_tests {
    use super::{Error, PrivateData};

    #[test]
    fn debug_of_a_rejection_shows_its_text_not_its_padding() {
        let mut bytes = b"rsrdma:no\x01".to_vec();
        bytes.resize(148, 0);
        let e = Error::CmEvent {
            op: "connect",
            expected: crate::cm::CmEventType::ESTABLISHED,
            got: crate::cm::CmEventType::REJECTED,
            status: 8,
            private_data: PrivateData(bytes),
        };
        let d = format!("{e:?}");
        assert!(d.starts_with("CmEvent(\"connect: expected"), "{d}");
        assert!(!d.contains("0, 0, 0"), "{d}");
        let Error::CmEvent { private_data, .. } = &e else {
            unreachable!()
        };
        assert_eq!(
            format!("{private_data:?}"),
            r#"PrivateData(148 B: b"rsrdma:no\x01" + 138 zero bytes)"#
        );
        assert_eq!(
            format!("{:?}", PrivateData(vec![])),
            r#"PrivateData(0 B: b"")"#
        );
    }

    /// What `fn main() -> rsrdma::Result<()>` prints (the `Debug`) says what the message
    /// says: without an RDMA stack, the hint (an outside tester's find: the guide's first
    /// program printed only `Unsupported { op: .., errno: 38, no_stack: true }`).
    #[test]
    fn debug_carries_the_message_and_its_hint() {
        let e = Error::Unsupported {
            op: "ibv_get_device_list",
            errno: libc::ENOSYS,
            no_stack: true,
        };
        let d = format!("{e:?}");
        assert!(d.starts_with("Unsupported(\"ibv_get_device_list"), "{d}");
        assert!(d.contains(super::NO_RDMA_HINT), "{d}");
    }
}
