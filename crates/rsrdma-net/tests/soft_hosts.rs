//! soft0 between hosts: two network namespaces joined by a veth pair stand for two hosts
//! (each its own network stack and address; nothing of one is on the other's loopback, so
//! every packet crosses the link). In each, a process of this test binary runs soft0 on its
//! namespace's address (`RSRDMA_SOFT_ADDR`): a server echoes what a client sends over `Conn`,
//! on both establishment paths (rdma_cm with soft0's CM, and the TCP handshake), with messages
//! from a few bytes to past the rendezvous threshold (READs of the other host's memory
//! through windows), and over `PacketConn` (UD datagrams, addressed by GID alone, replies to
//! the sender's address from its completion).
//!
//! Needs root and iproute2 (`ip netns`), as CI has; elsewhere it says why it did not run,
//! and under CI (`CI` set) that is a failure.

use rsrdma_net::packet::{Addr, PacketConn, PacketOptions};
use rsrdma_net::{Conn, ConnOptions, Establish, Listener, RawConn, RawListener, RawOptions};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The two hosts' addresses.
const SERVER_IP: &str = "10.199.0.1";
const CLIENT_IP: &str = "10.199.0.2";
/// Messages each client sends (and gets back).
const SIZES: &[usize] = &[1, 100, 4096, 40_000, 300_000, 1 << 20];

fn message(k: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 + k * 7) as u8).collect()
}

fn opts(establish: Establish) -> ConnOptions {
    ConnOptions::default()
        .device("soft0")
        .establish(establish)
        .rendezvous(Some(64 * 1024))
}

fn establish_of(name: &str) -> Establish {
    match name {
        "tcp" => Establish::Tcp,
        _ => Establish::Cm,
    }
}

/// Two network namespaces and the veth pair between them; removed on drop.
struct Hosts {
    server: String,
    client: String,
}

impl Hosts {
    /// `None` (after saying why) where namespaces cannot be made: not root, no `ip`.
    fn new() -> Option<Hosts> {
        let why = if unsafe_geteuid() != 0 {
            Some("not root")
        } else if Command::new("ip")
            .arg("-V")
            .stdout(Stdio::null())
            .status()
            .is_err()
        {
            Some("no `ip` (iproute2)")
        } else {
            None
        };
        if let Some(why) = why {
            assert!(
                std::env::var_os("CI").is_none(),
                "soft0 between hosts cannot run under CI: {why}"
            );
            eprintln!("SKIPPED soft0 between hosts: {why}");
            return None;
        }
        // Unique per test of this process too (the tests run in parallel).
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 10;
        let tag = std::process::id() % 100_000 * 10 + n;
        let h = Hosts {
            server: format!("rsrdma-s{tag}"),
            client: format!("rsrdma-c{tag}"),
        };
        let (vs, vc) = (format!("rsv{tag}s"), format!("rsv{tag}c"));
        let steps: Vec<Vec<String>> = vec![
            vec!["netns".into(), "add".into(), h.server.clone()],
            vec!["netns".into(), "add".into(), h.client.clone()],
            words(&format!("link add {vs} type veth peer name {vc}")),
            words(&format!("link set {vs} netns {}", h.server)),
            words(&format!("link set {vc} netns {}", h.client)),
            words(&format!("-n {} addr add {SERVER_IP}/24 dev {vs}", h.server)),
            words(&format!("-n {} addr add {CLIENT_IP}/24 dev {vc}", h.client)),
            words(&format!("-n {} link set {vs} up", h.server)),
            words(&format!("-n {} link set {vc} up", h.client)),
            words(&format!("-n {} link set lo up", h.server)),
            words(&format!("-n {} link set lo up", h.client)),
        ];
        for s in steps {
            let out = Command::new("ip").args(&s).output().unwrap();
            assert!(
                out.status.success(),
                "ip {}: {}",
                s.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Some(h)
    }

    /// Starts this test binary's helper `name` in namespace `ns`, soft0 on `ip` (on loopback
    /// for an empty one: no `RSRDMA_SOFT_ADDR`).
    fn run(&self, ns: &str, ip: &str, name: &str, env: &[(&str, String)]) -> Child {
        let exe = std::env::current_exe().unwrap();
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns])
            .arg(exe)
            .args([
                "--ignored",
                "--exact",
                name,
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env("RSRDMA_SOFT_DEVICE", "1")
            .env("RSRDMA_SOFT_CM", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if ip.is_empty() {
            c.env_remove("RSRDMA_SOFT_ADDR");
        } else {
            c.env("RSRDMA_SOFT_ADDR", ip);
        }
        for (k, v) in env {
            c.env(k, v);
        }
        c.spawn().unwrap()
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for ns in [&self.server, &self.client] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

fn words(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_string).collect()
}

fn unsafe_geteuid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Reads the helper's stdout until a line holding `marker` (the test harness may have
/// written its own words before it on that line); returns what follows the marker.
fn line_with(out: &mut impl BufRead, marker: &str) -> Option<String> {
    let mut line = String::new();
    loop {
        line.clear();
        if out.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if let Some(at) = line.find(marker) {
            return Some(line[at + marker.len()..].trim().to_string());
        }
    }
}

#[test]
fn conn_between_two_hosts_on_both_establishment_paths() {
    let Some(hosts) = Hosts::new() else {
        return;
    };
    for path in ["cm", "tcp"] {
        let mut server = hosts.run(
            &hosts.server,
            SERVER_IP,
            "helper_echo_server",
            &[("SOFT_HOSTS_PATH", path.into())],
        );
        let mut out = BufReader::new(server.stdout.take().unwrap());
        let port = line_with(&mut out, "PORT ").expect("the server's port");
        let client = hosts.run(
            &hosts.client,
            CLIENT_IP,
            "helper_client",
            &[
                ("SOFT_HOSTS_PATH", path.into()),
                ("SOFT_HOSTS_SERVER", format!("{SERVER_IP}:{port}")),
            ],
        );
        let client = client.wait_with_output().unwrap();
        let client_out = String::from_utf8_lossy(&client.stdout);
        eprintln!("{path}: the client said: {}", client_out.trim());
        assert!(client.status.success(), "{path}: the client failed");
        assert!(
            client_out.contains(&format!("CLIENT OK {}", SIZES.len())),
            "{path}: {client_out}"
        );
        let served = line_with(&mut out, "SERVED ");
        assert!(
            server.wait().unwrap().success(),
            "{path}: the server failed"
        );
        assert_eq!(served.as_deref(), Some("6"), "{path}");
    }
}

/// Datagram sizes the UD client sends (and gets back).
const DATAGRAMS: &[usize] = &[1, 100, 1000, 4000];

#[test]
fn datagrams_between_two_hosts_by_gid_alone() {
    let Some(hosts) = Hosts::new() else {
        return;
    };
    let mut server = hosts.run(&hosts.server, SERVER_IP, "helper_datagram_server", &[]);
    let mut out = BufReader::new(server.stdout.take().unwrap());
    let addr = line_with(&mut out, "ADDR ").expect("the server's address");
    let client = hosts.run(
        &hosts.client,
        CLIENT_IP,
        "helper_datagram_client",
        &[("SOFT_HOSTS_SERVER", addr)],
    );
    let client = client.wait_with_output().unwrap();
    let client_out = String::from_utf8_lossy(&client.stdout);
    eprintln!("datagrams: the client said: {}", client_out.trim());
    assert!(client.status.success(), "the client failed");
    assert!(
        client_out.contains(&format!("DATAGRAMS OK {}", DATAGRAMS.len())),
        "{client_out}"
    );
    let echoed = line_with(&mut out, "ECHOED ");
    assert!(server.wait().unwrap().success(), "the server failed");
    assert_eq!(echoed, Some(DATAGRAMS.len().to_string()));
}

fn packet_opts() -> PacketOptions {
    PacketOptions::default()
        .device("soft0")
        .read_timeout(Duration::from_secs(20))
}

/// Helper (run in the server's namespace): binds a UD endpoint, says its address, and sends
/// each datagram back to its sender.
#[test]
#[ignore = "a helper process of datagrams_between_two_hosts_by_gid_alone"]
fn helper_datagram_server() {
    let p = PacketConn::bind(packet_opts()).unwrap();
    println!("ADDR {}", p.local_addr());
    let mut buf = vec![0u8; 8192];
    for _ in DATAGRAMS {
        let (n, from) = p.recv_from(&mut buf).unwrap();
        p.send_to(&buf[..n], &from).unwrap();
    }
    p.flush(Duration::from_secs(5)).unwrap();
    println!("ECHOED {}", DATAGRAMS.len());
}

/// Helper (run in the client's namespace): sends each datagram to the server's address (a
/// GID of the other host and a QP number) and checks what comes back, and from where.
#[test]
#[ignore = "a helper process of datagrams_between_two_hosts_by_gid_alone"]
fn helper_datagram_client() {
    let server: Addr = std::env::var("SOFT_HOSTS_SERVER").unwrap().parse().unwrap();
    let p = PacketConn::bind(packet_opts()).unwrap();
    let mut buf = vec![0u8; 8192];
    for (k, &len) in DATAGRAMS.iter().enumerate() {
        let m = message(k, len);
        p.send_to(&m, &server).unwrap();
        let (n, from) = p.recv_from(&mut buf).unwrap();
        assert!(
            buf[..n] == m[..],
            "datagram {k} of {len} B came back different"
        );
        assert_eq!(from, server, "the reply came from the server's address");
    }
    println!("DATAGRAMS OK {}", DATAGRAMS.len());
}

/// Helper (run by the test above in the server's namespace): accepts one connection, echoes
/// every message until the end of the stream, then closes.
#[test]
#[ignore = "a helper process of conn_between_two_hosts_on_both_establishment_paths"]
fn helper_echo_server() {
    let path = std::env::var("SOFT_HOSTS_PATH").unwrap();
    let l = Listener::bind(format!("{SERVER_IP}:0"), opts(establish_of(&path))).unwrap();
    println!("PORT {}", l.local_addr().port());
    let c = l.accept().unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut n = 0;
    while let Some(m) = c.recv_msg().unwrap() {
        c.send_msg(&m).unwrap();
        n += 1;
    }
    c.close().unwrap();
    println!("SERVED {n}");
}

/// Helper (run in the client's namespace): dials the server, sends each message and checks
/// its echo byte for byte.
#[test]
#[ignore = "a helper process of conn_between_two_hosts_on_both_establishment_paths"]
fn helper_client() {
    let path = std::env::var("SOFT_HOSTS_PATH").unwrap();
    let server = std::env::var("SOFT_HOSTS_SERVER").unwrap();
    let c = Conn::dial(server.as_str(), opts(establish_of(&path))).unwrap();
    assert_eq!(c.peer_addr().ip().to_string(), SERVER_IP);
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    for (k, &len) in SIZES.iter().enumerate() {
        let m = message(k, len);
        c.send_msg(&m).unwrap();
        let back = c.recv_msg().unwrap().expect("an echo");
        assert!(back == m, "message {k} of {len} B came back different");
    }
    c.shutdown(std::net::Shutdown::Write).unwrap();
    assert!(c.recv_msg().unwrap().is_none());
    c.close().unwrap();
    println!("CLIENT OK {}", SIZES.len());
}

/// A listener whose soft0 is on loopback (no `RSRDMA_SOFT_ADDR`) hears another host's
/// rdma_cm request through the unspecified address, and refuses it: the dialer reads that
/// the listener's device cannot be reached from its host. Before, the connection came up and
/// its first send failed with RETRY_EXC_ERR (its queue pair sent to the dialer's own
/// loopback): an outside tester's find.
#[test]
fn a_loopback_soft0_refuses_another_hosts_request_and_says_why() {
    let Some(hosts) = Hosts::new() else {
        return;
    };
    let mut server = hosts.run(&hosts.server, "", "helper_loopback_listener", &[]);
    let mut out = BufReader::new(server.stdout.take().unwrap());
    let port = line_with(&mut out, "PORT ").expect("the server's port");
    let client = hosts.run(
        &hosts.client,
        CLIENT_IP,
        "helper_refused_dialer",
        &[("SOFT_HOSTS_SERVER", format!("{SERVER_IP}:{port}"))],
    );
    let client = client.wait_with_output().unwrap();
    let _ = server.kill();
    let _ = server.wait();
    let said = String::from_utf8_lossy(&client.stdout);
    assert!(client.status.success(), "the dialer failed: {said}");
    let refusal = said
        .lines()
        .find_map(|l| l.split("REFUSED ").nth(1))
        .unwrap_or_else(|| panic!("the dial was not refused: {said}"));
    assert!(
        refusal.contains("cannot be reached from this host"),
        "{refusal}"
    );
}

/// Helper: a listener on rdma_cm on every address, soft0 on loopback.
#[test]
#[ignore = "a helper process of a_loopback_soft0_refuses_another_hosts_request_and_says_why"]
fn helper_loopback_listener() {
    let l = Listener::bind("0.0.0.0:0", opts(Establish::Cm)).unwrap();
    println!("PORT {}", l.local_addr().port());
    let _ = l.accept_timeout(Duration::from_secs(20));
}

/// Helper: dials the server on rdma_cm; says how the dial was refused.
#[test]
#[ignore = "a helper process of a_loopback_soft0_refuses_another_hosts_request_and_says_why"]
fn helper_refused_dialer() {
    let server = std::env::var("SOFT_HOSTS_SERVER").unwrap();
    let o = opts(Establish::Cm).connect_timeout(Duration::from_secs(5));
    match Conn::dial(server.as_str(), o) {
        Ok(_) => println!("CONNECTED"),
        Err(e) => println!("REFUSED {e}"),
    }
}

/// A queue pair whose peer host becomes unreachable (its link down, then its process
/// killed) ends its outstanding request with RETRY_EXC_ERR within soft0's silence limit
/// (5 s), as a NIC's requester gives up after its retries; it waited for TCP's own give-up,
/// about 15 minutes (an outside tester's RawConn had no completion for minutes).
#[test]
fn a_request_to_a_host_that_went_silent_ends_with_retry_exc_err() {
    let Some(hosts) = Hosts::new() else {
        return;
    };
    let mut stream = Stream::start(&hosts, 1 << 16, None);
    // The client's host loses its link, and the server's process goes.
    hosts.set_client_link("down");
    let went = std::time::Instant::now();
    let _ = stream.server.kill();
    let _ = stream.server.wait();
    let ended = line_with(&mut stream.said, "ENDED ");
    let took = went.elapsed();
    let _ = stream.client.wait();
    let ended = ended.expect("the writer's end");
    assert!(ended.contains("RETRY_EXC_ERR"), "{ended}");
    eprintln!("the writer ended {took:?} after its host went silent: {ended}");
    assert!(took < Duration::from_secs(12), "it took {took:?}: {ended}");
}

/// A peer process on the other host stopped (`SIGSTOP`, a debugger) for longer than the
/// silence limit, while a stream of 1 MiB WRITEs fills the link and its window, fails
/// nothing: its kernel still acknowledges, so the requests wait and complete once it
/// continues, as on a NIC (with `TCP_USER_TIMEOUT`, which Linux applies to a window that
/// stays full, a 10 s stop failed them with RETRY_EXC_ERR: an outside tester's find).
#[test]
fn a_peer_process_stopped_past_the_silence_limit_fails_nothing() {
    let Some(hosts) = Hosts::new() else {
        return;
    };
    let stream = Stream::start(&hosts, 1 << 20, Some(9));
    let pid = stream.server.id().to_string();
    let signal = |sig: &str| {
        let ok = Command::new("kill").args([sig, &pid]).status().unwrap();
        assert!(ok.success(), "kill {sig}");
    };
    signal("-STOP");
    std::thread::sleep(Duration::from_secs(7));
    signal("-CONT");
    stream.ends_all_ok();
}

/// A link down for less than the silence limit (4.5 s) mid-stream fails nothing: TCP's
/// backed-off retransmission, after the link came back, is answered, and the keepalive probe
/// of the fifth second too (a rule of silence alone, and four probes, each ended such a link
/// as it came back: an outside tester's find).
#[test]
fn a_link_down_for_less_than_the_silence_limit_fails_nothing() {
    let Some(hosts) = Hosts::new() else {
        return;
    };
    let stream = Stream::start(&hosts, 1 << 20, Some(10));
    hosts.set_client_link("down");
    std::thread::sleep(Duration::from_millis(4500));
    hosts.set_client_link("up");
    stream.ends_all_ok();
}

/// A stream of WRITEs of a whole region from the client's host into a target on the
/// server's, under way.
struct Stream {
    server: Child,
    client: Child,
    said: BufReader<std::process::ChildStdout>,
}

impl Stream {
    /// Starts a target with a region of `region` bytes and a writer that writes for `secs`
    /// seconds (`None`: until a WRITE fails), and waits until it writes (and a moment more).
    fn start(hosts: &Hosts, region: usize, secs: Option<u32>) -> Stream {
        let mut server = hosts.run(
            &hosts.server,
            SERVER_IP,
            "helper_raw_target",
            &[("SOFT_HOSTS_REGION", region.to_string())],
        );
        let mut out = BufReader::new(server.stdout.take().unwrap());
        let port = line_with(&mut out, "PORT ").expect("the server's port");
        let mut env = vec![("SOFT_HOSTS_SERVER", format!("{SERVER_IP}:{port}"))];
        env.extend(secs.map(|s| ("SOFT_HOSTS_WRITE_FOR", s.to_string())));
        let mut client = hosts.run(&hosts.client, CLIENT_IP, "helper_raw_writer", &env);
        let mut said = BufReader::new(client.stdout.take().unwrap());
        line_with(&mut said, "WRITING").expect("the writer's start");
        std::thread::sleep(Duration::from_millis(300));
        Stream {
            server,
            client,
            said,
        }
    }

    /// Waits for the writer's end, which must be every WRITE done.
    fn ends_all_ok(mut self) {
        let ended = line_with(&mut self.said, "ENDED ");
        let _ = self.client.wait();
        let _ = self.server.kill();
        let _ = self.server.wait();
        let ended = ended.expect("the writer's end");
        assert!(ended.starts_with("ALL OK"), "{ended}");
    }
}

impl Hosts {
    /// Takes the client host's link `"down"` or `"up"`.
    fn set_client_link(&self, state: &str) {
        // `Hosts::new` names the veth end after the namespace's tag.
        let veth = format!("rsv{}c", &self.client["rsrdma-c".len()..]);
        let ok = Command::new("ip")
            .args(["-n", &self.client, "link", "set", &veth, state])
            .status()
            .unwrap();
        assert!(ok.success(), "link {state}");
    }
}

fn raw_opts() -> RawOptions {
    RawOptions::default()
        .device("soft0")
        .remote_access(rsrdma::AccessFlags::REMOTE_WRITE)
}

/// Helper: exposes a writable region to one RawConn, then waits to be killed.
#[test]
#[ignore = "a helper process of a_request_to_a_host_that_went_silent_ends_with_retry_exc_err"]
fn helper_raw_target() {
    use rsrdma::AccessFlags;
    let size: usize = std::env::var("SOFT_HOSTS_REGION").unwrap().parse().unwrap();
    let l = RawListener::bind("0.0.0.0:0", raw_opts()).unwrap();
    println!("PORT {}", l.local_addr().unwrap().port());
    let mut c = l.accept().unwrap();
    let land = c
        .register_memory(size, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    c.exchange_memory(&[&land]).unwrap();
    std::thread::sleep(Duration::from_secs(60));
}

/// Helper: WRITEs the whole of the target's region, up to 32 at once, until one fails (says
/// how), or, with `SOFT_HOSTS_WRITE_FOR` seconds, until then (says `ALL OK`).
#[test]
#[ignore = "a helper process of the tests above"]
fn helper_raw_writer() {
    use rsrdma::{AccessFlags, SendWr, Wc};
    let server = std::env::var("SOFT_HOSTS_SERVER").unwrap();
    let write_for = std::env::var("SOFT_HOSTS_WRITE_FOR")
        .ok()
        .and_then(|s| s.parse().ok())
        .map(Duration::from_secs);
    let mut c = RawConn::dial(server.as_str(), raw_opts()).unwrap();
    c.exchange_memory(&[]).unwrap();
    let peer = c.peer_region().unwrap();
    let len = peer.len as usize;
    let local = c.register_memory(len, AccessFlags::LOCAL_WRITE).unwrap();
    println!("WRITING");
    let started = std::time::Instant::now();
    let mut wcs = [Wc::default(); 32];
    let (mut posted, mut done) = (0u64, 0u64);
    loop {
        let writing = write_for.map_or(true, |t| started.elapsed() < t);
        while writing && posted - done < 32 {
            let sge = [local.sge(0, len).unwrap()];
            let w = SendWr::rdma_write(posted, &sge, peer.addr, peer.rkey).signaled(true);
            // SAFETY: `local` outlives the request, which completes (or fails) below.
            unsafe { c.post_send(&w).unwrap() };
            posted += 1;
        }
        if !writing && done == posted {
            println!("ENDED ALL OK: {done} writes");
            return;
        }
        match c.send_cq().poll_blocking(&mut wcs, Duration::from_secs(60)) {
            Ok(n) if n > 0 => {
                for wc in &wcs[..n] {
                    if wc.ok().is_err() {
                        println!("ENDED {:?} after {done} writes", wc.status());
                        return;
                    }
                    done += 1;
                }
            }
            other => {
                println!("ENDED no completion: {other:?}");
                return;
            }
        }
    }
}
