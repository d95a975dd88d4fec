//! The rs_registry binary: flags, a secret from a file or the environment, a lease, and
//! refusals of bad flags. No device needed.

use rsrdma_net::packet::Addr;
use rsrdma_net::registry::{ClientOptions, RegistryClient};
use rsrdma_net::NetError;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A running rs_registry, killed on drop.
struct Running(Child, SocketAddr);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(args: &[&str], env: Option<&str>) -> Running {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rs_registry"));
    cmd.args(["--listen", "127.0.0.1:0"])
        .args(args)
        .env_remove("RS_REGISTRY_SECRET")
        .stdout(Stdio::piped());
    if let Some(s) = env {
        cmd.env("RS_REGISTRY_SECRET", s);
    }
    let mut child = cmd.spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .split_whitespace()
        .nth(3)
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    Running(child, addr)
}

fn addr() -> Addr {
    "::ffff:10.77.0.1%0x42".parse().unwrap()
}

#[test]
fn serves_with_a_short_lease() {
    let r = start(&["--lease", "0.3"], None);
    let mut c = RegistryClient::connect(r.1, ClientOptions::default()).unwrap();
    assert_eq!(
        c.register("a", &addr()).unwrap(),
        Duration::from_millis(300)
    );
    assert_eq!(c.lookup("a").unwrap(), addr());
    std::thread::sleep(Duration::from_millis(400));
    assert!(matches!(c.lookup("a"), Err(NetError::Registry { .. })));
}

#[test]
fn takes_the_secret_from_a_file_or_the_environment() {
    let dir = std::env::temp_dir().join(format!("rs_registry_test_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("secret");
    std::fs::write(&file, b"s3cret-of-16-bytes\n").unwrap();
    let from_file = start(&["--secret-file", file.to_str().unwrap()], None);
    let from_env = start(&[], Some("s3cret-of-16-bytes"));
    for r in [&from_file, &from_env] {
        let good = ClientOptions::default().secret(b"s3cret-of-16-bytes".to_vec());
        RegistryClient::connect(r.1, good).unwrap().ping().unwrap();
        let bad = ClientOptions::default().secret(b"s3cret-of-16-bytes\n".to_vec());
        assert!(matches!(
            RegistryClient::connect(r.1, bad),
            Err(NetError::Auth(_))
        ));
        assert!(matches!(
            RegistryClient::connect(r.1, ClientOptions::default()),
            Err(NetError::Auth(_))
        ));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn refuses_bad_flags() {
    for args in [
        &["--lease", "-1"][..],
        &["--lease"],
        &["--max-clients", "zero"],
        &["--bogus"],
        &["--secret-file", "/nonexistent/secret"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_rs_registry"))
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("usage: rs_registry"), "{args:?}: {err}");
    }
}
