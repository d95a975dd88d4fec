//! What the Conn device tests (blocking and async) share: the device under test as the VM
//! names it, options on it, where listeners bind, and a test payload.

// Each test binary uses its own subset.
#![allow(dead_code)]

use rsrdma_net::{ConnOptions, Establish};

/// The device's IPv4 address (rdma_cm cannot use 127.0.0.1 over rxe).
pub fn ip() -> String {
    std::env::var("RSRDMA_TEST_IP").unwrap_or_else(|_| "10.77.0.1".into())
}

pub fn device() -> String {
    std::env::var("RSRDMA_TEST_DEVICE").unwrap_or_else(|_| "rxe0".into())
}

pub fn gid_index() -> Option<u8> {
    std::env::var("RSRDMA_TEST_GID_INDEX")
        .ok()
        .and_then(|v| v.parse().ok())
}

/// Options for the device under test on `path`.
pub fn opts(path: Establish) -> ConnOptions {
    ConnOptions::default()
        .establish(path)
        .device(device())
        .gid_index(gid_index())
}

/// Where a listener for `o` binds (port 0): loopback for the TCP handshake, the device's
/// address for rdma_cm.
pub fn listen_addr(o: &ConnOptions) -> String {
    let host = match o.establish {
        Establish::Tcp => "127.0.0.1".to_string(),
        _ => ip(),
    };
    format!("{host}:0")
}

/// `len` pseudo-random bytes that differ per `seed` (xorshift), made a word at a time: the
/// tests run unoptimized, under an emulated CPU in the VM, where a byte at a time cost
/// 8 ms per 40 KB (most of `shared_recv_256_connections_within_64_mib`'s exchange).
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v = vec![0u8; len];
    for chunk in v.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    v
}

/// A 64-bit FNV-style hash of `bytes`, a word at a time (for the reason `pattern` is).
pub fn hash_of(bytes: &[u8]) -> u64 {
    bytes.chunks(8).fold(0xcbf2_9ce4_8422_2325u64, |h, c| {
        let mut w = [0u8; 8];
        w[..c.len()].copy_from_slice(c);
        (h ^ u64::from_le_bytes(w)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// What a death test's child peer reads from `env` (set by its parent as `"cm ADDR"` or
/// `"tcp ADDR"`): the establishment path and the listener's address.
pub fn child_peer_spec(env: &str) -> (Establish, std::net::SocketAddr) {
    let spec = std::env::var(env).unwrap();
    let (path, addr) = spec.split_once(' ').unwrap();
    let path = if path == "cm" {
        Establish::Cm
    } else {
        Establish::Tcp
    };
    (path, addr.parse().unwrap())
}

/// Fills this process's descriptor table: lowers its limit to a little above the highest
/// descriptor open now, then duplicates stdin until the kernel says EMFILE. Dropping what
/// it returns frees the table again. For child processes only: every thread of the process
/// runs out of descriptors meanwhile.
pub fn fill_descriptor_table() -> Vec<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let highest = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u64>().ok())
        .max()
        .unwrap_or(2);
    let limit = libc::rlimit {
        rlim_cur: highest + 32,
        rlim_max: highest + 32,
    };
    // SAFETY: plain system call on this process, with a valid rlimit.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
    let mut fds = Vec::new();
    loop {
        // SAFETY: plain system call; a non-negative return is a new descriptor we own.
        let fd = unsafe { libc::dup(0) };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            assert_eq!(e.raw_os_error(), Some(libc::EMFILE), "{e}");
            return fds;
        }
        // SAFETY: `fd` was just returned by dup, owned by nobody else.
        fds.push(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) });
    }
}

/// Drops `fds` after `delay` on a thread of its own; the flag says it happened.
pub fn free_later(
    fds: Vec<std::os::fd::OwnedFd>,
    delay: std::time::Duration,
) -> (
    std::sync::Arc<std::sync::atomic::AtomicBool>,
    std::thread::JoinHandle<()>,
) {
    let freed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = freed.clone();
    let freer = std::thread::spawn(move || {
        std::thread::sleep(delay);
        drop(fds);
        flag.store(true, std::sync::atomic::Ordering::SeqCst);
    });
    (freed, freer)
}

/// Runs `child` (a test of this binary) with `env` set, and returns it with the address it
/// prints after "listening "; the rest of its output is copied to this process's stderr.
pub fn spawn_listening_child(
    child: &str,
    env: &str,
) -> (std::process::Child, std::net::SocketAddr) {
    let mut c = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", child, "--ignored", "--nocapture"])
        .env(env, "1")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = c.stdout.take().unwrap();
    let (mut seen, mut buf, t0) = (String::new(), [0u8; 256], std::time::Instant::now());
    let addr = loop {
        if let Some(rest) = seen.split("listening ").nth(1) {
            if let Some((addr, _)) = rest.split_once('\n') {
                break addr.trim().parse().unwrap();
            }
        }
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(20),
            "the child said: {seen}"
        );
        let n = std::io::Read::read(&mut out, &mut buf).unwrap();
        assert!(n > 0, "the child exited: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    };
    // The rest of its output goes on to ours (a closed pipe would fail the child's writes).
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::stderr()));
    (c, addr)
}

/// What two racing closes of one connection must say when its queued data cannot be
/// delivered: both the linger's timeout, and neither before the linger ran out (the second,
/// started later, waits for the first's teardown).
pub fn assert_racing_closes_both_lingered(
    (first, first_took): (rsrdma_net::Result<()>, std::time::Duration),
    (second, second_took): (rsrdma_net::Result<()>, std::time::Duration),
    linger: std::time::Duration,
) {
    use rsrdma_net::NetError;
    assert!(matches!(first, Err(NetError::Timeout { .. })), "{first:?}");
    assert!(
        matches!(second, Err(NetError::Timeout { .. })),
        "{second:?}"
    );
    assert!(first_took >= linger, "{first_took:?}");
    assert!(
        second_took >= linger,
        "the second close returned after {second_took:?}"
    );
}

/// What a large send that a close on another thread ended must say in `round`: `Ok` exactly
/// when the peer got the message (`got` messages), `Closed` exactly when it did not; and the
/// close `Ok` either way.
pub fn assert_close_told_the_truth(
    round: u64,
    closed: rsrdma_net::Result<()>,
    sent: rsrdma_net::Result<()>,
    got: usize,
) {
    use rsrdma_net::NetError;
    assert!(closed.is_ok(), "round {round}: close {closed:?}");
    match sent {
        Ok(()) => assert_eq!(got, 1, "round {round}: Ok, yet the peer got nothing"),
        Err(NetError::Closed { .. }) => {
            assert_eq!(got, 0, "round {round}: Closed, yet the peer got it")
        }
        Err(e) => panic!("round {round}: {e}"),
    }
}

/// `n` sockets connected to `addr` that each send a valid client hello (no secret) and then
/// nothing: peers that hold a listener if a hello alone opens them.
pub fn hello_then_silent(addr: std::net::SocketAddr, n: usize) -> Vec<std::net::TcpStream> {
    use rsrdma_net::handshake::{Hello, Message, Role};
    use std::io::Write;
    let hello = Message::Hello(Hello {
        role: Role::Client,
        auth_required: false,
        nonce: [7; 32],
    })
    .to_bytes()
    .unwrap();
    (0..n)
        .map(|_| {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.write_all(&hello).unwrap();
            s
        })
        .collect()
}

/// A UD address nobody answers for: 192.0.2.1 (TEST-NET-1), IPv4-mapped, on the VM's link,
/// so rxe takes about a second to refuse its address handle.
pub fn unanswered_addr(qpn: u32) -> rsrdma_net::packet::Addr {
    let mut gid = rsrdma::Gid([0; 16]);
    gid.0[10..].copy_from_slice(&[0xff, 0xff, 192, 0, 2, 1]);
    rsrdma_net::packet::Addr::new(gid, qpn)
}

/// Checks a send to [`unanswered_addr`] that took `stuck` and failed with `e`, while other
/// work beside it took `others`: the handle was slow enough to test anything, and the other
/// work did not wait for it.
pub fn assert_not_held_up(
    e: &rsrdma_net::NetError,
    stuck: std::time::Duration,
    others: std::time::Duration,
) {
    assert!(e.to_string().contains("ibv_create_ah"), "{e}");
    assert!(
        stuck >= std::time::Duration::from_millis(400),
        "the test needs a slow address handle: {stuck:?}"
    );
    assert!(
        others < stuck / 2,
        "the other work waited for it: {others:?} against {stuck:?}"
    );
}

/// Checks that a good client dialled behind 8 hello-then-silent peers got in at once.
pub fn assert_good_client_in_time(took: std::time::Duration, n: rsrdma_net::ListenerCounters) {
    eprintln!("good client behind 8 hello-then-silent peers in {took:?}; {n:?}");
    assert!(
        took < std::time::Duration::from_secs(5),
        "the good client waited {took:?}"
    );
}

/// A peer of a Conn listener's TCP path, without a secret, that sends a well-formed hello and
/// endpoint (a real queue pair on the device under test, default Conn parameters) and then
/// stops: it never meets the closing barrier. What it holds must stay alive with it.
pub struct EndpointThenStall {
    _ch: rsrdma_net::handshake::Channel,
    _qp: rsrdma::Qp,
    _cq: rsrdma::Cq,
}

/// `n` peers that each stall after their endpoint (see [`EndpointThenStall`]).
pub fn endpoint_then_stall(addr: std::net::SocketAddr, n: usize) -> Vec<EndpointThenStall> {
    use rsrdma_net::handshake::{Channel, Role};
    let ctx = rsrdma::open(&device()).unwrap();
    let pd = rsrdma::Pd::new(&ctx).unwrap();
    let gid_index = ctx.resolve_gid_index(1, gid_index()).unwrap();
    (0..n)
        .map(|_| {
            let cq = rsrdma::Cq::new(&ctx, 64, None).unwrap();
            let qp = rsrdma::Qp::builder(rsrdma::QpType::Rc)
                .build(&pd, &cq, &cq)
                .unwrap();
            let me = qp.endpoint(1, gid_index, 1).unwrap();
            let ep = conn_client_endpoint(&qp, &me, gid_index, rsrdma_proto::Config::default());
            let s = std::net::TcpStream::connect(addr).unwrap();
            let mut ch = Channel::new(s, Role::Client, std::time::Duration::from_secs(5)).unwrap();
            ch.authenticate(None).unwrap();
            ch.exchange_endpoints(&ep, |k| format!("{k:#x}")).unwrap();
            EndpointThenStall {
                _ch: ch,
                _qp: qp,
                _cq: cq,
            }
        })
        .collect()
}

/// The endpoint a Conn dialer announces over the TCP handshake for `qp` (whose endpoint is
/// `me`), with `config`'s parameters as four little-endian words under the client's keys
/// (`0xC100..`).
pub fn conn_client_endpoint(
    qp: &rsrdma::Qp,
    me: &rsrdma::QpEndpoint,
    gid_index: Option<u8>,
    config: rsrdma_proto::Config,
) -> rsrdma_net::handshake::Endpoint {
    let bytes = config.params().encode();
    let params = bytes
        .chunks(8)
        .enumerate()
        .map(|(i, w)| (0xC100 + i as u16, u64::from_le_bytes(w.try_into().unwrap())))
        .collect();
    rsrdma_net::handshake::Endpoint {
        qp_num: me.qp_num,
        psn: me.psn,
        lid: me.lid,
        gid: me.gid,
        gid_index: gid_index.unwrap_or(0),
        mtu: 1024,
        qp_type: 0,
        send_depth: qp.caps().max_send_wr,
        recv_depth: qp.caps().max_recv_wr,
        max_inline: qp.caps().max_inline_data,
        max_rd_atomic: 0,
        max_dest_rd_atomic: 0,
        params,
    }
}

/// How many connections wait in the kernel's accept queue of the IPv4 listening socket at
/// `addr` (`/proc/net/tcp`'s rx_queue of a socket in LISTEN).
pub fn listen_backlog(addr: std::net::SocketAddr) -> u32 {
    let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let local = match addr {
        std::net::SocketAddr::V4(a) => {
            format!(
                "{:08X}:{:04X}",
                u32::from_ne_bytes(a.ip().octets()),
                a.port()
            )
        }
        std::net::SocketAddr::V6(_) => panic!("an IPv4 listener"),
    };
    tcp.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            (f.get(1) == Some(&local.as_str()) && f.get(3) == Some(&"0A")).then(|| {
                let rx = f[4].split(':').nth(1).unwrap();
                u32::from_str_radix(rx, 16).unwrap()
            })
        })
        .sum()
}

/// Waits (at most 20 s) until `n` connections wait in the kernel's queue of the listener at
/// `addr`: an `accept` then takes them all before it returns one.
pub fn await_backlog(addr: std::net::SocketAddr, n: u32) {
    let t0 = std::time::Instant::now();
    while listen_backlog(addr) < n {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(20),
            "the dials never came"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}
