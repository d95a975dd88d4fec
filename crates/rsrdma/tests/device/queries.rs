//! Device, port and GID queries agree with `ibv_devinfo -v` and with sysfs (what `show_gids`
//! reads).

use crate::common::{ctx, device_name, gid_index};
use rsrdma::{Cq, GidType, LinkLayer, Pd, PortState, Qp, QpCaps, QpType};
use std::collections::HashMap;
use std::net::Ipv6Addr;
use std::process::Command;

/// `ibv_devinfo -v -d DEV`, as key → value (device lines, then port-1 lines, which come later
/// and so override nothing of the device's), plus its GID lines.
struct DevInfo {
    fields: HashMap<String, String>,
    gids: Vec<(u32, Ipv6Addr, String)>,
}

fn devinfo() -> DevInfo {
    let out = Command::new("ibv_devinfo")
        .args(["-v", "-d", &device_name()])
        .output()
        .expect("run ibv_devinfo");
    assert!(
        out.status.success(),
        "ibv_devinfo failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let mut fields = HashMap::new();
    let mut gids = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("GID[") {
            // GID[  1]:		0000:...:0001, RoCE v2
            let (idx, rest) = rest.split_once("]:").unwrap();
            let (gid, ty) = rest.trim().split_once(',').unwrap();
            gids.push((
                idx.trim().parse().unwrap(),
                gid.trim().parse().unwrap(),
                ty.trim().to_string(),
            ));
        } else if let Some((k, v)) = line.split_once(':') {
            fields
                .entry(k.trim().to_string())
                .or_insert_with(|| v.trim().to_string());
        }
    }
    DevInfo { fields, gids }
}

impl DevInfo {
    fn num(&self, key: &str) -> u64 {
        let v = self
            .fields
            .get(key)
            .unwrap_or_else(|| panic!("ibv_devinfo printed no {key}"));
        let v = v.split_whitespace().next().unwrap();
        match v.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).unwrap(),
            None => v
                .parse()
                .unwrap_or_else(|_| panic!("{key}: {v} is not a number")),
        }
    }
}

#[test]
fn device_attributes_match_ibv_devinfo() {
    let ctx = ctx();
    let a = ctx.attr();
    let d = devinfo();
    assert_eq!(ctx.name(), device_name());
    assert_eq!(a.fw_ver, d.fields["fw_ver"]);
    let pairs: [(&str, u64); 14] = [
        ("max_mr_size", a.max_mr_size),
        ("max_qp", a.max_qp.into()),
        ("max_qp_wr", a.max_qp_wr.into()),
        ("max_sge", a.max_sge.into()),
        ("max_cq", a.max_cq.into()),
        ("max_cqe", a.max_cqe.into()),
        ("max_mr", a.max_mr.into()),
        ("max_pd", a.max_pd.into()),
        ("max_qp_rd_atom", a.max_qp_rd_atom.into()),
        ("max_qp_init_rd_atom", a.max_qp_init_rd_atom.into()),
        ("max_srq", a.max_srq.into()),
        ("max_srq_wr", a.max_srq_wr.into()),
        ("max_srq_sge", a.max_srq_sge.into()),
        ("phys_port_cnt", a.phys_port_cnt.into()),
    ];
    for (key, ours) in pairs {
        assert_eq!(ours, d.num(key), "{key}");
    }
    assert_eq!(a.vendor_id as u64, d.num("vendor_id"));
}

#[test]
fn port_attributes_match_ibv_devinfo() {
    let ctx = ctx();
    let p = ctx.query_port(1).unwrap();
    let d = devinfo();
    assert_eq!(p.state, PortState::Active);
    assert!(
        d.fields["state"].starts_with("PORT_ACTIVE"),
        "{}",
        d.fields["state"]
    );
    assert_eq!(p.max_mtu.unwrap().bytes() as u64, d.num("max_mtu"));
    assert_eq!(p.active_mtu.unwrap().bytes() as u64, d.num("active_mtu"));
    assert_eq!(p.lid as u64, d.num("port_lid"));
    let ll = &d.fields["link_layer"];
    assert_eq!(p.link_layer.to_string(), *ll);
    assert_eq!(p.link_layer, LinkLayer::Ethernet, "rxe is RoCE");
    assert!(
        ctx.query_port(0).is_err() && ctx.query_port(9).is_err(),
        "ports out of range are refused"
    );
}

#[test]
fn gid_table_matches_ibv_devinfo_and_sysfs() {
    let ctx = ctx();
    let table = ctx.gid_table().unwrap();
    let d = devinfo();
    assert!(!table.is_empty(), "rxe0 has GIDs");
    assert_eq!(
        table.len(),
        d.gids.len(),
        "ours: {table:?}\nibv_devinfo: {:?}",
        d.gids
    );
    let sys = format!("/sys/class/infiniband/{}/ports/1/gid_attrs", device_name());
    for e in &table {
        let (_, gid, ty) = d
            .gids
            .iter()
            .find(|g| g.0 == e.index)
            .unwrap_or_else(|| panic!("index {} not in ibv_devinfo", e.index));
        assert_eq!(Ipv6Addr::from(e.gid), *gid, "GID {}", e.index);
        assert_eq!(e.gid_type.to_string(), *ty, "type of GID {}", e.index);
        let sys_ty = std::fs::read_to_string(format!("{sys}/types/{}", e.index)).unwrap();
        let expect = match e.gid_type {
            GidType::RoceV2 => "RoCE v2",
            GidType::RoceV1 | GidType::Ib => "IB/RoCE v1",
            other => panic!("unexpected type {other}"),
        };
        assert_eq!(sys_ty.trim(), expect);
        let ndev = std::fs::read_to_string(format!("{sys}/ndevs/{}", e.index)).unwrap();
        assert_eq!(
            e.netdev.as_deref(),
            Some(ndev.trim()),
            "netdev of GID {}",
            e.index
        );
        // The single-entry query says the same.
        let one = ctx.query_gid(1, e.index).unwrap();
        assert_eq!(&one, e);
    }
    // The GID index the tests use is the IPv4-mapped RoCE v2 GID of the VM's address.
    let g = ctx.query_gid(1, gid_index().into()).unwrap();
    assert_eq!(g.gid_type, GidType::RoceV2);
    if let Ok(ip) = std::env::var("RSRDMA_TEST_IP") {
        assert_eq!(g.gid.to_ipv4().map(|v| v.to_string()), Some(ip));
    }
}

#[test]
fn unknown_device_names_what_exists() {
    let err = rsrdma::open("no_such_dev").unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("no_such_dev") && text.contains(&device_name()),
        "{text}"
    );
    let list = rsrdma::devices().unwrap();
    assert!(list.iter().any(|d| d.name() == device_name()));
}

#[test]
fn limits_are_checked_before_any_verb() {
    use rsrdma::{Cq, Error, Pd, Qp, QpCaps, QpType, Srq};
    let ctx = ctx();
    let a = ctx.attr().clone();
    let pd = Pd::new(&ctx).unwrap();
    let cq = Cq::new(&ctx, 16, None).unwrap();
    let e = Cq::new(&ctx, a.max_cqe + 1, None).unwrap_err();
    assert!(matches!(e, Error::Limit { what: "cqe", .. }), "{e}");
    let caps = QpCaps::default().max_send_wr(a.max_qp_wr + 1);
    let e = Qp::builder(QpType::Rc)
        .caps(caps)
        .build(&pd, &cq, &cq)
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Limit {
                what: "max_send_wr",
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("max_qp_wr"), "{e}");
    let caps = QpCaps::default().max_send_sge(a.max_sge + 1);
    let e = Qp::builder(QpType::Rc)
        .caps(caps)
        .build(&pd, &cq, &cq)
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Limit {
                what: "max_send_sge",
                ..
            }
        ),
        "{e}"
    );
    let e = Srq::new(&pd, a.max_srq_wr + 1, 1).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Limit {
                what: "srq max_wr",
                ..
            }
        ),
        "{e}"
    );
    // An inline size the provider cannot give is an error naming the limit, not a silent cut.
    let caps = QpCaps::default().max_inline_data(1 << 20);
    let e = Qp::builder(QpType::Rc)
        .caps(caps)
        .build(&pd, &cq, &cq)
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Limit {
                what: "max_inline_data",
                ..
            }
        ),
        "{e}"
    );
    // The probed limit itself is granted.
    let Error::Limit { limit, .. } = e else {
        unreachable!()
    };
    let caps = QpCaps::default().max_inline_data(limit as u32);
    let qp = Qp::builder(QpType::Rc)
        .caps(caps)
        .build(&pd, &cq, &cq)
        .unwrap();
    assert!(qp.caps().max_inline_data >= limit as u32);
}

#[test]
fn the_default_gid_is_the_routable_ipv4_one() {
    let ctx = ctx();
    let index = ctx
        .default_gid_index(1)
        .unwrap()
        .expect("rxe is RoCE: a GID is needed");
    let entry = ctx.query_gid(1, index.into()).unwrap();
    assert!(entry.gid.to_ipv4().is_some(), "{entry:?}");
    assert_eq!(entry.gid_type, GidType::RoceV2, "{entry:?}");
    // The test environment names the same one.
    assert_eq!(index, crate::common::gid_index());
    assert_eq!(ctx.resolve_gid_index(1, None).unwrap(), Some(index));
    assert_eq!(ctx.resolve_gid_index(1, Some(0)).unwrap(), Some(0));
    let len = ctx.query_port(1).unwrap().gid_tbl_len;
    let e = ctx
        .resolve_gid_index(1, Some(len.min(255) as u8))
        .unwrap_err();
    assert!(matches!(e, rsrdma::Error::InvalidArgument(_)), "{e}");
}

#[test]
fn the_inline_limit_is_public_and_exact() {
    let ctx = ctx();
    let pd = Pd::new(&ctx).unwrap();
    let cq = Cq::new(&ctx, 4, None).unwrap();
    let max = pd.max_inline_data(QpType::Rc).unwrap();
    assert!(max > 0, "rxe supports inline data");
    let at = Qp::builder(QpType::Rc)
        .caps(QpCaps::default().max_inline_data(max))
        .build(&pd, &cq, &cq)
        .unwrap();
    assert!(at.caps().max_inline_data >= max);
    let e = Qp::builder(QpType::Rc)
        .caps(QpCaps::default().max_inline_data(max + 1))
        .build(&pd, &cq, &cq)
        .unwrap_err();
    assert!(matches!(e, rsrdma::Error::Limit { .. }), "{e}");
}

/// With an RDMA stack present, "not supported" says what the device lacks, not "use the VM".
#[test]
fn unsupported_on_a_machine_with_rdma_names_no_vm() {
    for errno in [libc::ENODEV, libc::EOPNOTSUPP, libc::ENOSYS] {
        let text = rsrdma::Error::from_errno("ibv_alloc_mw", errno).to_string();
        assert!(!text.contains("cargo xtask vm"), "{text}");
        assert!(text.contains(&format!("errno {errno}")), "{text}");
    }
}

/// Issue 23's topology on the real tree: sysfs describes the device under test as its port
/// query does, and it is the nearest (and, over its netdev, the found) device.
#[test]
fn topology_describes_the_device_under_test() {
    use rsrdma::topology::{by_ip, by_netdev, current_numa_node, nearest, topology};
    let name = device_name();
    let all = topology().unwrap();
    let dev = all
        .iter()
        .find(|d| d.name == name)
        .unwrap_or_else(|| panic!("{name} not in {all:?}"));
    // The device list's entry reports the same.
    let list = rsrdma::devices().unwrap();
    let entry = list.find(&name).expect("the device under test is listed");
    assert_eq!(entry.topology().as_ref(), Some(dev));
    let port = ctx().query_port(1).unwrap();
    let p = &dev.ports[0];
    assert_eq!(p.port, 1);
    assert_eq!(p.link_layer, port.link_layer.to_string(), "{dev:?}");
    assert_eq!(
        p.state == "ACTIVE",
        port.state == PortState::Active,
        "{dev:?}"
    );
    assert!(p.rate_gbps.is_some_and(|g| g > 0.0), "{dev:?}");
    // rxe: no PCI function, a parent netdev that is also its GIDs' netdev.
    let parent = dev.parent.as_deref().expect("rxe has a parent netdev");
    assert!(p.netdevs.iter().any(|n| n == parent), "{dev:?}");
    assert_eq!(
        by_netdev(&all, parent).map(|d| d.name.as_str()),
        Some(name.as_str())
    );
    // The device's IPv4 address (its RoCE v2 GID) leads back to it.
    let gid = ctx().query_gid(1, gid_index().into()).unwrap().gid;
    let ip = std::net::Ipv6Addr::from(gid.0)
        .to_ipv4_mapped()
        .expect("an IPv4-mapped GID");
    assert_eq!(
        by_ip(&all, ip.into()).map(|d| d.name.as_str()),
        Some(name.as_str())
    );
    // The port lists that address and its netdev's MTU; rxe sits on no PCI function.
    assert!(p.addresses.contains(&ip.into()), "{dev:?}");
    assert!(p.netdev_mtu.is_some_and(|m| m >= 1024), "{dev:?}");
    assert!(
        dev.pci_path.is_empty() && dev.pci_address.is_none(),
        "{dev:?}"
    );
    assert_eq!(
        nearest(&all, current_numa_node()).map(|d| d.name.as_str()),
        Some(name.as_str()),
        "the VM's devices have no NUMA node: the first is the nearest"
    );
}

/// Issue 22: rdma-core is loaded when first called, not linked. With it hidden (the soft0
/// stage of `cargo xtask test` runs in a mount namespace without its libraries and headers,
/// and says so with `RSRDMA_EXPECT_NO_RDMA_CORE=1`) neither library loads and soft0 is the
/// only device; with it (the VM), libibverbs loads and lists the device under test.
#[test]
fn rdma_core_loads_when_present_and_soft0_stands_alone_without_it() {
    use rsrdma::ffi::dynamic::{ibverbs_loaded, rdmacm_loaded};
    let list = rsrdma::devices().unwrap();
    let names: Vec<String> = list.iter().map(|d| d.name().to_owned()).collect();
    // sysfs does not describe the software device.
    if let Some(soft) = list.find("soft0") {
        assert_eq!(soft.topology(), None);
    }
    if std::env::var_os("RSRDMA_EXPECT_NO_RDMA_CORE").is_some_and(|v| v == "1") {
        assert!(!ibverbs_loaded(), "libibverbs loaded though hidden");
        assert!(!rdmacm_loaded(), "librdmacm loaded though hidden");
        assert_eq!(names, ["soft0"]);
    } else {
        assert!(ibverbs_loaded() && rdmacm_loaded());
        assert!(names.contains(&device_name()), "{names:?}");
    }
}

/// Issue 23: DMA-BUF registration (GPU memory). Bad arguments are refused before any call;
/// a device that cannot import DMA-BUFs (rxe, soft0) says so as `Unsupported`, naming the
/// call, whatever the descriptor. A memfd stands in for the DMA-BUF: neither device looks at
/// it before refusing.
#[test]
fn dmabuf_registration_refuses_clearly_where_the_device_cannot() {
    use rsrdma::{AccessFlags, DmabufMr, Error};
    use std::os::fd::{AsFd, FromRawFd, OwnedFd};
    let ctx = ctx();
    let pd = Pd::new(&ctx).unwrap();
    // SAFETY: a plain syscall with a NUL-terminated name; the fd is owned below.
    let raw = unsafe { libc::memfd_create(c"dmabuf-stand-in".as_ptr(), 0) };
    assert!(raw >= 0);
    // SAFETY: a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let lw = AccessFlags::LOCAL_WRITE;
    let register = |offset: u64, len: usize, access: AccessFlags| {
        // SAFETY: the registrations below all fail, so no memory is ever reached.
        unsafe { DmabufMr::register(&pd, fd.as_fd(), offset, len, 0x10_0000, access) }
    };
    let bad = [
        register(0, 0, lw).unwrap_err(),
        register(u64::MAX, 4096, lw).unwrap_err(),
        register(0, 4096, AccessFlags::REMOTE_WRITE).unwrap_err(),
    ];
    for e in bad {
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    }
    let e = register(0, 4096, lw).unwrap_err();
    match &e {
        Error::Unsupported { op, .. } => assert_eq!(*op, "ibv_reg_dmabuf_mr"),
        other => panic!(
            "expected Unsupported from {}: {other:?} ({other})",
            device_name()
        ),
    }
    assert!(e.to_string().contains("ibv_reg_dmabuf_mr"), "{e}");
}
