//! rsrdma-net on a provider without locks (issue 21, F10): `soft0` with
//! `RSRDMA_SOFT_SINGLE_THREADED=1` aborts the process as soon as two threads use one send
//! queue, receive queue, SRQ or CQ at once, as mlx5 with `MLX5_SINGLE_THREADED=1` would
//! corrupt it. A listener's shared receive pool is reposted from the thread of every
//! connection that consumed a slot: without the pool's own lock around `ibv_post_srq_recv`,
//! this test aborts. Its own binary: the setting is read once per process, when soft0 first
//! posts.

use rsrdma_net::{Conn, ConnOptions, Establish, Listener, SharedRecv};
use std::thread;
use std::time::Duration;

const CONNS: usize = 4;
const ROUNDS: usize = 150;

fn opts() -> ConnOptions {
    ConnOptions::default()
        .device("soft0")
        .establish(Establish::Tcp)
        .recv_slots(8)
        .send_slots(8)
        .slot_size(4096)
}

#[test]
fn a_shared_receive_pool_never_posts_to_its_srq_from_two_threads_at_once() {
    // SAFETY (of the environment): set before any thread of this process reads it, in the
    // only test of this binary.
    std::env::set_var("RSRDMA_SOFT_SINGLE_THREADED", "1");
    let l = Listener::bind("127.0.0.1:0", opts().shared_recv(SharedRecv::new(16))).unwrap();
    let addr = l.local_addr();
    let accepting = thread::spawn(move || (0..CONNS).map(|_| l.accept().unwrap()).collect());
    let clients: Vec<Conn> = (0..CONNS)
        .map(|_| Conn::dial(addr, opts()).unwrap())
        .collect();
    let servers: Vec<Conn> = accepting.join().unwrap();
    thread::scope(|sc| {
        for s in &servers {
            sc.spawn(move || {
                s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                while let Some(m) = s.recv_msg().unwrap() {
                    s.send_msg(&m).unwrap();
                }
            });
        }
        for (i, c) in clients.iter().enumerate() {
            sc.spawn(move || {
                c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                for k in 0..ROUNDS {
                    let m = vec![(i * 31 + k) as u8; 100 + k * 13 % 3000];
                    c.send_msg(&m).unwrap();
                    assert_eq!(c.recv_msg().unwrap().as_deref(), Some(&m[..]));
                }
                c.shutdown(std::net::Shutdown::Write).unwrap();
            });
        }
    });
    for c in clients {
        c.close().unwrap();
    }
    for s in servers {
        s.close().unwrap();
    }
}
