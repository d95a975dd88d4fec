//! The handshake driver over loopback TCP: authentication, mismatches, garbage and silent
//! peers. No RDMA device is involved.

use rsrdma::Gid;
use rsrdma_net::handshake::{Channel, Endpoint, Regions, Role};
use rsrdma_net::NetError;
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(5);

fn pair() -> (Channel, Channel) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let c = TcpStream::connect(addr).unwrap();
    let (s, _) = l.accept().unwrap();
    (
        Channel::new(c, Role::Client, T).unwrap(),
        Channel::new(s, Role::Server, T).unwrap(),
    )
}

fn endpoint(size: u64) -> Endpoint {
    Endpoint {
        qp_num: 5,
        psn: 6,
        lid: 0,
        gid: Gid([2; 16]),
        gid_index: 1,
        mtu: 1024,
        qp_type: 0,
        send_depth: 64,
        recv_depth: 64,
        max_inline: 0,
        max_rd_atomic: 4,
        max_dest_rd_atomic: 4,
        params: vec![(1, size)],
    }
}

#[test]
fn full_exchange_with_a_shared_secret() {
    let (mut c, mut s) = pair();
    let server = thread::spawn(move || {
        s.authenticate(Some(b"k3y")).unwrap();
        let (peer, settled) = s
            .exchange_endpoints(&endpoint(64), |_| "size".into())
            .unwrap();
        let regions = s.exchange_regions(&Regions::default()).unwrap();
        s.barrier(1).unwrap();
        (peer, settled, regions)
    });
    c.authenticate(Some(b"k3y")).unwrap();
    let (peer, _) = c
        .exchange_endpoints(&endpoint(64), |_| "size".into())
        .unwrap();
    let mine = Regions(vec![rsrdma::RemoteMemory {
        addr: 0x1000,
        len: 64,
        rkey: 9,
    }]);
    let theirs = c.exchange_regions(&mine).unwrap();
    c.barrier(1).unwrap();
    let (speer, settled, sregions) = server.join().unwrap();
    assert_eq!(peer.qp_num, 5);
    assert_eq!(speer.gid, Gid([2; 16]));
    assert_eq!(settled.mtu, 1024);
    assert_eq!(sregions, mine);
    assert!(theirs.0.is_empty());
}

#[test]
fn a_stranger_without_the_secret_learns_nothing() {
    let (mut c, mut s) = pair();
    let server = thread::spawn(move || s.authenticate(Some(b"secret")).unwrap_err());
    let e = c.authenticate(None).unwrap_err();
    assert!(matches!(e, NetError::Auth(_)), "{e}");
    assert!(matches!(
        server.join().unwrap(),
        NetError::PeerAborted(_) | NetError::Auth(_)
    ));
}

#[test]
fn a_wrong_secret_is_refused_on_both_sides() {
    let (mut c, mut s) = pair();
    let server = thread::spawn(move || s.authenticate(Some(b"right")).unwrap_err());
    let e = c.authenticate(Some(b"wrong")).unwrap_err();
    assert!(
        matches!(e, NetError::Auth(_) | NetError::PeerAborted(_)),
        "{e}"
    );
    let se = server.join().unwrap();
    assert!(
        matches!(se, NetError::Auth(_) | NetError::PeerAborted(_)),
        "{se}"
    );
}

#[test]
fn differing_options_are_reported_on_both_ends() {
    let (mut c, mut s) = pair();
    let server = thread::spawn(move || {
        s.authenticate(None).unwrap();
        s.exchange_endpoints(&endpoint(4096), |_| "size".into())
            .unwrap_err()
    });
    c.authenticate(None).unwrap();
    let e = c
        .exchange_endpoints(&endpoint(65536), |_| "size".into())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("size") && e.contains("65536") && e.contains("4096"),
        "{e}"
    );
    let se = server.join().unwrap().to_string();
    assert!(
        se.contains("size") && se.contains("4096") && se.contains("65536"),
        "{se}"
    );
}

#[test]
fn garbage_gives_a_clear_error() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let writer = thread::spawn(move || {
        let mut t = TcpStream::connect(addr).unwrap();
        t.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        thread::sleep(Duration::from_millis(200));
    });
    let (s, _) = l.accept().unwrap();
    let mut s = Channel::new(s, Role::Server, T).unwrap();
    let e = s.authenticate(None).unwrap_err();
    assert!(matches!(e, NetError::Malformed(_)), "{e}");
    assert!(e.to_string().contains("magic"), "{e}");
    writer.join().unwrap();
}

#[test]
fn a_silent_peer_times_out_and_a_vanished_one_is_named() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let silent = TcpStream::connect(addr).unwrap();
    let (s, _) = l.accept().unwrap();
    let mut s = Channel::new(s, Role::Server, Duration::from_millis(300)).unwrap();
    let t0 = Instant::now();
    let e = s.authenticate(None).unwrap_err();
    assert!(matches!(e, NetError::Timeout { .. }), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(3));
    drop(silent);

    let gone = TcpStream::connect(addr).unwrap();
    let (s, _) = l.accept().unwrap();
    drop(gone);
    let mut s = Channel::new(s, Role::Server, T).unwrap();
    let e = s.authenticate(None).unwrap_err();
    assert!(
        matches!(e, NetError::PeerClosed(_) | NetError::Io { .. }),
        "{e}"
    );
}
