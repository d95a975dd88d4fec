//! Where the RDMA devices sit: NUMA node, PCI address, and per port the link layer, state,
//! speed and the network devices behind it, read from sysfs (`/sys/class/infiniband`), so
//! that a program on a machine with several NICs can take the one near its CPU ([`nearest`]
//! with [`current_numa_node`]), near its memory ([`nearest_to_memory`]), near a GPU or any
//! other PCI device by PCI distance ([`nearest_to_pci`]), or the one holding an address
//! ([`by_ip`], [`by_netdev`]).
//!
//! Everything here is read from files, without opening a device: a device that cannot be
//! opened (no permission, a wedged provider) is still described. [`topology_at`] reads a tree
//! rooted elsewhere (the tests read recorded trees).

use crate::error::{Error, Result};
use std::path::Path;

/// One RDMA device as sysfs describes it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct DeviceTopology {
    /// The device's name (`mlx5_0`, `rxe0`).
    pub name: String,
    /// Its NUMA node, where the platform says (`None` on one-node machines and for software
    /// devices).
    pub numa_node: Option<u32>,
    /// Its PCI address (`0000:3b:00.0`), for devices on a PCI bus.
    pub pci_address: Option<String>,
    /// Where it sits in the PCI hierarchy: its host bridge (`pci0000:3a`), the bridges and
    /// switch ports below it, and itself, from sysfs's device path; empty off PCI.
    pub pci_path: Vec<String>,
    /// For a software device over a network device (rxe), that device (its `parent`).
    pub parent: Option<String>,
    /// Its ports.
    pub ports: Vec<PortTopology>,
}

/// One port of a device.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct PortTopology {
    /// The port number (from 1).
    pub port: u8,
    /// `InfiniBand` or `Ethernet` (RoCE).
    pub link_layer: String,
    /// The state's name (`ACTIVE`, `DOWN`, `INIT`, …).
    pub state: String,
    /// The active speed in Gb/s (`rate`'s figure: width × lane speed), when the port has one.
    pub rate_gbps: Option<f64>,
    /// The active width and speed's description (`4X EDR`, `1X`).
    pub rate_text: Option<String>,
    /// The network devices of its GIDs (RoCE), in GID-table order without repeats.
    pub netdevs: Vec<String>,
    /// The MTU of its first network device in bytes (RoCE: the largest RDMA MTU that fits
    /// below it is the port's active MTU); `None` without one (InfiniBand: ask the port).
    pub netdev_mtu: Option<u32>,
    /// The IP addresses its network devices hold now (`getifaddrs`): the addresses a peer
    /// dials to reach this port (rdma_cm), IPv4 first.
    pub addresses: Vec<std::net::IpAddr>,
}

impl DeviceTopology {
    /// Whether any port is ACTIVE.
    pub fn is_active(&self) -> bool {
        self.ports.iter().any(|p| p.state == "ACTIVE")
    }

    /// The fastest active port's speed, in Gb/s.
    pub fn best_rate_gbps(&self) -> Option<f64> {
        self.ports
            .iter()
            .filter(|p| p.state == "ACTIVE")
            .filter_map(|p| p.rate_gbps)
            .reduce(f64::max)
    }
}

/// The devices of this machine, by name (an empty list on a machine without RDMA; the
/// software device, which has no sysfs entry, is not in it).
///
/// # Errors
/// [`Error::InvalidArgument`] when sysfs's tree exists but cannot be listed.
pub fn topology() -> Result<Vec<DeviceTopology>> {
    topology_at(Path::new("/sys/class/infiniband"))
}

/// The device named `name`, as sysfs describes it (`None` when sysfs has no such device).
pub(crate) fn of_device(name: &str) -> Option<DeviceTopology> {
    of_device_at(Path::new("/sys/class/infiniband"), name)
}

fn of_device_at(root: &Path, name: &str) -> Option<DeviceTopology> {
    if name.is_empty() || name.contains('/') || name.starts_with('.') {
        return None;
    }
    let dir = root.join(name);
    dir.is_dir().then(|| read_device(&dir, name.to_string()))
}

/// The devices described under `root` (a `/sys/class/infiniband`-shaped tree), by name.
///
/// # Errors
/// [`Error::InvalidArgument`] when `root` exists but cannot be listed.
pub fn topology_at(root: &Path) -> Result<Vec<DeviceTopology>> {
    let entries = match std::fs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(Error::InvalidArgument(format!(
                "cannot list {}: {e}",
                root.display()
            )))
        }
    };
    let mut out: Vec<DeviceTopology> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            Some(read_device(&root.join(&name), name))
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

fn read_trimmed(p: &Path) -> Option<String> {
    let s = std::fs::read_to_string(p).ok()?;
    let t = s.trim();
    (!t.is_empty()).then(|| t.to_string())
}

fn read_device(dir: &Path, name: String) -> DeviceTopology {
    // `device` links to the bus device (a PCI function's directory is named by its address);
    // its `numa_node` is -1 where the platform has no affinity.
    let numa_node = read_trimmed(&dir.join("device/numa_node"))
        .and_then(|v| v.parse::<i64>().ok())
        .and_then(|v| u32::try_from(v).ok());
    let pci_path = pci_path_of_dir(&dir.join("device"));
    let pci_address = pci_path.last().filter(|a| is_pci_address(a)).cloned();
    let parent = read_trimmed(&dir.join("parent"));
    // `/sys/class/infiniband`'s sibling `/sys/class/net` holds the network devices.
    let net = dir.parent().and_then(Path::parent).map(|c| c.join("net"));
    let addrs = interface_addresses();
    let mut ports: Vec<PortTopology> = std::fs::read_dir(dir.join("ports"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let port: u8 = e.file_name().to_str()?.parse().ok()?;
            Some(read_port(&e.path(), port, net.as_deref(), &addrs))
        })
        .collect();
    ports.sort_by_key(|p| p.port);
    DeviceTopology {
        name,
        numa_node,
        pci_address,
        pci_path,
        parent,
        ports,
    }
}

/// The PCI hierarchy above and including the bus device `link` resolves to: the components
/// of its canonical path from the host bridge (`pciDDDD:BB`) on.
fn pci_path_of_dir(link: &Path) -> Vec<String> {
    let Ok(real) = std::fs::canonicalize(link) else {
        return Vec::new();
    };
    let parts: Vec<String> = real
        .components()
        .filter_map(|c| c.as_os_str().to_str().map(str::to_string))
        .collect();
    match parts.iter().rposition(|c| is_host_bridge(c)) {
        Some(at) => parts[at..]
            .iter()
            .take_while(|c| is_host_bridge(c) || is_pci_address(c))
            .cloned()
            .collect(),
        // A PCI function whose host bridge the path does not show: itself only.
        None => parts
            .last()
            .filter(|c| is_pci_address(c))
            .cloned()
            .into_iter()
            .collect(),
    }
}

/// `pciDDDD:BB`: a PCI host bridge's directory in sysfs.
fn is_host_bridge(c: &str) -> bool {
    c.strip_prefix("pci").is_some_and(|r| {
        let b = r.as_bytes();
        b.len() == 7
            && b[4] == b':'
            && r.chars()
                .filter(|&c| c != ':')
                .all(|c| c.is_ascii_hexdigit())
    })
}

fn read_port(
    dir: &Path,
    port: u8,
    net: Option<&Path>,
    addrs: &[(String, std::net::IpAddr)],
) -> PortTopology {
    // `state` reads `4: ACTIVE`; `rate` reads `100 Gb/sec (4X EDR)`.
    let state = read_trimmed(&dir.join("state"))
        .map(|s| s.split_once(": ").map_or(s.clone(), |(_, n)| n.to_string()))
        .unwrap_or_default();
    let rate = read_trimmed(&dir.join("rate"));
    let rate_gbps = rate
        .as_deref()
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse().ok());
    let rate_text = rate.as_deref().and_then(|r| {
        let inner = r.split_once('(')?.1.strip_suffix(')')?;
        Some(inner.to_string())
    });
    let mut ndevs: Vec<(u32, String)> = std::fs::read_dir(dir.join("gid_attrs/ndevs"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let index: u32 = e.file_name().to_str()?.parse().ok()?;
            Some((index, read_trimmed(&e.path())?))
        })
        .collect();
    ndevs.sort();
    let mut netdevs: Vec<String> = Vec::new();
    for (_, n) in ndevs {
        if !netdevs.contains(&n) {
            netdevs.push(n);
        }
    }
    let netdev_mtu = net
        .zip(netdevs.first())
        .and_then(|(net, n)| read_trimmed(&net.join(n).join("mtu")))
        .and_then(|m| m.parse().ok());
    let mut addresses: Vec<std::net::IpAddr> = addrs
        .iter()
        .filter(|(n, _)| netdevs.contains(n))
        .map(|&(_, a)| a)
        .collect();
    addresses.sort_by_key(|a| a.is_ipv6());
    PortTopology {
        port,
        link_layer: read_trimmed(&dir.join("link_layer")).unwrap_or_default(),
        state,
        rate_gbps,
        rate_text,
        netdevs,
        netdev_mtu,
        addresses,
    }
}

/// `dddd:bb:dd.f` in hex.
fn is_pci_address(a: &str) -> bool {
    let b = a.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && a.chars()
            .enumerate()
            .all(|(i, c)| matches!(i, 4 | 7 | 10) || c.is_ascii_hexdigit())
}

/// The device to use from NUMA node `node` (see [`current_numa_node`]): an active device on
/// that node, the fastest first; else an active device on no node or another node, the
/// fastest first; `None` when no device is active.
pub fn nearest(devices: &[DeviceTopology], node: Option<u32>) -> Option<&DeviceTopology> {
    let rate = |d: &DeviceTopology| d.best_rate_gbps().unwrap_or(0.0);
    let pick = |same: bool| {
        devices
            .iter()
            .filter(|d| d.is_active())
            .filter(|d| !same || (node.is_some() && d.numa_node == node))
            .max_by(|a, b| {
                rate(a)
                    .total_cmp(&rate(b))
                    .then_with(|| b.name.cmp(&a.name))
            })
    };
    pick(true).or_else(|| pick(false))
}

/// The device whose port carries network device `netdev` (RoCE), or whose parent it is
/// (rxe).
pub fn by_netdev<'a>(devices: &'a [DeviceTopology], netdev: &str) -> Option<&'a DeviceTopology> {
    devices.iter().find(|d| {
        d.parent.as_deref() == Some(netdev)
            || d.ports
                .iter()
                .any(|p| p.netdevs.iter().any(|n| n == netdev))
    })
}

/// The network interface that holds IP address `ip` on this machine (`getifaddrs`).
pub fn netdev_of(ip: std::net::IpAddr) -> Option<String> {
    interface_addresses()
        .into_iter()
        .find(|&(_, a)| a == ip)
        .map(|(n, _)| n)
}

/// Every IP address of this machine's interfaces, with the interface's name (`getifaddrs`;
/// empty if it fails).
fn interface_addresses() -> Vec<(String, std::net::IpAddr)> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head through a valid pointer; freed below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut at = head;
    while !at.is_null() {
        // SAFETY: a node of the list getifaddrs returned, alive until freeifaddrs.
        let ifa = unsafe { &*at };
        // SAFETY: a non-null address of the family it names (getifaddrs' contract).
        if let Some(addr) = unsafe { sockaddr_ip(ifa.ifa_addr) } {
            // SAFETY: the interface's name, a C string alive until freeifaddrs.
            let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) };
            out.push((name.to_string_lossy().into_owned(), addr));
        }
        at = ifa.ifa_next;
    }
    // SAFETY: the list getifaddrs returned, freed once.
    unsafe { libc::freeifaddrs(head) };
    out
}

/// The IP address in `sa`.
///
/// # Safety
/// `sa` is null or a valid sockaddr of the family it names.
unsafe fn sockaddr_ip(sa: *const libc::sockaddr) -> Option<std::net::IpAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: the caller's contract; the family decides the type read.
    unsafe {
        match i32::from((*sa).sa_family) {
            libc::AF_INET => {
                let s = &*sa.cast::<libc::sockaddr_in>();
                Some(std::net::Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr)).into())
            }
            libc::AF_INET6 => {
                let s = &*sa.cast::<libc::sockaddr_in6>();
                Some(std::net::Ipv6Addr::from(s.sin6_addr.s6_addr).into())
            }
            _ => None,
        }
    }
}

/// The device whose network interface holds IP address `ip` (RoCE: the address a peer
/// dials; see [`netdev_of`] and [`by_netdev`]).
pub fn by_ip(devices: &[DeviceTopology], ip: std::net::IpAddr) -> Option<&DeviceTopology> {
    by_netdev(devices, &netdev_of(ip)?)
}

/// How far a device sits from another PCI device (a GPU), from near to far, as NCCL ranks
/// paths: below a common PCIe switch or bridge, under the same host bridge, on the same NUMA
/// node, or across the machine's interconnect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum PciDistance {
    /// Both sit below a common bridge or switch under their host bridge: traffic between
    /// them need not cross the CPU (`hops`: bridges between them along the tree).
    Switch {
        /// Links between the two along the PCI tree.
        hops: u32,
    },
    /// Both under the same host bridge (root complex), on different root ports.
    HostBridge,
    /// Under different host bridges on the same NUMA node.
    Node,
    /// Across NUMA nodes, or where nothing tells.
    System,
}

/// The distance between two PCI devices given by their paths ([`DeviceTopology::pci_path`],
/// [`pci_device`]) and NUMA nodes.
pub fn pci_distance(
    a: &[String],
    a_node: Option<u32>,
    b: &[String],
    b_node: Option<u32>,
) -> PciDistance {
    let common = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    if common >= 2 {
        // A shared bridge below the host bridge.
        let hops = (a.len() + b.len() - 2 * common) as u32;
        PciDistance::Switch { hops }
    } else if common == 1 {
        PciDistance::HostBridge
    } else if a_node.is_some() && a_node == b_node {
        PciDistance::Node
    } else {
        PciDistance::System
    }
}

/// The PCI path of the device at `pci_address` (`0000:3b:00.0`: a GPU, say) from
/// `/sys/bus/pci/devices`, with its NUMA node; `None` when there is no such device.
pub fn pci_device(pci_address: &str) -> Option<(Vec<String>, Option<u32>)> {
    pci_device_at(Path::new("/sys/bus/pci/devices"), pci_address)
}

/// [`pci_device`] under `root` (a `/sys/bus/pci/devices`-shaped tree).
pub fn pci_device_at(root: &Path, pci_address: &str) -> Option<(Vec<String>, Option<u32>)> {
    if !is_pci_address(pci_address) {
        return None;
    }
    let dir = root.join(pci_address);
    let path = pci_path_of_dir(&dir);
    if path.is_empty() {
        return None;
    }
    let node = read_trimmed(&dir.join("numa_node"))
        .and_then(|v| v.parse::<i64>().ok())
        .and_then(|v| u32::try_from(v).ok());
    Some((path, node))
}

/// The active device nearest to the PCI device with `path` and `node` (from [`pci_device`]):
/// the smallest [`PciDistance`], then the fastest; `None` when no device is active.
pub fn nearest_to_pci<'a>(
    devices: &'a [DeviceTopology],
    path: &[String],
    node: Option<u32>,
) -> Option<&'a DeviceTopology> {
    devices.iter().filter(|d| d.is_active()).min_by(|a, b| {
        let da = pci_distance(&a.pci_path, a.numa_node, path, node);
        let db = pci_distance(&b.pci_path, b.numa_node, path, node);
        let rate = |d: &DeviceTopology| d.best_rate_gbps().unwrap_or(0.0);
        da.cmp(&db)
            .then_with(|| rate(b).total_cmp(&rate(a)))
            .then_with(|| a.name.cmp(&b.name))
    })
}

/// The NUMA node of the memory at `addr` (the page holding it, `move_pages` asked without
/// moving anything); `None` where the page is not present yet (never touched) or the
/// kernel has no NUMA support.
pub fn numa_node_of_memory(addr: *const u8) -> Option<u32> {
    let page = [addr as *mut libc::c_void];
    let mut status = [-1i32];
    // SAFETY: move_pages with a null node list only reports each page's node into `status`
    // (one entry for one page); it reads no memory at `addr` and moves nothing. Both arrays
    // live across the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_pages,
            0,
            1usize,
            page.as_ptr(),
            std::ptr::null::<i32>(),
            status.as_mut_ptr(),
            0,
        )
    };
    if rc != 0 {
        return None;
    }
    u32::try_from(status[0]).ok()
}

/// The active device nearest to the memory at `addr` (a registered region's start, say):
/// [`nearest`] for the node that memory is on, or for this thread's node when the memory's
/// is unknown.
pub fn nearest_to_memory(devices: &[DeviceTopology], addr: *const u8) -> Option<&DeviceTopology> {
    nearest(
        devices,
        numa_node_of_memory(addr).or_else(current_numa_node),
    )
}

/// The NUMA node of the CPU this thread runs on now (`getcpu`), where the kernel says.
pub fn current_numa_node() -> Option<u32> {
    let (mut cpu, mut node) = (0u32, 0u32);
    // SAFETY: getcpu writes two u32s through valid pointers; the third argument is unused
    // (null).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_getcpu,
            &mut cpu as *mut u32,
            &mut node as *mut u32,
            std::ptr::null_mut::<libc::c_void>(),
        )
    };
    (rc == 0).then_some(node)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::path::PathBuf;

    /// A scratch directory removed on drop.
    struct Tree(PathBuf);

    impl Tree {
        fn new(tag: &str) -> Tree {
            let p = std::env::temp_dir().join(format!(
                "rsrdma-topology-{tag}-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            let _ = fs::remove_dir_all(&p);
            fs::create_dir_all(&p).unwrap();
            Tree(p)
        }

        fn file(&self, rel: &str, text: &str) {
            let p = self.0.join(rel);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, format!("{text}\n")).unwrap();
        }

        fn link(&self, rel: &str, to: &str) {
            let p = self.0.join(rel);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::os::unix::fs::symlink(self.0.join(to), p).unwrap();
        }
    }

    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    /// A device as sysfs lays it out: `class/<name>` linking its `device` to a PCI function.
    fn nic(t: &Tree, name: &str, pci: &str, numa: i32, ports: &[(&str, &str, &str, &[&str])]) {
        nic_at(t, name, &format!("pci/{pci}"), numa, ports);
    }

    /// [`nic`] with the PCI function at `path` under the tree (`devices/pci0000:3a/…`).
    fn nic_at(t: &Tree, name: &str, path: &str, numa: i32, ports: &[(&str, &str, &str, &[&str])]) {
        t.file(&format!("{path}/numa_node"), &numa.to_string());
        t.link(&format!("class/{name}/device"), path);
        for (i, (ll, state, rate, ndevs)) in ports.iter().enumerate() {
            let port = format!("class/{name}/ports/{}", i + 1);
            t.file(&format!("{port}/link_layer"), ll);
            t.file(&format!("{port}/state"), state);
            t.file(&format!("{port}/rate"), rate);
            for (g, n) in ndevs.iter().enumerate() {
                t.file(&format!("{port}/gid_attrs/ndevs/{g}"), n);
            }
        }
    }

    #[test]
    fn a_two_socket_server_with_four_nics() {
        let t = Tree::new("two-socket");
        let roce = |n: &'static str| -> &'static [&'static str] {
            match n {
                "a" => &["ens1f0np0", "ens1f0np0", "ens1f0np0"],
                _ => &["ens2f0np0", "ens2f0np0"],
            }
        };
        nic(
            &t,
            "mlx5_0",
            "0000:3b:00.0",
            0,
            &[("Ethernet", "4: ACTIVE", "200 Gb/sec (4X HDR)", roce("a"))],
        );
        nic(
            &t,
            "mlx5_1",
            "0000:5e:00.0",
            0,
            &[("Ethernet", "1: DOWN", "10 Gb/sec (4X SDR)", &[])],
        );
        nic(
            &t,
            "mlx5_2",
            "0000:af:00.0",
            1,
            &[("Ethernet", "4: ACTIVE", "400 Gb/sec (4X NDR)", roce("b"))],
        );
        nic(
            &t,
            "mlx5_3",
            "0000:d8:00.0",
            1,
            &[("InfiniBand", "4: ACTIVE", "100 Gb/sec (4X EDR)", &[])],
        );
        let d = topology_at(&t.0.join("class")).unwrap();
        assert_eq!(
            d.iter().map(|x| x.name.as_str()).collect::<Vec<_>>(),
            ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
        );
        assert_eq!(d[0].numa_node, Some(0));
        assert_eq!(d[2].numa_node, Some(1));
        assert_eq!(d[2].pci_address.as_deref(), Some("0000:af:00.0"));
        let p = &d[0].ports[0];
        assert_eq!(
            (
                p.port,
                p.link_layer.as_str(),
                p.state.as_str(),
                p.rate_gbps,
                p.rate_text.as_deref()
            ),
            (1, "Ethernet", "ACTIVE", Some(200.0), Some("4X HDR"))
        );
        assert_eq!(p.netdevs, ["ens1f0np0"]);
        assert_eq!(d[1].ports[0].state, "DOWN");
        // Nearest: the fastest active device on the node; on a node with none, any.
        assert_eq!(nearest(&d, Some(0)).unwrap().name, "mlx5_0");
        assert_eq!(nearest(&d, Some(1)).unwrap().name, "mlx5_2");
        assert_eq!(nearest(&d, Some(7)).unwrap().name, "mlx5_2");
        assert_eq!(nearest(&d, None).unwrap().name, "mlx5_2");
        assert_eq!(by_netdev(&d, "ens2f0np0").unwrap().name, "mlx5_2");
        assert!(by_netdev(&d, "eth9").is_none());
    }

    /// A GPU server: two host bridges per socket; on socket 0 a PCIe switch carries GPU 0
    /// and mlx5_0, and mlx5_1 hangs off another root port of the same host bridge; socket 1
    /// has mlx5_2 and GPU 1 under different host bridges. The PCI tree decides before the
    /// rate: GPU 0 gets the 100 Gb/s NIC on its switch over the 400 Gb/s one beside it.
    #[test]
    fn a_gpu_server_chooses_the_nic_on_the_gpus_switch() {
        let t = Tree::new("gpu-server");
        let active = |rate: &'static str| [("Ethernet", "4: ACTIVE", rate, &[] as &[&str])];
        let sw = "devices/pci0000:16/0000:16:02.0/0000:17:00.0/0000:18:08.0";
        nic_at(
            &t,
            "mlx5_0",
            &format!("{sw}/0000:1a:00.0"),
            0,
            &active("100 Gb/sec (4X EDR)"),
        );
        t.file(&format!("{sw}/0000:19:00.0/numa_node"), "0");
        t.link("bus/0000:19:00.0", &format!("{sw}/0000:19:00.0"));
        nic_at(
            &t,
            "mlx5_1",
            "devices/pci0000:16/0000:16:03.0/0000:30:00.0",
            0,
            &active("400 Gb/sec (4X NDR)"),
        );
        nic_at(
            &t,
            "mlx5_2",
            "devices/pci0000:97/0000:97:02.0/0000:98:00.0",
            1,
            &active("200 Gb/sec (4X HDR)"),
        );
        t.file(
            "devices/pci0000:b0/0000:b0:02.0/0000:b1:00.0/numa_node",
            "1",
        );
        t.link(
            "bus/0000:b1:00.0",
            "devices/pci0000:b0/0000:b0:02.0/0000:b1:00.0",
        );
        let d = topology_at(&t.0.join("class")).unwrap();
        assert_eq!(
            d[0].pci_path,
            [
                "pci0000:16",
                "0000:16:02.0",
                "0000:17:00.0",
                "0000:18:08.0",
                "0000:1a:00.0"
            ]
        );
        assert_eq!(d[0].pci_address.as_deref(), Some("0000:1a:00.0"));
        let bus = t.0.join("bus");
        let (gpu0, node0) = pci_device_at(&bus, "0000:19:00.0").unwrap();
        let (gpu1, node1) = pci_device_at(&bus, "0000:b1:00.0").unwrap();
        assert_eq!((node0, node1), (Some(0), Some(1)));
        assert!(pci_device_at(&bus, "0000:ff:00.0").is_none());
        assert!(pci_device_at(&bus, "not-an-address").is_none());
        assert_eq!(
            pci_distance(&d[0].pci_path, d[0].numa_node, &gpu0, node0),
            PciDistance::Switch { hops: 2 }
        );
        assert_eq!(
            pci_distance(&d[1].pci_path, d[1].numa_node, &gpu0, node0),
            PciDistance::HostBridge
        );
        assert_eq!(
            pci_distance(&d[2].pci_path, d[2].numa_node, &gpu1, node1),
            PciDistance::Node
        );
        assert_eq!(
            pci_distance(&d[0].pci_path, d[0].numa_node, &gpu1, node1),
            PciDistance::System
        );
        assert_eq!(nearest_to_pci(&d, &gpu0, node0).unwrap().name, "mlx5_0");
        assert_eq!(nearest_to_pci(&d, &gpu1, node1).unwrap().name, "mlx5_2");
        // A device with no PCI path and no node: the fastest active device.
        assert_eq!(nearest_to_pci(&d, &[], None).unwrap().name, "mlx5_1");
    }

    /// A RoCE port's netdev MTU comes from `class/net`, beside `class/infiniband`.
    #[test]
    fn a_roce_port_reports_its_netdevs_mtu() {
        let t = Tree::new("mtu");
        t.file("class/infiniband/mlx5_0/ports/1/link_layer", "Ethernet");
        t.file("class/infiniband/mlx5_0/ports/1/state", "4: ACTIVE");
        t.file(
            "class/infiniband/mlx5_0/ports/1/gid_attrs/ndevs/0",
            "ens1f0np0",
        );
        t.file("class/net/ens1f0np0/mtu", "9000");
        let d = topology_at(&t.0.join("class/infiniband")).unwrap();
        assert_eq!(d[0].ports[0].netdev_mtu, Some(9000));
        // No netdev on this host has that name: no addresses.
        assert!(d[0].ports[0].addresses.is_empty());
    }

    /// One device by name reads as in the whole list; a name sysfs lacks (or a path) is none.
    #[test]
    fn one_device_by_name_reads_as_in_the_list() {
        let t = Tree::new("byname");
        t.file("class/infiniband/mlx5_0/ports/1/link_layer", "Ethernet");
        t.file("class/infiniband/mlx5_0/ports/1/state", "4: ACTIVE");
        t.file("class/infiniband/mlx5_1/ports/1/link_layer", "InfiniBand");
        t.file("class/infiniband/mlx5_1/ports/1/state", "1: DOWN");
        let root = t.0.join("class/infiniband");
        let all = topology_at(&root).unwrap();
        assert_eq!(of_device_at(&root, "mlx5_1").as_ref(), all.get(1));
        assert_eq!(of_device_at(&root, "mlx5_0").as_ref(), all.first());
        assert_eq!(of_device_at(&root, "soft0"), None);
        assert_eq!(of_device_at(&root, "../infiniband"), None);
        assert_eq!(of_device_at(&root, ""), None);
    }

    /// The memory's own node, where the kernel has NUMA: a page just touched is on one of
    /// the nodes sysfs lists; a page never touched has none yet.
    #[test]
    fn memory_reports_the_node_it_is_on() {
        let v = vec![1u8; 1 << 20];
        let Some(node) = numa_node_of_memory(v.as_ptr()) else {
            // Only a kernel without NUMA support answers nothing for a present page.
            assert!(!Path::new("/sys/devices/system/node/node0").exists());
            return;
        };
        assert!(
            Path::new(&format!("/sys/devices/system/node/node{node}")).exists(),
            "node {node}"
        );
        // SAFETY: an anonymous private mapping of one page, never touched, unmapped below.
        let untouched = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(untouched, libc::MAP_FAILED);
        assert_eq!(numa_node_of_memory(untouched.cast()), None);
        // SAFETY: the mapping made above, unmapped once.
        unsafe { libc::munmap(untouched, 4096) };
        let d = [DeviceTopology {
            name: "mlx5_0".into(),
            numa_node: Some(node),
            pci_address: None,
            pci_path: Vec::new(),
            parent: None,
            ports: vec![PortTopology {
                port: 1,
                link_layer: "Ethernet".into(),
                state: "ACTIVE".into(),
                rate_gbps: Some(100.0),
                rate_text: None,
                netdevs: Vec::new(),
                netdev_mtu: None,
                addresses: Vec::new(),
            }],
        }];
        assert_eq!(nearest_to_memory(&d, v.as_ptr()).unwrap().name, "mlx5_0");
    }

    #[test]
    fn soft_roce_over_a_netdev_and_a_platform_without_numa() {
        let t = Tree::new("rxe");
        // rxe: no bus device, a parent netdev, one Ethernet port.
        t.file("class/rxe0/parent", "eth0");
        t.file("class/rxe0/ports/1/link_layer", "Ethernet");
        t.file("class/rxe0/ports/1/state", "4: ACTIVE");
        t.file("class/rxe0/ports/1/rate", "10 Gb/sec (1X QDR)");
        t.file("class/rxe0/ports/1/gid_attrs/ndevs/0", "eth0");
        t.file("class/rxe0/ports/1/gid_attrs/ndevs/1", "eth0");
        // A NIC whose platform reports no node (-1).
        nic(
            &t,
            "mlx4_0",
            "0000:01:00.0",
            -1,
            &[("InfiniBand", "4: ACTIVE", "56 Gb/sec (4X FDR)", &[])],
        );
        let d = topology_at(&t.0.join("class")).unwrap();
        let rxe = d.iter().find(|x| x.name == "rxe0").unwrap();
        assert_eq!((rxe.numa_node, rxe.pci_address.as_deref()), (None, None));
        assert_eq!(rxe.parent.as_deref(), Some("eth0"));
        assert_eq!(rxe.ports[0].netdevs, ["eth0"]);
        assert_eq!(by_netdev(&d, "eth0").unwrap().name, "rxe0");
        let mlx4 = d.iter().find(|x| x.name == "mlx4_0").unwrap();
        assert_eq!(mlx4.numa_node, None);
        assert_eq!(nearest(&d, Some(0)).unwrap().name, "mlx4_0");
    }

    #[test]
    fn no_tree_is_no_device() {
        let t = Tree::new("empty");
        assert!(topology_at(&t.0.join("absent")).unwrap().is_empty());
        assert!(nearest(&[], Some(0)).is_none());
    }

    #[test]
    fn the_loopback_address_is_on_lo_and_leads_to_no_device() {
        let lo = netdev_of(std::net::Ipv4Addr::LOCALHOST.into());
        assert_eq!(lo.as_deref(), Some("lo"));
        assert!(netdev_of("192.0.2.77".parse().unwrap()).is_none());
        let t = Tree::new("ip");
        nic(
            &t,
            "mlx5_0",
            "0000:3b:00.0",
            0,
            &[("Ethernet", "4: ACTIVE", "100 Gb/sec (4X EDR)", &["ens1"])],
        );
        let d = topology_at(&t.0.join("class")).unwrap();
        assert!(by_ip(&d, std::net::Ipv4Addr::LOCALHOST.into()).is_none());
    }

    #[test]
    fn this_threads_node_is_known_on_linux() {
        assert!(current_numa_node().is_some());
    }
}
