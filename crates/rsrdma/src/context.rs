//! An open device: its attributes, ports and GID table.

use crate::device::Device;
use crate::error::{check_rc, Error, Result};
use crate::ffi;
use std::ffi::CStr;
use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

/// An open RDMA device (`ibv_context`). Cheap to clone; every object made from it keeps it
/// open, so it is closed only after the last of them is gone.
#[derive(Clone)]
pub struct Context {
    pub(crate) inner: Arc<ContextInner>,
}

pub(crate) struct ContextInner {
    pub(crate) raw: *mut ffi::ibv_context,
    owner: Owner,
    attr: DeviceAttr,
    name: String,
    /// The largest inline size a QP of each type (RC, UC, UD) can get, probed on first need:
    /// the verbs API has no device attribute for it.
    pub(crate) inline_limits: [std::sync::OnceLock<u32>; 3],
    /// The asynchronous event fd was made non-blocking ([`Context::read_async_event`]).
    pub(crate) async_nonblocking: std::sync::atomic::AtomicBool,
}

// SAFETY: libibverbs contexts are thread-safe; the Rust side only reads the cached attributes.
unsafe impl Send for ContextInner {}
// SAFETY: as above.
unsafe impl Sync for ContextInner {}

/// Who closes a context.
pub(crate) enum Owner {
    /// We opened it: closed when the last handle drops.
    Us,
    /// librdmacm opened it and closes it; the guard holds librdmacm's reference on it and is
    /// released (after the last handle drops) by dropping it.
    Cm { _guard: Box<dyn Send + Sync> },
}

impl Drop for ContextInner {
    fn drop(&mut self) {
        // A librdmacm guard in `owner` is released after this, with the other fields.
        if let Owner::Us = self.owner {
            // SAFETY: we opened this context, and every object made from it holds an Arc to
            // this inner, so none is left when it drops.
            let rc = unsafe { ffi::ibv_close_device(self.raw) };
            if rc != 0 {
                tracing::warn!(device = %self.name, rc, "ibv_close_device failed");
            }
        }
    }
}

impl Context {
    /// Whether `other` is this context (the same open device, not only the same device):
    /// objects of one context may be used only with objects of the same context.
    pub(crate) fn is(&self, other: &Context) -> bool {
        std::ptr::eq(self.inner.raw, other.inner.raw)
    }

    /// Opens `device`.
    ///
    /// # Errors
    /// [`Error::Verbs`] naming `ibv_open_device` or `ibv_query_device`.
    ///
    /// `Qp`, `Cq` and `Srq` are `Sync` because providers lock around posting and polling.
    /// `MLX5_SINGLE_THREADED=1` turns those locks off; with it set, share each of them with
    /// one thread at a time (or under your own lock). A warning is logged when it is set.
    pub fn open(device: &Device<'_>) -> Result<Context> {
        if std::env::var_os("MLX5_SINGLE_THREADED").is_some_and(|v| v != "0") {
            tracing::warn!(
                "MLX5_SINGLE_THREADED is set: the provider does not lock queues, so a Qp, Cq \
                 or Srq shared between threads needs the caller's own lock"
            );
        }
        // SAFETY: the device pointer is valid for the list's lifetime, which `device` borrows.
        let raw = unsafe { ffi::ibv_open_device(device.as_ptr()) };
        if raw.is_null() {
            let os = Error::last_os("ibv_open_device");
            if crate::soft::is_device(device.as_ptr()) {
                // Why soft0 refuses to open, naming the variable at fault: its faults do not
                // parse, its address does not, or it cannot listen there.
                if let Err(e) = crate::soft::faults::from_env() {
                    return Err(Error::InvalidArgument(format!("soft0: {e}")));
                }
                if let Err(e) = crate::soft::verbs::configured_addr() {
                    return Err(Error::InvalidArgument(format!("soft0: {e}")));
                }
                let addr = std::env::var_os(crate::soft::verbs::SOFT_ADDR_ENV);
                if let (Some(v), Some(libc::EADDRNOTAVAIL)) = (addr, os.errno()) {
                    return Err(Error::InvalidArgument(format!(
                        "soft0: it cannot listen where {}={:?} says (an address of this \
                         host, a port nobody else holds): {os}",
                        crate::soft::verbs::SOFT_ADDR_ENV,
                        v.to_string_lossy()
                    )));
                }
            }
            return Err(os);
        }
        // SAFETY: `raw` is a freshly opened context that this call owns.
        unsafe { Self::from_raw(raw, Owner::Us) }
    }

    /// Wraps a context.
    ///
    /// # Safety
    /// `raw` must be a valid open context. Owned by [`Owner::Us`], it is closed when the last
    /// handle drops; by [`Owner::Cm`], the guard must keep it open for as long as it lives.
    pub(crate) unsafe fn from_raw(raw: *mut ffi::ibv_context, owner: Owner) -> Result<Context> {
        let mut a = ffi::ibv_device_attr::default();
        // SAFETY: `raw` is valid (caller's contract); `a` is a valid out-pointer.
        let rc = unsafe { ffi::ibv_query_device(raw, &mut a) };
        // SAFETY: a valid context has a valid device pointer, whose name is NUL-terminated.
        let name = unsafe { CStr::from_ptr(ffi::ibv_get_device_name((*raw).device)) }
            .to_string_lossy()
            .into_owned();
        let inner = ContextInner {
            raw,
            owner,
            attr: DeviceAttr::from_raw(&a),
            name,
            inline_limits: Default::default(),
            async_nonblocking: Default::default(),
        };
        // Checked after building `inner`, so an owned context is closed on this error too.
        check_rc("ibv_query_device", rc)?;
        Ok(Context {
            inner: Arc::new(inner),
        })
    }

    /// Wraps a context of the bench's do-nothing provider ([`crate::bench_support`]).
    ///
    /// # Safety
    /// `raw` must stay valid while any handle lives, and no handle may ever be dropped (that
    /// would close a context no provider owns).
    #[cfg(feature = "bench-support")]
    pub(crate) unsafe fn wrap_fake(raw: *mut ffi::ibv_context, name: &str) -> Context {
        Context {
            inner: Arc::new(ContextInner {
                raw,
                owner: Owner::Us,
                attr: DeviceAttr::default(),
                name: name.to_owned(),
                inline_limits: Default::default(),
                async_nonblocking: Default::default(),
            }),
        }
    }

    /// The device's name (`rxe0`, `mlx5_0`).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The device's attributes, queried once when it was opened.
    pub fn attr(&self) -> &DeviceAttr {
        &self.inner.attr
    }

    /// Queries port `port` (numbered from 1).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a port the device does not have; [`Error::Verbs`] naming
    /// `ibv_query_port`.
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        self.check_port(port)?;
        let mut p = ffi::ibv_port_attr::default();
        // SAFETY: the context is open; `p` is a valid out-pointer. `___ibv_query_port` is the
        // inline that fills the extended fields (the exported symbol is the compat version).
        let rc = unsafe { ffi::___ibv_query_port(self.inner.raw, port, &mut p) };
        check_rc("ibv_query_port", rc)?;
        Ok(PortAttr::from_raw(&p))
    }

    /// The GID at `index` of port `port`, with its type and netdev.
    ///
    /// # Errors
    /// [`Error::Verbs`] naming `ibv_query_gid_ex` (ENODATA/EINVAL for an empty or absent entry).
    pub fn query_gid(&self, port: u8, index: u32) -> Result<GidEntry> {
        self.check_port(port)?;
        let mut e = ffi::ibv_gid_entry::default();
        // SAFETY: open context, valid out-pointer, flags must be 0.
        let rc = unsafe { ffi::ibv_query_gid_ex(self.inner.raw, port as u32, index, &mut e, 0) };
        check_rc("ibv_query_gid_ex", rc)?;
        Ok(GidEntry::from_raw(&e))
    }

    /// Every valid GID of every port, as `show_gids` lists them.
    ///
    /// # Errors
    /// [`Error::Verbs`] naming `ibv_query_gid_table`.
    pub fn gid_table(&self) -> Result<Vec<GidEntry>> {
        let mut max = 0usize;
        for port in 1..=self.attr().phys_port_cnt {
            max += self.query_port(port)?.gid_tbl_len as usize;
        }
        let mut entries = vec![ffi::ibv_gid_entry::default(); max.max(1)];
        // SAFETY: `entries` has room for `max` entries of the size passed; flags must be 0.
        let n = unsafe {
            ffi::ibv_query_gid_table(self.inner.raw, entries.as_mut_ptr(), entries.len(), 0)
        };
        if n < 0 {
            return Err(Error::from_errno("ibv_query_gid_table", (-n) as i32));
        }
        Ok(entries[..n as usize]
            .iter()
            .map(GidEntry::from_raw)
            .collect())
    }

    fn check_port(&self, port: u8) -> Result<()> {
        let ports = self.attr().phys_port_cnt;
        if port == 0 || port > ports {
            return Err(Error::InvalidArgument(format!(
                "port {port} does not exist on {} (ports are 1..={ports})",
                self.name()
            )));
        }
        Ok(())
    }

    /// The raw `ibv_context`, for calls rsrdma does not wrap. `None` for a provider that is
    /// not libibverbs.
    pub fn as_raw(&self) -> Option<*mut ffi::ibv_context> {
        Some(self.inner.raw)
    }
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("name", &self.inner.name)
            .finish_non_exhaustive()
    }
}

/// What a device can do (from `ibv_query_device`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceAttr {
    /// Firmware version string.
    pub fw_ver: String,
    /// Node GUID, host order.
    pub node_guid: u64,
    /// System image GUID, host order.
    pub sys_image_guid: u64,
    /// Largest memory region, bytes.
    pub max_mr_size: u64,
    /// Page sizes supported (bit mask).
    pub page_size_cap: u64,
    /// IEEE vendor id.
    pub vendor_id: u32,
    /// Vendor part id.
    pub vendor_part_id: u32,
    /// Hardware version.
    pub hw_ver: u32,
    /// Most queue pairs.
    pub max_qp: u32,
    /// Most work requests in one queue.
    pub max_qp_wr: u32,
    /// Device capability flags (`IBV_DEVICE_*`).
    pub device_cap_flags: u32,
    /// Most scatter/gather entries in a send or receive WR.
    pub max_sge: u32,
    /// Most scatter/gather entries in an RDMA read WR.
    pub max_sge_rd: u32,
    /// Most completion queues.
    pub max_cq: u32,
    /// Most entries in one completion queue.
    pub max_cqe: u32,
    /// Most memory regions.
    pub max_mr: u32,
    /// Most protection domains.
    pub max_pd: u32,
    /// Most outstanding RDMA reads/atomics a QP can be the target of (`max_dest_rd_atomic`).
    pub max_qp_rd_atom: u32,
    /// Most outstanding RDMA reads/atomics a QP can initiate (`max_rd_atomic`).
    pub max_qp_init_rd_atom: u32,
    /// Device-wide resources for incoming reads/atomics.
    pub max_res_rd_atom: u32,
    /// Atomic operation support.
    pub atomic_cap: AtomicCap,
    /// Most address handles.
    pub max_ah: u32,
    /// Most shared receive queues.
    pub max_srq: u32,
    /// Most work requests in one shared receive queue.
    pub max_srq_wr: u32,
    /// Most scatter/gather entries in a shared-receive-queue WR.
    pub max_srq_sge: u32,
    /// Most partition keys.
    pub max_pkeys: u16,
    /// Local CA ack delay.
    pub local_ca_ack_delay: u8,
    /// Number of physical ports.
    pub phys_port_cnt: u8,
}

impl DeviceAttr {
    fn from_raw(a: &ffi::ibv_device_attr) -> Self {
        let u = |v: i32| v.max(0) as u32;
        DeviceAttr {
            // A fixed array the library NUL-terminates; read no further than its size.
            fw_ver: {
                let bytes: Vec<u8> = a
                    .fw_ver
                    .iter()
                    .take_while(|&&c| c != 0)
                    .map(|&c| c as u8)
                    .collect();
                String::from_utf8_lossy(&bytes).into_owned()
            },
            node_guid: u64::from_be(a.node_guid),
            sys_image_guid: u64::from_be(a.sys_image_guid),
            max_mr_size: a.max_mr_size,
            page_size_cap: a.page_size_cap,
            vendor_id: a.vendor_id,
            vendor_part_id: a.vendor_part_id,
            hw_ver: a.hw_ver,
            max_qp: u(a.max_qp),
            max_qp_wr: u(a.max_qp_wr),
            device_cap_flags: a.device_cap_flags,
            max_sge: u(a.max_sge),
            max_sge_rd: u(a.max_sge_rd),
            max_cq: u(a.max_cq),
            max_cqe: u(a.max_cqe),
            max_mr: u(a.max_mr),
            max_pd: u(a.max_pd),
            max_qp_rd_atom: u(a.max_qp_rd_atom),
            max_qp_init_rd_atom: u(a.max_qp_init_rd_atom),
            max_res_rd_atom: u(a.max_res_rd_atom),
            atomic_cap: AtomicCap::from_raw(a.atomic_cap),
            max_ah: u(a.max_ah),
            max_srq: u(a.max_srq),
            max_srq_wr: u(a.max_srq_wr),
            max_srq_sge: u(a.max_srq_sge),
            max_pkeys: a.max_pkeys,
            local_ca_ack_delay: a.local_ca_ack_delay,
            phys_port_cnt: a.phys_port_cnt,
        }
    }

    /// Whether the device has type-2 memory windows ([`crate::Mw`]): windows bound by a work
    /// request on one queue pair, usable only through that queue pair (`IBV_DEVICE_MEM_WINDOW_TYPE_2A`
    /// or `_2B`).
    pub fn has_type2_windows(&self) -> bool {
        let type2 = ffi::ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2A.0
            | ffi::ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2B.0;
        self.device_cap_flags & type2 != 0
    }
}

/// Which atomic operations a device supports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum AtomicCap {
    /// None.
    #[default]
    None,
    /// Atomic with respect to this HCA only.
    Hca,
    /// Atomic with respect to the HCA and the CPUs.
    Global,
}

impl AtomicCap {
    fn from_raw(c: ffi::ibv_atomic_cap) -> Self {
        match c {
            ffi::ibv_atomic_cap::IBV_ATOMIC_HCA => AtomicCap::Hca,
            ffi::ibv_atomic_cap::IBV_ATOMIC_GLOB => AtomicCap::Global,
            _ => AtomicCap::None,
        }
    }
}

/// A path MTU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mtu {
    /// 256 bytes.
    Mtu256 = 1,
    /// 512 bytes.
    Mtu512 = 2,
    /// 1024 bytes.
    Mtu1024 = 3,
    /// 2048 bytes.
    Mtu2048 = 4,
    /// 4096 bytes.
    Mtu4096 = 5,
}

impl Mtu {
    /// The MTU of `bytes` (256, 512, 1024, 2048 or 4096).
    pub fn from_bytes(bytes: u32) -> Option<Mtu> {
        Some(match bytes {
            256 => Mtu::Mtu256,
            512 => Mtu::Mtu512,
            1024 => Mtu::Mtu1024,
            2048 => Mtu::Mtu2048,
            4096 => Mtu::Mtu4096,
            _ => return None,
        })
    }

    /// Bytes per packet.
    pub fn bytes(self) -> u32 {
        128 << (self as u32)
    }

    pub(crate) fn from_raw(m: ffi::ibv_mtu) -> Option<Mtu> {
        Some(match m.0 {
            1 => Mtu::Mtu256,
            2 => Mtu::Mtu512,
            3 => Mtu::Mtu1024,
            4 => Mtu::Mtu2048,
            5 => Mtu::Mtu4096,
            _ => return None,
        })
    }

    pub(crate) fn to_raw(self) -> ffi::ibv_mtu {
        ffi::ibv_mtu(self as u32)
    }
}

impl fmt::Display for Mtu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.bytes())
    }
}

/// A port's logical state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PortState {
    /// No link.
    Down,
    /// Link up, not yet configured.
    Init,
    /// Configured, not yet active.
    Armed,
    /// Ready for traffic.
    Active,
    /// Active, deferring errors.
    ActiveDefer,
    /// A value this version does not know.
    Other(u32),
}

impl fmt::Display for PortState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PortState::Down => f.write_str("PORT_DOWN"),
            PortState::Init => f.write_str("PORT_INIT"),
            PortState::Armed => f.write_str("PORT_ARMED"),
            PortState::Active => f.write_str("PORT_ACTIVE"),
            PortState::ActiveDefer => f.write_str("PORT_ACTIVE_DEFER"),
            PortState::Other(v) => write!(f, "PORT_STATE_{v}"),
        }
    }
}

/// A port's link layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LinkLayer {
    /// InfiniBand (LID routed).
    Infiniband,
    /// Ethernet (RoCE: GID routed, `is_global` required).
    Ethernet,
    /// Not reported.
    Unspecified,
}

impl fmt::Display for LinkLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LinkLayer::Infiniband => "InfiniBand",
            LinkLayer::Ethernet => "Ethernet",
            LinkLayer::Unspecified => "Unspecified",
        })
    }
}

/// A port's attributes (from `ibv_query_port`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PortAttr {
    /// Logical state.
    pub state: PortState,
    /// Largest MTU the port supports.
    pub max_mtu: Option<Mtu>,
    /// MTU in use.
    pub active_mtu: Option<Mtu>,
    /// Entries in the GID table.
    pub gid_tbl_len: u32,
    /// Capability flags.
    pub port_cap_flags: u32,
    /// Largest message, bytes.
    pub max_msg_sz: u32,
    /// Base LID (0 on RoCE).
    pub lid: u16,
    /// Subnet manager LID.
    pub sm_lid: u16,
    /// LID mask control.
    pub lmc: u8,
    /// Link layer.
    pub link_layer: LinkLayer,
    /// Physical state (5 is LinkUp).
    pub phys_state: u8,
    /// Active width (encoded as the spec does).
    pub active_width: u8,
    /// Active speed (encoded as the spec does).
    pub active_speed: u8,
}

impl PortAttr {
    fn from_raw(p: &ffi::ibv_port_attr) -> Self {
        PortAttr {
            state: match p.state.0 {
                1 => PortState::Down,
                2 => PortState::Init,
                3 => PortState::Armed,
                4 => PortState::Active,
                5 => PortState::ActiveDefer,
                v => PortState::Other(v),
            },
            max_mtu: Mtu::from_raw(p.max_mtu),
            active_mtu: Mtu::from_raw(p.active_mtu),
            gid_tbl_len: p.gid_tbl_len.max(0) as u32,
            port_cap_flags: p.port_cap_flags,
            max_msg_sz: p.max_msg_sz,
            lid: p.lid,
            sm_lid: p.sm_lid,
            lmc: p.lmc,
            link_layer: match p.link_layer as u32 {
                ffi::IBV_LINK_LAYER_INFINIBAND => LinkLayer::Infiniband,
                ffi::IBV_LINK_LAYER_ETHERNET => LinkLayer::Ethernet,
                _ => LinkLayer::Unspecified,
            },
            phys_state: p.phys_state,
            active_width: p.active_width,
            active_speed: p.active_speed,
        }
    }
}

/// A 128-bit global identifier: an IPv6 address in form. RoCE v2 GIDs of IPv4 addresses are
/// IPv4-mapped (`::ffff:a.b.c.d`).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The raw bytes, network order.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// True for the all-zero GID (an unused table entry).
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }

    /// The IPv4 address of an IPv4-mapped GID.
    pub fn to_ipv4(&self) -> Option<Ipv4Addr> {
        Ipv6Addr::from(self.0).to_ipv4_mapped()
    }

    pub(crate) fn from_raw(g: &ffi::ibv_gid) -> Gid {
        // SAFETY: every view of the union is 16 plain bytes.
        Gid(unsafe { g.raw })
    }

    pub(crate) fn to_raw(self) -> ffi::ibv_gid {
        ffi::ibv_gid { raw: self.0 }
    }
}

impl From<Ipv6Addr> for Gid {
    fn from(a: Ipv6Addr) -> Gid {
        Gid(a.octets())
    }
}

impl From<Gid> for Ipv6Addr {
    fn from(g: Gid) -> Ipv6Addr {
        Ipv6Addr::from(g.0)
    }
}

impl fmt::Display for Gid {
    /// Eight colon-separated groups of four hex digits, as `ibv_devinfo -v` and `show_gids`
    /// print them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, pair) in self.0.chunks(2).enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{:02x}{:02x}", pair[0], pair[1])?;
        }
        Ok(())
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

/// The protocol a GID table entry is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum GidType {
    /// InfiniBand.
    Ib,
    /// RoCE v1 (Ethernet, not routable).
    RoceV1,
    /// RoCE v2 (UDP/IP, routable).
    RoceV2,
    /// A value this version does not know.
    Other(u32),
}

impl fmt::Display for GidType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GidType::Ib => f.write_str("IB"),
            GidType::RoceV1 => f.write_str("RoCE v1"),
            GidType::RoceV2 => f.write_str("RoCE v2"),
            GidType::Other(v) => write!(f, "type {v}"),
        }
    }
}

/// One entry of a port's GID table.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct GidEntry {
    /// Port number.
    pub port: u8,
    /// Index in the port's table (perftest's `-x`).
    pub index: u32,
    /// The GID.
    pub gid: Gid,
    /// Its protocol.
    pub gid_type: GidType,
    /// The network device behind it (RoCE), e.g. `eth0`.
    pub netdev: Option<String>,
}

impl GidEntry {
    fn from_raw(e: &ffi::ibv_gid_entry) -> Self {
        let netdev = (e.ndev_ifindex != 0)
            .then(|| ifindex_name(e.ndev_ifindex))
            .flatten();
        GidEntry {
            port: e.port_num as u8,
            index: e.gid_index,
            gid: Gid::from_raw(&e.gid),
            gid_type: match ffi::ibv_gid_type(e.gid_type) {
                ffi::ibv_gid_type::IBV_GID_TYPE_IB => GidType::Ib,
                ffi::ibv_gid_type::IBV_GID_TYPE_ROCE_V1 => GidType::RoceV1,
                ffi::ibv_gid_type::IBV_GID_TYPE_ROCE_V2 => GidType::RoceV2,
                other => GidType::Other(other.0),
            },
            netdev,
        }
    }
}

fn ifindex_name(index: u32) -> Option<String> {
    let mut buf = [0u8; libc::IF_NAMESIZE];
    // SAFETY: `buf` has IF_NAMESIZE bytes, as if_indextoname requires.
    let p = unsafe { libc::if_indextoname(index, buf.as_mut_ptr().cast()) };
    if p.is_null() {
        return None;
    }
    let len = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Some(String::from_utf8_lossy(&buf[..len]).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtu_round_trips() {
        for bytes in [256, 512, 1024, 2048, 4096] {
            let m = Mtu::from_bytes(bytes).unwrap();
            assert_eq!(m.bytes(), bytes);
            assert_eq!(Mtu::from_raw(m.to_raw()), Some(m));
        }
        assert_eq!(Mtu::from_bytes(1500), None);
        assert_eq!(Mtu::from_raw(ffi::ibv_mtu(0)), None);
    }

    #[test]
    fn gid_formats_like_ibv_devinfo() {
        let g = Gid::from("::ffff:10.77.0.1".parse::<Ipv6Addr>().unwrap());
        assert_eq!(g.to_string(), "0000:0000:0000:0000:0000:ffff:0a4d:0001");
        assert_eq!(g.to_ipv4(), Some(Ipv4Addr::new(10, 77, 0, 1)));
        assert!(Gid::default().is_zero());
        let ll = Gid::from("fe80::1".parse::<Ipv6Addr>().unwrap());
        assert_eq!(ll.to_ipv4(), None);
    }
}
