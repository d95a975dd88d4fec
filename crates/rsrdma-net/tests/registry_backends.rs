//! One Registry test suite, two backends: the built-in server and a real etcd, started by
//! the test on loopback (`etcd-server`, which `cargo xtask test` installs). The same
//! semantics must hold on both: register, lookup, unregister, ownership, lease expiry,
//! watches. etcd also gets restarted under a kept registration, which must survive it.

use rsrdma::Gid;
use rsrdma_net::packet::Addr;
use rsrdma_net::registry::{
    ClientOptions, Directory, ErrorCode, EtcdDirectory, EtcdOptions, Registration, RegistryClient,
};
use rsrdma_net::{NetError, Registry, RegistryOptions};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

fn addr(n: u32) -> Addr {
    Addr::new(Gid([n as u8; 16]), n)
}

fn code(r: rsrdma_net::Result<impl std::fmt::Debug>) -> ErrorCode {
    match r {
        Err(NetError::Registry { code, .. }) => code,
        other => panic!("expected a registry error, got {other:?}"),
    }
}

/// Makes a client of the backend under test, as `owner` (`None`: a fresh one).
type Connect<'a> = &'a dyn Fn(Option<[u8; 16]>) -> Box<dyn Directory + Send>;

/// The suite both backends pass. `unique` keeps the names of two runs apart.
fn suite(connect: Connect<'_>, unique: &str) {
    let n = |s: &str| format!("{unique}-{s}");
    // Register, look up, unregister.
    let mut a = connect(None);
    let granted = a
        .register_for(&n("svc"), &addr(1), Duration::from_secs(10))
        .unwrap();
    assert!(granted >= Duration::from_secs(1), "{granted:?}");
    let mut reader = connect(None);
    assert_eq!(reader.lookup(&n("svc")).unwrap(), addr(1));
    assert_eq!(code(reader.lookup(&n("nobody"))), ErrorCode::NotFound);

    // Ownership: another owner can neither overwrite nor remove; the owner can, also from a
    // second client with the same owner.
    let mut b = connect(None);
    assert_ne!(a.owner(), b.owner());
    assert_eq!(
        code(b.register_for(&n("svc"), &addr(66), Duration::ZERO)),
        ErrorCode::NotOwner
    );
    assert_eq!(code(b.unregister(&n("svc"))), ErrorCode::NotOwner);
    assert_eq!(reader.lookup(&n("svc")).unwrap(), addr(1), "untouched");
    let mut a2 = connect(Some(a.owner()));
    a2.register_for(&n("svc"), &addr(2), Duration::from_secs(10))
        .unwrap();
    assert_eq!(reader.lookup(&n("svc")).unwrap(), addr(2));
    a.unregister(&n("svc")).unwrap();
    assert_eq!(code(reader.lookup(&n("svc"))), ErrorCode::NotFound);
    assert_eq!(code(a.unregister(&n("svc"))), ErrorCode::NotFound);
    b.register_for(&n("svc"), &addr(3), Duration::from_secs(10))
        .unwrap();

    // Leases run out; then the name is anyone's.
    let lease = a
        .register_for(&n("short"), &addr(4), Duration::from_secs(1))
        .unwrap();
    let t0 = Instant::now();
    while reader.lookup(&n("short")).is_ok() {
        assert!(
            t0.elapsed() < lease + Duration::from_secs(5),
            "never expired"
        );
        thread::sleep(Duration::from_millis(50));
    }
    eprintln!("lease of {lease:?} ran out after {:?}", t0.elapsed());
    assert!(t0.elapsed() + Duration::from_millis(200) >= lease.min(Duration::from_secs(1)));
    b.register_for(&n("short"), &addr(5), Duration::from_secs(10))
        .unwrap();

    // A watch sees a registration made elsewhere.
    let name = n("watched");
    let late = {
        let name = name.clone();
        let mut c = connect(None);
        thread::spawn(move || {
            thread::sleep(Duration::from_millis(300));
            c.register_for(&name, &addr(9), Duration::from_secs(10))
                .unwrap();
            c
        })
    };
    let t0 = Instant::now();
    let seen = reader.watch(&name, None, Duration::from_secs(10)).unwrap();
    assert_eq!(seen, Some(addr(9)));
    assert!(t0.elapsed() < Duration::from_secs(5));
    let mut c = late.join().unwrap();
    // ... and its removal; a watch with nothing new returns what it saw at the timeout.
    let still = reader
        .watch(&name, Some(addr(9)), Duration::from_millis(100))
        .unwrap();
    assert_eq!(still, Some(addr(9)));
    c.unregister(&name).unwrap();
    assert_eq!(
        reader
            .watch(&name, Some(addr(9)), Duration::from_secs(5))
            .unwrap(),
        None
    );
}

#[test]
fn the_builtin_registry_passes_the_suite() {
    let h = Registry::serve_with("127.0.0.1:0", RegistryOptions::default()).unwrap();
    let at = h.local_addr();
    let connect = move |owner: Option<[u8; 16]>| -> Box<dyn Directory + Send> {
        Box::new(RegistryClient::connect(at, ClientOptions::default().owner(owner)).unwrap())
    };
    suite(&connect, "builtin");
}

/// A real etcd on loopback ports of its own, in a data directory of its own.
struct Etcd {
    child: Option<Child>,
    dir: PathBuf,
    client: SocketAddr,
    peer: SocketAddr,
}

fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

impl Etcd {
    fn start() -> Etcd {
        let dir = std::env::temp_dir().join(format!("rsrdma-etcd-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut e = Etcd {
            child: None,
            dir,
            client: free_port(),
            peer: free_port(),
        };
        e.spawn();
        e
    }

    fn spawn(&mut self) {
        let url = |a: SocketAddr| format!("http://{a}");
        let child = Command::new("etcd")
            .arg("--data-dir")
            .arg(&self.dir)
            .args(["--name", "rsrdma-test"])
            .args(["--listen-client-urls", &url(self.client)])
            .args(["--advertise-client-urls", &url(self.client)])
            .args(["--listen-peer-urls", &url(self.peer)])
            .args(["--initial-advertise-peer-urls", &url(self.peer)])
            .args([
                "--initial-cluster",
                &format!("rsrdma-test={}", url(self.peer)),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start etcd ({e}): the etcd backend's tests need a real etcd; \
                     `cargo xtask test` installs Debian's etcd-server (apt-get install \
                     etcd-server)"
                )
            });
        self.child = Some(child);
        let t0 = Instant::now();
        while EtcdDirectory::connect(self.client, EtcdOptions::default()).is_err() {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "etcd did not come up"
            );
            thread::sleep(Duration::from_millis(100));
        }
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Both etcd tests share one etcd (one start is about a second).
#[test]
fn etcd_passes_the_suite_and_survives_a_restart() {
    let mut etcd = Etcd::start();
    let at = etcd.client;
    let connect = move |owner: Option<[u8; 16]>| -> Box<dyn Directory + Send> {
        Box::new(EtcdDirectory::connect(at, EtcdOptions::default().owner(owner)).unwrap())
    };
    suite(&connect, "etcd");

    // A kept registration across a restart of etcd: the renewer reconnects, the lease (an
    // etcd lease, persisted) goes on, and the name is there after more than a lease.
    let kept = Registration::keep_on_etcd(
        vec![at],
        EtcdOptions::default().lease(Duration::from_secs(3)),
        "kept",
        addr(7),
    )
    .unwrap();
    let mut reader = EtcdDirectory::connect(at, EtcdOptions::default()).unwrap();
    assert_eq!(reader.lookup("kept").unwrap(), addr(7));
    etcd.stop();
    assert!(reader.lookup("kept").is_err(), "etcd is down");
    thread::sleep(Duration::from_secs(1));
    etcd.spawn();
    thread::sleep(kept.lease() + Duration::from_secs(1));
    assert_eq!(
        reader.lookup("kept").unwrap(),
        addr(7),
        "renewed across the restart"
    );
    drop(kept);
    assert_eq!(
        code(reader.lookup("kept")),
        ErrorCode::NotFound,
        "unregistered on drop"
    );
}

/// A stand-in for one etcd endpoint that answers every request with `status` and `body`.
fn fake_etcd(status: &'static str, body: &'static str) -> SocketAddr {
    use std::io::{Read, Write};
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let at = l.local_addr().unwrap();
    thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            // The request: its headers, then Content-Length bytes.
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = s.read(&mut buf) {
                got.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&got);
                if let Some(end) = text.find("\r\n\r\n") {
                    let len: usize = text
                        .lines()
                        .find_map(|l| l.strip_prefix("Content-Length: "))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    if got.len() >= end + 4 + len {
                        break;
                    }
                }
            }
            let reply = format!(
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = s.write_all(reply.as_bytes());
        }
    });
    at
}

/// An etcd endpoint that cannot serve now (HTTP 5xx: no leader, leader changed) passes the
/// request to the next endpoint; when none can, the error says the directory is busy, with
/// etcd's reason. A refusal is final, and a reply that cannot be read is named as such, not
/// as the caller's invalid argument. (Before: the first 503 ended the call though the next
/// endpoint would have served it, and every etcd failure was `InvalidArgument`.)
#[test]
fn an_etcd_endpoint_that_cannot_serve_passes_to_the_next() {
    let unavailable = fake_etcd(
        "503 Service Unavailable",
        r#"{"error":"etcdserver: no leader","message":"etcdserver: no leader","code":14}"#,
    );
    let serving = fake_etcd("200 OK", "{}");
    let both = [unavailable, serving];
    EtcdDirectory::connect(&both[..], EtcdOptions::default()).unwrap();

    let e = EtcdDirectory::connect(unavailable, EtcdOptions::default()).unwrap_err();
    let busy = matches!(&e, NetError::Registry { code: ErrorCode::Busy, message }
        if message.contains("no leader"));
    assert!(busy, "{e:?}");
    let refusing = fake_etcd("400 Bad Request", r#"{"message":"bad request"}"#);
    let e = EtcdDirectory::connect(&[refusing, serving][..], EtcdOptions::default()).unwrap_err();
    assert_eq!(code(Err::<(), _>(e)), ErrorCode::BadRequest);
    let garbled = fake_etcd("200 OK", "not json");
    let e = EtcdDirectory::connect(garbled, EtcdOptions::default()).unwrap_err();
    assert!(matches!(e, NetError::EtcdReply(_)), "{e:?}");
    assert_eq!(e.io_kind(), std::io::ErrorKind::InvalidData);
}
