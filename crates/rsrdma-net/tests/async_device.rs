//! AsyncConn, AsyncListener and AsyncPacketConn on a real device (rxe0 in the VM), each on
//! one current-thread runtime: 64 connections at once, `tokio::io::copy` of 100 MiB (or
//! RSRDMA_ASYNC_COPY_MIB) verified byte for byte (and by SHA-256 in optimized builds),
//! `Framed`, split halves, half-close, cancelled `recv_msg`, `recv_msg_into` and `send_msg`
//! futures (nothing lost, nothing duplicated), a peer that dies or hangs (a child process),
//! the keeper answering keepalives and sending what `send_msg` left queued while nobody
//! awaits, busy mode, and no thread per connection. Every wait is bounded.
//!
//! Run with `cargo xtask test --filter async` (it builds device targets with their required
//! features), or `cargo build -p rsrdma-net --features tokio --test async_device` and then
//! `cargo xtask vm -- target/debug/deps/async_device-<hash> --test-threads=1`.

use futures::{SinkExt, StreamExt};
use rsrdma_net::progress::PollMode;
use rsrdma_net::{
    AsyncConn, AsyncListener, AsyncPacketConn, ConnOptions, Establish, NetError, PacketOptions,
};
use sha2::{Digest, Sha256};
use std::future::Future;
use std::io::Read;
use std::pin::Pin;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::time::timeout;
use tokio_util::codec::{Framed, LengthDelimitedCodec};

mod support;
use support::{device, gid_index, listen_addr, opts, pattern};

const CHILD_ENV: &str = "RSRDMA_ASYNC_CHILD";
/// The limit of each test's body.
const TEST_LIMIT: Duration = Duration::from_secs(120);

/// Runs `body` on a fresh current-thread runtime, within [`TEST_LIMIT`].
fn run<F: Future<Output = ()>>(body: F) {
    let mut rt = tokio::runtime::Builder::new_current_thread();
    rt.thread_keep_alive(Duration::from_millis(200));
    run_with(rt, body);
}

/// Runs `body` on a fresh multi-thread runtime of two workers, within [`TEST_LIMIT`].
fn run_multi_thread<F: Future<Output = ()>>(body: F) {
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    rt.worker_threads(2);
    run_with(rt, body);
}

/// Runs `body` on the runtime `rt` builds (with every driver), within [`TEST_LIMIT`].
fn run_with<F: Future<Output = ()>>(mut rt: tokio::runtime::Builder, body: F) {
    let rt = rt.enable_all().build().unwrap();
    rt.block_on(async {
        timeout(TEST_LIMIT, body)
            .await
            .expect("the test body timed out")
    });
}

/// Polls `fut` once; `None` (dropping it) when pending.
async fn poll_once<F: Future>(fut: F) -> Option<F::Output> {
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(|cx| match fut.as_mut().poll(cx) {
        Poll::Ready(v) => Poll::Ready(Some(v)),
        Poll::Pending => Poll::Ready(None),
    })
    .await
}

fn listen(o: ConnOptions) -> AsyncListener {
    AsyncListener::bind(listen_addr(&o), o).unwrap()
}

/// (dialer, acceptor), both on the current runtime.
async fn pair(client: ConnOptions, server: ConnOptions) -> (AsyncConn, AsyncConn) {
    let l = listen(server);
    let addr = l.local_addr();
    let (c, s) = tokio::join!(AsyncConn::dial(addr, client), l.accept());
    (c.unwrap(), s.unwrap())
}

/// (dialer, acceptor) on the TCP path with no keepalive: nothing steps the connections but
/// their callers and the keeper's own wake-ups, so a lost wake-up shows as a hang.
async fn pair_without_keepalive() -> (AsyncConn, AsyncConn) {
    let mut o = opts(Establish::Tcp);
    o.keepalive = None;
    pair(o.clone(), o).await
}

/// Threads of this process with `name` (the blocking Conn's progress thread is "rsrdma-conn").
fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|c| c.trim() == name)
        .count()
}

/// The process's threads, less soft0's own (its timer, listeners and CM start with the
/// first use of the device, in whichever test comes first: a count taken before them would
/// see them as new).
fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|c| !c.starts_with("rsrdma-soft"))
        .count()
}

/// An async listener refuses at bind what the blocking one refuses, with the same words: a
/// device it does not have, a GID index past the table, queues the device cannot hold (it
/// bound them all, and its accept never returned while every peer's handshake failed: an
/// outside tester's find).
#[test]
fn a_listener_refuses_at_bind_what_the_blocking_one_refuses() {
    let ctx = rsrdma::open(&device()).unwrap();
    let max_wr = ctx.attr().max_qp_wr;
    let too_deep = |o: ConnOptions| match u16::try_from(max_wr + 1) {
        Ok(d) => o.sq_depth(d),
        Err(_) => o.recv_slots(32768),
    };
    run(async move {
        for path in [Establish::Cm, Establish::Tcp] {
            // (rdma_cm's listener knows no GID index: the address picks the port.)
            let cases = [
                (opts(path).device("nope"), true),
                (opts(path).gid_index(99), path == Establish::Tcp),
                (too_deep(opts(path).slot_size(64)), true),
            ];
            for (o, refused) in cases {
                let blocking = rsrdma_net::Listener::bind(listen_addr(&o), o.clone()).map(drop);
                assert_eq!(blocking.is_err(), refused, "{path:?}: {o:?}");
                let in_async = AsyncListener::bind(listen_addr(&o), o.clone()).map(drop);
                assert_eq!(
                    in_async.as_ref().map_err(ToString::to_string),
                    blocking.as_ref().map_err(ToString::to_string),
                    "{path:?}: {o:?}"
                );
            }
        }
    });
}

#[test]
fn echo_of_messages_on_both_paths() {
    run(async {
        for path in [Establish::Cm, Establish::Tcp] {
            let (c, s) = pair(opts(path), opts(path)).await;
            assert_eq!(c.info().establish, path);
            let server = tokio::spawn(async move {
                let mut n = 0;
                while let Some(m) = s.recv_msg().await.unwrap() {
                    s.send_msg(&m).await.unwrap();
                    n += 1;
                }
                s.close().await.unwrap();
                n
            });
            let sizes = [0usize, 1, 100, 32 * 1024, 100_000, 3 << 20];
            for (i, &len) in sizes.iter().enumerate() {
                let m = pattern(len, i as u64);
                c.send_msg(&m).await.unwrap();
                assert_eq!(c.recv_msg().await.unwrap().unwrap(), m, "{path:?} {len}");
            }
            // recv_msg_into: too short keeps the message, then the right size takes it.
            c.send_msg(&pattern(5000, 9)).await.unwrap();
            let mut small = [0u8; 100];
            match c.recv_msg_into(&mut small).await {
                Err(NetError::ShortBuffer { needed }) => assert_eq!(needed, 5000),
                other => panic!("{path:?}: {other:?}"),
            }
            let mut big = vec![0u8; 8000];
            let n = c.recv_msg_into(&mut big).await.unwrap().unwrap();
            assert_eq!(&big[..n], &pattern(5000, 9)[..]);
            c.shutdown_write().await.unwrap();
            assert_eq!(
                c.recv_msg().await.unwrap(),
                None,
                "{path:?}: EOF after echo"
            );
            assert_eq!(server.await.unwrap(), sizes.len() + 1);
            c.close().await.unwrap();
            assert!(matches!(
                c.send_msg(b"late").await,
                Err(NetError::Closed { .. })
            ));
        }
    });
}

#[test]
fn sixty_four_connections_on_one_current_thread_runtime() {
    const CONNS: usize = 64;
    const ROUNDS: usize = 20;
    let small = |path| {
        opts(path)
            .slot_size(8 * 1024)
            .recv_slots(8)
            .send_slots(8)
            .sq_depth(16)
            // The emulated VM establishes a few connections per second.
            .connect_timeout(Duration::from_secs(60))
    };
    run(async move {
        let base_threads = thread_count();
        let l = Arc::new(listen(small(Establish::Cm)));
        let addr = l.local_addr();
        // Eight tasks accept at once, so that establishments (on the blocking pool) overlap.
        let acceptors: Vec<_> = (0..8)
            .map(|_| {
                let l = l.clone();
                tokio::spawn(async move {
                    let mut served = Vec::new();
                    for _ in 0..CONNS / 8 {
                        let s = l.accept().await.unwrap();
                        served.push(tokio::spawn(async move {
                            let mut n = 0;
                            while let Some(m) = s.recv_msg().await.unwrap() {
                                s.send_msg(&m).await.unwrap();
                                n += 1;
                            }
                            s.close().await.unwrap();
                            n
                        }));
                    }
                    served
                })
            })
            .collect();
        let mut clients = Vec::new();
        for i in 0..CONNS {
            clients.push(tokio::spawn(async move {
                let c = AsyncConn::dial(addr, small(Establish::Cm)).await.unwrap();
                for r in 0..ROUNDS {
                    let m = pattern(100 + (i * 997 + r * 131) % 20_000, (i * 1000 + r) as u64);
                    c.send_msg(&m).await.unwrap();
                    assert_eq!(c.recv_msg().await.unwrap().unwrap(), m);
                }
                c
            }));
        }
        let mut conns = Vec::new();
        for c in clients {
            conns.push(c.await.unwrap());
        }
        let mut served = Vec::new();
        for a in acceptors {
            served.extend(a.await.unwrap());
        }
        assert_eq!(served.len(), CONNS);
        // All 128 ends are up: no progress thread anywhere, and (once the blocking pool's
        // establishment threads idle out) no thread per connection.
        assert_eq!(threads_named("rsrdma-conn"), 0);
        tokio::time::sleep(Duration::from_millis(600)).await;
        let now = thread_count();
        eprintln!(
            "threads: {base_threads} before, {now} with {} connections",
            2 * CONNS
        );
        assert!(now <= base_threads + 2, "{base_threads} -> {now}");
        for c in &conns {
            c.shutdown_write().await.unwrap();
        }
        for s in served {
            assert_eq!(s.await.unwrap(), ROUNDS);
        }
        for c in conns {
            assert_eq!(c.recv_msg().await.unwrap(), None);
            c.close().await.unwrap();
        }
    });
}

/// The copy test's stream: byte `i` is `block[i % block.len()]`, a prime length, so a chunk
/// delivered at the wrong offset does not match.
fn copy_block() -> Arc<Vec<u8>> {
    Arc::new(pattern(1_000_003, 42))
}

/// A reader of `left` bytes of the stream, hashing what it hands out (memcpy-fast, so the
/// emulated VM measures the connection, not the generator).
struct PatternReader {
    block: Arc<Vec<u8>>,
    at: u64,
    left: u64,
    hash: Option<Sha256>,
}

impl AsyncRead for PatternReader {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let me = &mut *self;
        let off = (me.at % me.block.len() as u64) as usize;
        let n = (buf.remaining() as u64)
            .min(me.left)
            .min((me.block.len() - off) as u64) as usize;
        let chunk = &me.block[off..off + n];
        if let Some(h) = &mut me.hash {
            h.update(chunk);
        }
        buf.put_slice(chunk);
        me.at += n as u64;
        me.left -= n as u64;
        Poll::Ready(Ok(()))
    }
}

/// A writer that compares every byte with the stream, hashes and counts.
struct CheckSink {
    block: Arc<Vec<u8>>,
    at: u64,
    first_mismatch: Option<u64>,
    hash: Option<Sha256>,
}

impl AsyncWrite for CheckSink {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let me = &mut *self;
        let off = (me.at % me.block.len() as u64) as usize;
        let n = buf.len().min(me.block.len() - off);
        if buf[..n] != me.block[off..off + n] && me.first_mismatch.is_none() {
            me.first_mismatch = Some(me.at);
        }
        if let Some(h) = &mut me.hash {
            h.update(&buf[..n]);
        }
        me.at += n as u64;
        Poll::Ready(Ok(n))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// `tokio::io::copy` of RSRDMA_ASYNC_COPY_MIB MiB, verified byte for byte
/// against the stream, and by SHA-256 on both ends in optimized builds or with
/// RSRDMA_ASYNC_COPY_HASH=1 (an unoptimized SHA-256 in the emulated VM hashes at about
/// 0.4 MiB/s, ten times slower than the copy itself; the byte comparison is a memcmp).
/// The default is the 100 MiB: the emulated VM copies 3 to 4.5 MiB/s in 8 KiB writes
/// (debug build), so it takes 23 to 34 s there; RSRDMA_ASYNC_COPY_MIB sets another size.
#[test]
fn tokio_io_copy_of_many_mib_is_verified() {
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    let mib = env("RSRDMA_ASYNC_COPY_MIB").unwrap_or(100);
    let hashed = env("RSRDMA_ASYNC_COPY_HASH").map_or(!cfg!(debug_assertions), |h| h != 0);
    run(async move {
        let (c, s) = pair(opts(Establish::Cm), opts(Establish::Cm)).await;
        let total = mib << 20;
        let block = copy_block();
        let mut sink = CheckSink {
            block: block.clone(),
            at: 0,
            first_mismatch: None,
            hash: hashed.then(Sha256::new),
        };
        let receiver = tokio::spawn(async move {
            let (mut r, w) = s.into_split();
            let n = tokio::io::copy(&mut r, &mut sink).await.unwrap();
            drop(w);
            (n, sink)
        });
        let mut src = PatternReader {
            block,
            at: 0,
            left: total,
            hash: hashed.then(Sha256::new),
        };
        let mut c = c;
        let t0 = Instant::now();
        let sent = tokio::io::copy(&mut src, &mut c).await.unwrap();
        c.shutdown().await.unwrap();
        let (got, sink) = receiver.await.unwrap();
        let took = t0.elapsed();
        eprintln!(
            "tokio::io::copy: {mib} MiB (hashed: {hashed}) in {took:?} ({:.1} MiB/s)",
            mib as f64 / took.as_secs_f64()
        );
        assert_eq!((sent, got, sink.at), (total, total, total));
        assert_eq!(sink.first_mismatch, None, "the bytes differ");
        if let (Some(a), Some(b)) = (src.hash, sink.hash) {
            assert_eq!(a.finalize(), b.finalize(), "the hashes differ");
        }
        let mut rest = [0u8; 1];
        assert_eq!(c.read(&mut rest).await.unwrap(), 0, "the peer's EOF");
        c.close().await.unwrap();
    });
}

#[test]
fn framed_with_a_length_delimited_codec() {
    run(async {
        let (c, s) = pair(opts(Establish::Tcp), opts(Establish::Tcp)).await;
        let server = tokio::spawn(async move {
            let mut f = Framed::new(s, LengthDelimitedCodec::new());
            while let Some(frame) = f.next().await {
                let mut frame = frame.unwrap();
                frame.reverse();
                f.send(frame.freeze()).await.unwrap();
            }
            f.into_inner().close().await.unwrap();
        });
        let mut f = Framed::new(c, LengthDelimitedCodec::new());
        for i in 0..50usize {
            let m = pattern(i * 1111, i as u64);
            f.send(&m[..]).await.unwrap();
            let mut back = f.next().await.unwrap().unwrap().to_vec();
            back.reverse();
            assert_eq!(back, m, "frame {i}");
        }
        let mut c = f.into_inner();
        c.shutdown().await.unwrap();
        server.await.unwrap();
        let mut rest = Vec::new();
        assert_eq!(c.read_to_end(&mut rest).await.unwrap(), 0);
        c.close().await.unwrap();
    });
}

#[test]
fn split_halves_run_full_duplex_and_reunite() {
    run(async {
        let (c, s) = pair(opts(Establish::Cm), opts(Establish::Cm)).await;
        const N: usize = 300;
        // The server echoes through its two halves, on two tasks.
        let (sr, sw) = s.into_split();
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(4);
        let reader = tokio::spawn(async move {
            while let Some(m) = sr.recv_msg().await.unwrap() {
                tx.send(m).await.unwrap();
            }
            sr
        });
        let writer = tokio::spawn(async move {
            while let Some(m) = rx.recv().await {
                sw.send_msg(&m).await.unwrap();
            }
            // Dropping the write half half-closes.
        });
        let (cr, cw) = c.into_split();
        let sending = tokio::spawn(async move {
            for i in 0..N {
                cw.send_msg(&pattern(40_000, i as u64)).await.unwrap();
            }
            cw
        });
        for i in 0..N {
            let m = cr.recv_msg().await.unwrap().unwrap();
            assert_eq!(m, pattern(40_000, i as u64), "message {i}");
        }
        let cw = sending.await.unwrap();
        let c = cr.reunite(cw).unwrap();
        c.shutdown_write().await.unwrap();
        let sr = reader.await.unwrap();
        writer.await.unwrap();
        assert_eq!(
            c.recv_msg().await.unwrap(),
            None,
            "the write half's drop sent FIN"
        );
        c.close().await.unwrap();
        // A half closes the whole connection, without reuniting.
        sr.close().await.unwrap();
        assert!(sr.recv_msg().await.is_err(), "closed");
    });
}

#[test]
fn a_cancelled_recv_msg_loses_nothing() {
    run(async {
        let (c, s) = pair(opts(Establish::Cm), opts(Establish::Cm)).await;
        // Nothing there yet: the future is dropped while it waits.
        tokio::select! {
            m = c.recv_msg() => panic!("nothing was sent: {m:?}"),
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
        // Then large messages (reassembled from many fragments) arrive while futures are
        // cancelled every 200 µs, often with part of a message in.
        let msgs: Vec<Vec<u8>> = (0..4).map(|i| pattern(3 << 20, 70 + i)).collect();
        let to_send = msgs.clone();
        let sender = tokio::spawn(async move {
            for m in &to_send {
                s.send_msg(m).await.unwrap();
            }
            s
        });
        let mut cancelled = 0;
        let mut got = Vec::new();
        while got.len() < msgs.len() {
            tokio::select! {
                m = c.recv_msg() => got.push(m.unwrap().unwrap()),
                _ = tokio::time::sleep(Duration::from_micros(200)) => cancelled += 1,
            }
        }
        eprintln!("recv_msg: {cancelled} futures cancelled on the way");
        assert!(
            cancelled > 0,
            "no future was cancelled: the test tested nothing"
        );
        assert_eq!(got.len(), msgs.len());
        for (i, (a, b)) in got.iter().zip(&msgs).enumerate() {
            assert!(a == b, "message {i} differs");
        }
        // recv_msg_into, cancelled the same way.
        let s = sender.await.unwrap();
        let m = pattern(1 << 20, 99);
        let mut buf = vec![0u8; 2 << 20];
        let (m2, s) = (m.clone(), s);
        let sender = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            s.send_msg(&m2).await.unwrap();
            s
        });
        let mut cancelled = 0;
        let n = loop {
            tokio::select! {
                r = c.recv_msg_into(&mut buf) => break r.unwrap().unwrap(),
                _ = tokio::time::sleep(Duration::from_millis(1)) => cancelled += 1,
            }
        };
        assert!(cancelled > 0);
        assert_eq!(&buf[..n], &m[..]);
        let s = sender.await.unwrap();
        s.close().await.unwrap();
        assert_eq!(c.recv_msg().await.unwrap(), None);
        c.close().await.unwrap();
    });
}

#[test]
fn a_cancelled_send_msg_sends_nothing() {
    run(async {
        // Few, small slots: a peer that does not read stops the sender by credit.
        let small = || {
            opts(Establish::Cm)
                .slot_size(4096)
                .recv_slots(8)
                .send_slots(8)
        };
        let (c, s) = pair(small(), small()).await;
        let mut sent = Vec::new();
        let mut cancelled = 0;
        for i in 0..200u64 {
            let m = pattern(3000 + i as usize, i);
            tokio::select! {
                r = c.send_msg(&m) => { r.unwrap(); sent.push(m); }
                _ = tokio::time::sleep(Duration::from_millis(20)) => { cancelled += 1; }
            }
            if cancelled == 3 {
                break;
            }
        }
        assert_eq!(
            cancelled, 3,
            "the sender never blocked: the test tested nothing"
        );
        let reading = async {
            let mut got = Vec::new();
            while let Some(m) = s.recv_msg().await.unwrap() {
                got.push(m);
            }
            got
        };
        let (shut, got) = tokio::join!(c.shutdown_write(), reading);
        shut.unwrap();
        assert_eq!(
            got.len(),
            sent.len(),
            "exactly the accepted messages arrive"
        );
        assert!(got == sent, "in order, intact");
        s.close().await.unwrap();
        c.close().await.unwrap();
    });
}

#[test]
fn half_close_lets_the_peer_answer() {
    run(async {
        let (mut c, mut s) = pair(opts(Establish::Tcp), opts(Establish::Tcp)).await;
        c.write_all(&pattern(200_000, 5)).await.unwrap();
        c.shutdown().await.unwrap();
        let mut all = Vec::new();
        s.read_to_end(&mut all).await.unwrap();
        assert_eq!(all, pattern(200_000, 5));
        s.write_all(b"after your FIN").await.unwrap();
        s.flush().await.unwrap();
        s.close().await.unwrap();
        let mut back = Vec::new();
        c.read_to_end(&mut back).await.unwrap();
        assert_eq!(back, b"after your FIN");
        c.close().await.unwrap();
    });
}

/// `shutdown_read` (what `Conn::shutdown(Shutdown::Read)` does, which async lacked): a
/// pending read and every later one see the end, what the peer goes on sending is discarded
/// with its credit returned (far more than the receive slots hold goes through), and this
/// side still sends; on a read half, while its write half goes on.
#[test]
fn shutdown_read_discards_and_reports_the_end_while_credits_flow() {
    run(async {
        let (c, s) = pair(opts(Establish::Cm), opts(Establish::Cm)).await;
        let s = Arc::new(s);
        let pending = {
            let s = s.clone();
            tokio::spawn(async move { s.recv_msg().await.unwrap() })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        s.shutdown_read().unwrap();
        let ended = tokio::time::timeout(Duration::from_secs(10), pending).await;
        assert_eq!(ended.unwrap().unwrap(), None, "a pending read sees the end");
        let msg = vec![3u8; 20_000];
        for _ in 0..200 {
            // About 4 MB: far more than the receive slots hold.
            tokio::time::timeout(Duration::from_secs(10), c.send_msg(&msg))
                .await
                .expect("the discarded messages' credit came back")
                .unwrap();
        }
        assert_eq!(s.recv_msg().await.unwrap(), None);
        s.send_msg(b"still sending").await.unwrap();
        assert_eq!(c.recv_msg().await.unwrap().unwrap(), b"still sending");

        let s = Arc::try_unwrap(s).ok().unwrap();
        let (r, w) = s.into_split();
        r.shutdown_read().unwrap();
        for _ in 0..100 {
            tokio::time::timeout(Duration::from_secs(10), c.send_msg(&msg))
                .await
                .expect("credit came back to a read half shut down")
                .unwrap();
        }
        w.send_msg(b"from the write half").await.unwrap();
        assert_eq!(c.recv_msg().await.unwrap().unwrap(), b"from the write half");
        assert_eq!(r.recv_msg().await.unwrap(), None);
        r.reunite(w).unwrap().close().await.unwrap();
        c.close().await.unwrap();
    });
}

#[test]
fn close_ends_a_pending_recv_on_another_task() {
    run(async {
        let (c, _s) = pair(opts(Establish::Cm), opts(Establish::Cm)).await;
        let c = Arc::new(c);
        let c2 = c.clone();
        let pending = tokio::spawn(async move { c2.recv_msg().await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        c.close().await.unwrap();
        let r = timeout(Duration::from_secs(2), pending)
            .await
            .unwrap()
            .unwrap();
        assert!(matches!(r, Err(NetError::Closed { .. })), "{r:?}");
    });
}

#[test]
fn busy_mode_echoes() {
    run(async {
        let o = || opts(Establish::Cm).poll_mode(PollMode::Busy);
        let (c, s) = pair(o(), o()).await;
        let server = tokio::spawn(async move {
            while let Some(m) = s.recv_msg().await.unwrap() {
                s.send_msg(&m).await.unwrap();
            }
            s.close().await.unwrap();
        });
        for i in 0..200 {
            let m = pattern(i * 500, i as u64);
            c.send_msg(&m).await.unwrap();
            assert_eq!(c.recv_msg().await.unwrap().unwrap(), m);
        }
        c.shutdown_write().await.unwrap();
        server.await.unwrap();
        c.close().await.unwrap();
    });
}

#[test]
fn the_keeper_answers_keepalives_while_nobody_awaits() {
    run(async {
        let o = || {
            opts(Establish::Cm)
                .keepalive(Duration::from_millis(100))
                .peer_timeout(Duration::from_millis(600))
        };
        let (c, s) = pair(o(), o()).await;
        // Six peer timeouts with no task awaiting either end: only the keepers run.
        tokio::time::sleep(Duration::from_secs(4)).await;
        c.send_msg(b"still there").await.unwrap();
        let m = timeout(Duration::from_secs(2), s.recv_msg()).await.unwrap();
        assert_eq!(m.unwrap().unwrap(), b"still there");
        let counters = c.counters().unwrap();
        assert!(
            counters.frames_received > 10,
            "PINGs and PONGs went: {counters:?}"
        );
        c.close().await.unwrap();
        s.close().await.unwrap();
    });
}

#[test]
fn a_message_send_msg_accepted_goes_out_while_nobody_awaits_the_sender() {
    run(async {
        // A keepalive far beyond the test: the keeper's timer alone would move nothing.
        let o = || {
            opts(Establish::Cm)
                .keepalive(Duration::from_secs(30))
                .peer_timeout(Duration::from_secs(90))
        };
        let (c, s) = pair(o(), o()).await;
        // Let both keepers run and go to sleep on their (far) timers first: the send must
        // wake the sender's keeper itself.
        tokio::time::sleep(Duration::from_millis(200)).await;
        // Far more than the receiver's slots hold: send_msg returns once the core holds
        // the rest, and nothing on this side awaits the connection afterwards.
        let m = pattern(6 << 20, 5);
        s.send_msg(&m).await.unwrap();
        assert!(
            s.counters().unwrap().queued_send_bytes > 0,
            "the rest waits for credit in the core"
        );
        let got = timeout(Duration::from_secs(20), c.recv_msg()).await;
        let got = got
            .expect("the rest never went: nobody drove the sender")
            .unwrap();
        assert!(got.unwrap() == m, "the message differs");
        c.close().await.unwrap();
        s.close().await.unwrap();
    });
}

/// The peer of the death tests, run only as a child process: dials, says "up", then idles
/// until killed.
#[test]
#[ignore = "runs as the child process of peer_death_surfaces_as_an_error"]
fn async_child_peer() {
    let (path, addr) = support::child_peer_spec(CHILD_ENV);
    run(async move {
        let _c = AsyncConn::dial(addr, opts(path)).await.unwrap();
        println!("up");
        tokio::time::sleep(Duration::from_secs(60)).await;
    });
}

/// Accepts a child peer (this binary, as `async_child_peer`) once it says "up".
async fn child_peer(path: Establish, server: ConnOptions) -> (AsyncConn, std::process::Child) {
    let l = listen(server);
    let tag = if path == Establish::Cm { "cm" } else { "tcp" };
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "async_child_peer", "--ignored", "--nocapture"])
        .env(CHILD_ENV, format!("{tag} {}", l.local_addr()))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let s = timeout(Duration::from_secs(20), l.accept())
        .await
        .unwrap()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let seen = tokio::task::spawn_blocking(move || {
        let mut seen = String::new();
        let mut buf = [0u8; 256];
        while !seen.contains("up") {
            let n = out.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            seen.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
        seen
    });
    let seen = timeout(Duration::from_secs(20), seen)
        .await
        .unwrap()
        .unwrap();
    assert!(seen.contains("up"), "the child did not come up: {seen}");
    (s, child)
}

fn signal(child: &std::process::Child, sig: libc::c_int) {
    // SAFETY: plain syscall on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, sig) }, 0);
}

#[test]
fn peer_death_surfaces_as_an_error() {
    run(async {
        // A peer that dies: its kernel ends the rdma_cm id or the TCP channel.
        for path in [Establish::Cm, Establish::Tcp] {
            let (s, mut child) = child_peer(path, opts(path)).await;
            let pending = tokio::spawn(async move {
                let t0 = Instant::now();
                (s.recv_msg().await, t0)
            });
            tokio::time::sleep(Duration::from_millis(100)).await;
            signal(&child, libc::SIGKILL);
            let killed = Instant::now();
            let (r, _) = timeout(Duration::from_secs(10), pending)
                .await
                .unwrap()
                .unwrap();
            let took = killed.elapsed();
            let _ = child.wait();
            eprintln!("{path:?}: a killed peer surfaced after {took:?}: {r:?}");
            assert!(matches!(r, Err(NetError::ConnFailed(_))), "{path:?}: {r:?}");
            assert!(took < Duration::from_secs(5), "{path:?}: {took:?}");
        }
        // A peer that hangs (stopped): only the keepalive can tell, through the keeper's
        // timer, within the peer timeout.
        let server = opts(Establish::Cm)
            .keepalive(Duration::from_millis(250))
            .peer_timeout(Duration::from_millis(1500));
        let (s, mut child) = child_peer(Establish::Cm, server).await;
        signal(&child, libc::SIGSTOP);
        let t0 = Instant::now();
        let r = timeout(Duration::from_secs(10), s.recv_msg())
            .await
            .unwrap();
        let took = t0.elapsed();
        signal(&child, libc::SIGKILL);
        let _ = child.wait();
        eprintln!("a hung peer surfaced after {took:?}: {r:?}");
        assert!(matches!(r, Err(NetError::ConnFailed(_))), "{r:?}");
        assert!(
            took >= Duration::from_millis(1000) && took < Duration::from_millis(2500),
            "{took:?}"
        );
    });
}

/// PacketConn options on the device under test.
fn packet_opts() -> PacketOptions {
    PacketOptions::default()
        .device(Some(device()))
        .gid_index(gid_index())
}

#[test]
fn packet_conn_send_to_and_recv_from() {
    run(async {
        let o = || packet_opts().poll_mode(PollMode::Event);
        let a = AsyncPacketConn::bind(o()).unwrap();
        let b = AsyncPacketConn::bind(o()).unwrap();
        let to = b.local_addr();
        // A cancelled receive, then the datagram that comes after it arrives intact.
        let mut buf = vec![0u8; b.max_datagram()];
        tokio::select! {
            r = b.recv_from(&mut buf) => panic!("nothing was sent: {r:?}"),
            _ = tokio::time::sleep(Duration::from_millis(30)) => {}
        }
        let (a, b) = (Arc::new(a), Arc::new(b));
        let b2 = b.clone();
        let receiver = tokio::spawn(async move {
            let mut buf = vec![0u8; b2.max_datagram()];
            let mut got = Vec::new();
            for _ in 0..100 {
                let (n, from) = b2.recv_from(&mut buf).await.unwrap();
                got.push((buf[..n].to_vec(), from));
            }
            got
        });
        let len = a.max_datagram().min(1000);
        for i in 0..100u64 {
            a.send_to(&pattern(len, i), &to).await.unwrap();
            // Pace: UD drops what finds no receive posted.
            if i % 16 == 15 {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        let got = receiver.await.unwrap();
        for (i, (m, from)) in got.iter().enumerate() {
            assert_eq!(m, &pattern(len, i as u64), "datagram {i}");
            assert_eq!(from.qpn, a.local_addr().qpn);
        }
        assert_eq!(a.stats().sent, 100);
        assert_eq!(b.stats().received, 100);
    });
}

/// An address handle is made on the blocking pool, never on a runtime thread: while one
/// task's send waits on the kernel for an address that does not answer (about a second on
/// rxe), the other tasks of a current-thread runtime go on. (Before: `ibv_create_ah` ran in
/// the future's poll, and the runtime's only thread stood still for that second.) Only on
/// rxe: soft0 makes an address handle at once.
#[test]
fn a_slow_address_handle_blocks_no_runtime_thread() {
    run(async {
        let (a, b) = (
            Arc::new(AsyncPacketConn::bind(packet_opts()).unwrap()),
            AsyncPacketConn::bind(packet_opts()).unwrap(),
        );
        let to = b.local_addr();
        a.send_to(b"warm", &to).await.unwrap();
        let nowhere = support::unanswered_addr(to.qpn);
        let slow = {
            let a = a.clone();
            tokio::spawn(async move {
                let t0 = Instant::now();
                let r = a.send_to(b"to nowhere", &nowhere).await;
                (r, t0.elapsed())
            })
        };
        // The slow send starts at once, and this task's timer and round trips run beside it
        // (a blocked runtime thread would stall them all until it returned).
        let t0 = Instant::now();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut buf = [0u8; 64];
        for _ in 0..20 {
            a.send_to(b"meanwhile", &to).await.unwrap();
            b.recv_from(&mut buf).await.unwrap();
        }
        let others = t0.elapsed();
        let (r, stuck) = slow.await.unwrap();
        eprintln!(
            "100 ms and 20 round trips in {others:?} while one address handle took {stuck:?}"
        );
        support::assert_not_held_up(&r.unwrap_err(), stuck, others);
    });
}

/// F12: dropping an `AsyncConn` without `close` blocks no runtime thread. With both ends on
/// one current-thread runtime, a drop that lingered in place kept the peer from reading what
/// it waited to deliver: the linger ran out and the queued rest of the message was lost.
#[test]
fn dropping_an_unclosed_conn_blocks_no_runtime_thread_and_loses_nothing() {
    run(async {
        let (c, s) = pair(opts(Establish::Cm), opts(Establish::Cm)).await;
        // Far more than the receiver's slots hold: the rest waits in the core at the drop.
        let m = pattern(6 << 20, 8);
        s.send_msg(&m).await.unwrap();
        assert!(s.counters().unwrap().queued_send_bytes > 0);
        let t0 = Instant::now();
        drop(s);
        let dropped_in = t0.elapsed();
        let got = timeout(Duration::from_secs(30), c.recv_msg())
            .await
            .expect("the message never came")
            .unwrap();
        assert!(got.unwrap() == m, "the message differs");
        let end = timeout(Duration::from_secs(30), c.recv_msg())
            .await
            .expect("no end of stream");
        assert!(matches!(end, Ok(None)), "{end:?}");
        assert!(
            dropped_in < Duration::from_millis(500),
            "the drop blocked the runtime's thread for {dropped_in:?}"
        );
        c.close().await.unwrap();
    });
}

/// AsyncConn receives rendezvous messages (it offers rendezvous now: its reads start the
/// READ into the driver's own memory, which becomes the message), from a blocking `Conn`
/// that sends them zero-copy (one RTS frame per message), through `recv_msg`,
/// `recv_msg_into` and `AsyncRead`; and futures cancelled every 200 µs, mid-READ too, lose
/// nothing and wedge nothing.
#[test]
fn rendezvous_messages_reach_async_reads_and_cancelled_futures_lose_none() {
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    const N: u64 = 6;
    let msgs: Vec<Vec<u8>> = (0..N)
        .map(|i| pattern((1 << 20) + i as usize, 40 + i))
        .collect();
    let to_send = msgs.clone();
    let sender = std::thread::spawn(move || {
        let addr = addr_rx.recv().unwrap();
        let c = rsrdma_net::Conn::dial(addr, opts(Establish::Cm)).unwrap();
        assert!(
            c.info().settled.rendezvous().is_some(),
            "rendezvous settled"
        );
        let before = c.counters().unwrap().frames_sent;
        for m in &to_send {
            c.send_msg(m).unwrap();
        }
        // One RTS frame per message (eager, each would be 33 frames), plus control frames.
        let frames = c.counters().unwrap().frames_sent - before;
        assert!(
            frames < 3 * N,
            "{frames} frames for {N} messages: not by rendezvous"
        );
        c.send_msg(b"end").unwrap();
        c.close().unwrap();
    });
    run(async move {
        let l = listen(opts(Establish::Cm));
        addr_tx.send(l.local_addr()).unwrap();
        let s = l.accept().await.unwrap();
        // Every read future that is still pending after a poll is dropped (its READ, begun
        // in that poll, goes on), and the read is made again: with a timer's race instead,
        // a READ faster than the timer's millisecond cancelled nothing in some VM runs.
        let mut cancelled = 0;
        let mut got = Vec::new();
        while got.len() < 2 {
            match poll_once(s.recv_msg()).await {
                Some(m) => got.push(m.unwrap().unwrap()),
                None => {
                    cancelled += 1;
                    tokio::time::sleep(Duration::from_micros(200)).await;
                }
            }
        }
        let mut buf = vec![0u8; 2 << 20];
        while got.len() < 4 {
            match poll_once(s.recv_msg_into(&mut buf)).await {
                Some(n) => {
                    let n = n.unwrap().unwrap();
                    got.push(buf[..n].to_vec());
                }
                None => {
                    cancelled += 1;
                    tokio::time::sleep(Duration::from_micros(200)).await;
                }
            }
        }
        let mut short = vec![0u8; 100];
        let e = s.recv_msg_into(&mut short).await.unwrap_err();
        assert!(
            matches!(e, NetError::ShortBuffer { needed } if needed == msgs[4].len()),
            "{e:?}"
        );
        eprintln!("{cancelled} futures cancelled on the way");
        assert!(
            cancelled > 0,
            "no future was cancelled: the test tested nothing"
        );
        // The rest as a byte stream.
        let mut s = s;
        let mut rest = vec![0u8; msgs[4].len() + msgs[5].len() + 3];
        s.read_exact(&mut rest).await.unwrap();
        for (i, m) in got.iter().enumerate() {
            assert!(m == &msgs[i], "message {i} differs");
        }
        assert!(rest[..msgs[4].len()] == msgs[4][..], "message 4 by read");
        assert!(
            rest[msgs[4].len()..msgs[4].len() + msgs[5].len()] == msgs[5][..],
            "message 5 by read"
        );
        assert_eq!(&rest[rest.len() - 3..], b"end");
        assert_eq!(s.recv_msg().await.unwrap(), None);
        s.close().await.unwrap();
    });
    sender.join().unwrap();
}

/// An `AsyncListener` takes a shared receive pool as `Listener` does: its connections receive
/// from one pool (an accepted connection registers only its send slots), more connections
/// than the pool has slots per connection all exchange messages, and the memory is counted.
#[test]
fn an_async_listener_with_a_shared_receive_pool() {
    run(async {
        let small = || {
            opts(Establish::Cm)
                .slot_size(4096)
                .recv_slots(8)
                .send_slots(4)
                .sq_depth(16)
        };
        let l = listen(small().shared_recv(rsrdma_net::SharedRecv::new(16)));
        let addr = l.local_addr();
        let mut pairs = Vec::new();
        for _ in 0..4 {
            let (c, s) = tokio::join!(AsyncConn::dial(addr, small()), l.accept());
            pairs.push((c.unwrap(), s.unwrap()));
        }
        let mem = l.recv_memory();
        assert_eq!((mem.pool_slots, mem.connections), (16, 4), "{mem:?}");
        assert_eq!(mem.pool_bytes, 16 * 4096);
        for (_, s) in &pairs {
            assert_eq!(s.info().registered_bytes, 4 * 4096, "send slots only");
        }
        // Every client sends first (4 × 3 one-frame messages wait in the pool at once: 3 is
        // within a connection's 4 send slots, so no send waits for the server), then every
        // server reads and answers. (The RNR path of a full pool is the blocking tests'.)
        for (i, (c, _)) in pairs.iter().enumerate() {
            for k in 0..3u64 {
                c.send_msg(&pattern(3000, (i as u64) * 10 + k))
                    .await
                    .unwrap();
            }
        }
        for (i, (c, s)) in pairs.iter().enumerate() {
            for k in 0..3u64 {
                let m = s.recv_msg().await.unwrap().unwrap();
                assert!(
                    m == pattern(3000, (i as u64) * 10 + k),
                    "conn {i} message {k}"
                );
            }
            s.send_msg(b"ok").await.unwrap();
            assert_eq!(c.recv_msg().await.unwrap().unwrap(), b"ok");
        }
        for (c, s) in pairs {
            c.close().await.unwrap();
            s.close().await.unwrap();
        }
        assert_eq!(l.recv_memory().connections, 0);
    });
}

/// AsyncConn has `send_buffer` and `recv_buffer` as Conn does (the same operations: one
/// step for both faces): registered buffers both ways, eager (fragments straight from the
/// buffer) and by rendezvous (one RTS; the peer READs), with the receiver's futures
/// cancelled every 200 µs (a dropped `recv_buffer` hands back the part it had and frees the
/// receive side: nothing lost, nothing wedged).
#[test]
fn async_buffers_eager_and_rendezvous_with_cancelled_receives() {
    run(async {
        // A 1 MiB threshold: eager messages of 800 KB (25 frames) take several of tokio's
        // millisecond timer ticks to arrive, so cancellations land mid-message.
        let o = || opts(Establish::Cm).rendezvous(Some(1 << 20));
        let (c, s) = pair(o(), o()).await;
        let threshold = c.info().settled.rendezvous().expect("rendezvous settled") as usize;
        let mut sizes = vec![1usize];
        sizes.extend([800_000; 4]);
        sizes.extend([threshold, 2 << 20]);
        let msgs: Vec<Vec<u8>> = (0..sizes.len())
            .map(|i| pattern(sizes[i], 300 + i as u64))
            .collect();
        let to_send = msgs.clone();
        // The sender on a task of its own, so the receiver's task parks and its timers fire.
        let sender = tokio::spawn(async move {
            let mut frames = Vec::new();
            for m in &to_send {
                let mut b = c.alloc_buffer(m.len()).unwrap();
                b.as_mut_slice().unwrap().copy_from_slice(m);
                let before = c.counters().unwrap().frames_sent;
                c.send_buffer(&b, m.len()).await.unwrap();
                assert!(
                    !b.is_busy(),
                    "send_buffer returned with the buffer in flight"
                );
                frames.push(c.counters().unwrap().frames_sent - before);
            }
            (c, frames)
        });
        let mut rbuf = s.alloc_buffer(2 << 20).unwrap();
        let mut cancelled = 0;
        for want in &msgs {
            let n = loop {
                tokio::select! {
                    r = s.recv_buffer(&mut rbuf) => break r.unwrap().unwrap(),
                    _ = tokio::time::sleep(Duration::from_micros(200)) => cancelled += 1,
                }
            };
            assert_eq!(n, want.len());
            assert!(rbuf.as_slice().unwrap()[..n] == want[..], "{n} B differ");
        }
        let (c, frames) = sender.await.unwrap();
        for (len, f) in sizes.iter().zip(&frames) {
            if *len >= threshold {
                assert!(*f < 4, "{len} B in {f} frames: not by rendezvous");
            } else {
                assert!(
                    *f as usize >= len.div_ceil(32 * 1024),
                    "{len} B in {f} frames"
                );
            }
        }
        eprintln!("{cancelled} recv_buffer futures cancelled on the way");
        assert!(
            cancelled > 0,
            "no future was cancelled: the test tested nothing"
        );
        // The receive side is free: a plain read works.
        c.send_msg(b"after").await.unwrap();
        assert_eq!(s.recv_msg().await.unwrap().unwrap(), b"after");
        c.close().await.unwrap();
        s.close().await.unwrap();
    });
}

/// Availability (issue 21): one async accept loop, written as the guide writes it, serves a
/// good client while hundreds of silent and garbage sockets arrive first. (Before: the async
/// listener ran one handshake at a time, so one silent socket held a good client for the
/// whole 10 s handshake limit, and a garbage one ended `accept().await?`.)
#[test]
fn one_async_accept_loop_serves_a_good_client_through_a_flood() {
    run(async {
        let l = Arc::new(listen(opts(Establish::Tcp)));
        let addr = l.local_addr();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let server = {
            let l = l.clone();
            tokio::spawn(async move {
                loop {
                    let c = l.accept().await?;
                    if tx.send(c).is_err() {
                        return Ok::<(), NetError>(());
                    }
                }
            })
        };
        let mut held = Vec::new();
        for i in 0..200 {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            if i % 2 == 0 {
                let _ = s.write_all(b"GET / HTTP/1.1\r\n\r\n").await;
            }
            held.push(s);
        }
        let t0 = Instant::now();
        let c = AsyncConn::dial(addr, opts(Establish::Tcp)).await.unwrap();
        let s = timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("no connection within 10 s")
            .unwrap();
        let took = t0.elapsed();
        c.send_msg(b"through the flood").await.unwrap();
        assert_eq!(s.recv_msg().await.unwrap().unwrap(), b"through the flood");
        let n = l.counters();
        eprintln!("async flood of 200: good client in {took:?}; {n:?}");
        assert!(
            took < Duration::from_secs(5),
            "the good client waited {took:?}"
        );
        assert!(!server.is_finished(), "the accept loop ended");
        let t1 = Instant::now();
        while l.counters().failed + l.counters().shed < 200 {
            assert!(t1.elapsed() < Duration::from_secs(10), "{:?}", l.counters());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(l.counters().accepted, 1);
        drop(held);
        server.abort();
        c.close().await.unwrap();
        s.close().await.unwrap();
    });
}

/// As the blocking listener: eight peers without a secret that send a real endpoint and then
/// stall fill an async listener of eight places; a good client gets in once one of them has
/// stalled past its grace (a quarter of the opening timeout). The full accept loop wakes for
/// that moment by itself (before: it waited for a handshake to end, at the 10 s timeout).
#[test]
fn an_async_listener_sheds_a_peer_that_stalls_after_its_endpoint() {
    run(async {
        let l = Arc::new(listen(opts(Establish::Tcp).max_handshakes(8)));
        let addr = l.local_addr();
        let accepted = {
            let l = l.clone();
            tokio::spawn(async move { l.accept().await })
        };
        let stalled = tokio::task::spawn_blocking(move || support::endpoint_then_stall(addr, 8))
            .await
            .unwrap();
        let t0 = Instant::now();
        let c = AsyncConn::dial(addr, opts(Establish::Tcp)).await.unwrap();
        let s = accepted.await.unwrap().unwrap();
        let took = t0.elapsed();
        eprintln!(
            "async: good client behind 8 stalled peers in {took:?}; {:?}",
            l.counters()
        );
        assert!(
            took < Duration::from_secs(3),
            "the good client waited {took:?}"
        );
        c.send_msg(b"past the stalled peers").await.unwrap();
        assert_eq!(
            s.recv_msg().await.unwrap().unwrap(),
            b"past the stalled peers"
        );
        drop(stalled);
        c.close().await.unwrap();
        s.close().await.unwrap();
    });
}

/// A full async listener waiting for a stalled peer's grace to end keeps one sleeper, however
/// often its `accept` is cancelled (a server loop with a short timeout around it): an outside
/// tester's 929 cancelled accepts left 522 sleeping blocking-pool threads, the whole pool.
#[test]
fn cancelled_accepts_of_a_full_async_listener_leave_no_sleepers_behind() {
    run(async {
        let l = listen(opts(Establish::Tcp).max_handshakes(1));
        let addr = l.local_addr();
        // The stalling peer's handshake runs while someone accepts.
        let stalling = tokio::task::spawn_blocking(move || support::endpoint_then_stall(addr, 1));
        while !stalling.is_finished() {
            let _ = timeout(Duration::from_millis(5), l.accept()).await;
        }
        let stalled = stalling.await.unwrap();
        let before = thread_count();
        for _ in 0..100 {
            let _ = timeout(Duration::from_millis(1), l.accept()).await;
        }
        let after = thread_count();
        eprintln!("threads: {before} before 100 cancelled accepts, {after} after");
        assert!(after < before + 10, "{before} -> {after}");
        drop(stalled);
    });
}

/// Options whose connections declare a silent peer dead within a second.
fn quick(path: Establish) -> ConnOptions {
    let mut o = opts(path);
    o.keepalive = Some(Duration::from_millis(200));
    o.peer_timeout = Duration::from_secs(1);
    o
}

#[test]
fn a_connection_waiting_for_its_accept_answers_keepalives() {
    run(async move {
        let l = listen(quick(Establish::Tcp));
        let addr = l.local_addr();
        // Two clients dial before the first accept: it starts both handshakes and returns
        // one; the other connection then waits, established, for the next accept, three
        // peer timeouts long.
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let clients: Vec<_> = (0..2u8)
            .map(|i| {
                let tx = tx.clone();
                tokio::spawn(async move {
                    let c = AsyncConn::dial(addr, quick(Establish::Tcp)).await.unwrap();
                    tx.send(()).unwrap();
                    // Still alive after the wait: the peer answered every keepalive.
                    tokio::time::sleep(Duration::from_secs(3)).await;
                    c.send_msg(&[i]).await.unwrap();
                    c
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let first = l.accept().await.unwrap();
        // Both handshakes are done: the second connection is parked in the listener.
        for _ in 0..2 {
            timeout(Duration::from_secs(10), rx.recv())
                .await
                .expect("a client never got through its dial");
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        let second = l.accept().await.unwrap();
        let mut got = Vec::new();
        for c in [&first, &second] {
            let m = timeout(Duration::from_secs(10), c.recv_msg())
                .await
                .expect("a message within 10 s")
                .expect("the connection is alive");
            got.push(m.expect("a message")[0]);
        }
        got.sort_unstable();
        assert_eq!(got, [0, 1]);
        for c in clients {
            c.await.unwrap().close().await.unwrap();
        }
        first.close().await.unwrap();
        second.close().await.unwrap();
    });
}

#[test]
fn async_recv_buffer_refuses_another_connections_buffer_and_the_connection_goes_on() {
    run(async {
        let (c, s) = pair(opts(Establish::Tcp), opts(Establish::Tcp)).await;
        // Large enough to go by rendezvous (a READ into the buffer) with the defaults.
        let big = pattern(1 << 20, 5);
        s.send_msg(&big).await.unwrap();
        let mut foreign = s.alloc_buffer(2 << 20).unwrap();
        let e = timeout(Duration::from_secs(10), c.recv_buffer(&mut foreign))
            .await
            .expect("an answer within 10 s")
            .unwrap_err();
        assert!(matches!(e, NetError::BadBuffer { .. }), "{e}");
        let m = timeout(Duration::from_secs(10), c.recv_msg())
            .await
            .unwrap();
        assert!(
            m.unwrap().unwrap() == big,
            "the message after the refused buffer"
        );
        c.close().await.unwrap();
        s.close().await.unwrap();
    });
}

/// A `send_buffer` by rendezvous whose future is dropped while the peer does not read yet:
/// the message goes on, and once the peer has read it (its DONE came back) the buffer is
/// free again, with no task awaiting the connection and no keepalive to step for it (it
/// stayed busy until the next keepalive, or for ever without one).
#[test]
fn a_buffer_whose_send_was_cancelled_is_free_once_the_peer_read_it() {
    run(async {
        let (c, s) = pair_without_keepalive().await;
        let len = 1 << 20;
        let mut buf = c.alloc_buffer(len).unwrap();
        buf.as_mut_slice()
            .unwrap()
            .copy_from_slice(&pattern(len, 9));
        let sent = timeout(Duration::from_millis(100), c.send_buffer(&buf, len)).await;
        assert!(
            sent.is_err(),
            "the peer reads nothing yet: the send waits for it"
        );
        assert!(buf.is_busy(), "the message is on its way");
        let m = timeout(Duration::from_secs(10), s.recv_msg())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(m == pattern(len, 9), "the message arrived whole");
        let t0 = Instant::now();
        while buf.is_busy() {
            assert!(
                t0.elapsed() < Duration::from_secs(3),
                "the buffer is still in flight {:?} after the peer read its message",
                t0.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        c.close().await.unwrap();
        s.close().await.unwrap();
    });
}

/// A waker that counts its wake-ups, for futures polled by hand.
#[derive(Default)]
struct CountingWaker(std::sync::atomic::AtomicUsize);

impl std::task::Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl CountingWaker {
    fn count(&self) -> usize {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// Two receivers of one connection, polled by hand in the order that lost a wake-up: B steps
/// first (it takes both messages off the completion queue and finds the receive side A's),
/// then A takes the first message and returns. B must be woken for the second, which waits
/// queued; no keepalive comes to step for it.
#[test]
fn a_receiver_waiting_for_the_side_is_woken_when_its_owner_is_done() {
    run(async {
        let (c, s) = pair_without_keepalive().await;
        let (mut buf_a, mut buf_b) = (s.alloc_buffer(4096).unwrap(), s.alloc_buffer(4096).unwrap());
        let (count_a, count_b) = (
            Arc::new(CountingWaker::default()),
            Arc::new(CountingWaker::default()),
        );
        let (waker_a, waker_b) = (
            std::task::Waker::from(count_a.clone()),
            std::task::Waker::from(count_b.clone()),
        );
        let mut a = Box::pin(s.recv_buffer(&mut buf_a));
        let mut b = Box::pin(s.recv_buffer(&mut buf_b));
        assert!(a
            .as_mut()
            .poll(&mut Context::from_waker(&waker_a))
            .is_pending());
        assert!(b
            .as_mut()
            .poll(&mut Context::from_waker(&waker_b))
            .is_pending());
        c.send_msg(b"first").await.unwrap();
        c.send_msg(b"second").await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            b.as_mut()
                .poll(&mut Context::from_waker(&waker_b))
                .is_pending(),
            "B waits for the receive side, which A holds"
        );
        let before = count_b.count();
        match a.as_mut().poll(&mut Context::from_waker(&waker_a)) {
            Poll::Ready(Ok(Some(n))) => assert_eq!(n, 5, "A gets the first message"),
            other => panic!("A: {other:?}"),
        }
        drop(a);
        assert!(
            count_b.count() > before,
            "A is done with the receive side, and B (with a message waiting) was not woken"
        );
        match b.as_mut().poll(&mut Context::from_waker(&waker_b)) {
            Poll::Ready(Ok(Some(n))) => assert_eq!(n, 6, "B gets the second message"),
            other => panic!("B: {other:?}"),
        }
        drop(b);
        assert_eq!(&buf_a.as_slice().unwrap()[..5], b"first");
        assert_eq!(&buf_b.as_slice().unwrap()[..6], b"second");
        c.close().await.unwrap();
        s.close().await.unwrap();
    });
}

/// A reader and a writer task on each end of one connection, on a multi-thread runtime, no
/// keepalive to rescue a lost wake-up: every message arrives, in order.
#[test]
fn full_duplex_tasks_on_a_multi_thread_runtime() {
    run_multi_thread(async {
        let (c, s) = pair_without_keepalive().await;
        let (c, s) = (Arc::new(c), Arc::new(s));
        const N: u64 = 3000;
        let mut tasks = Vec::new();
        for (me, seed) in [(c.clone(), 1u64), (s.clone(), 2)] {
            let tx = me.clone();
            tasks.push(tokio::spawn(async move {
                for i in 0..N {
                    tx.send_msg(&pattern(1 + (i as usize * 131) % 3000, seed + i))
                        .await
                        .unwrap();
                }
            }));
            let peer_seed = 3 - seed;
            tasks.push(tokio::spawn(async move {
                for i in 0..N {
                    let m = me.recv_msg().await.unwrap().unwrap();
                    assert!(
                        m == pattern(1 + (i as usize * 131) % 3000, peer_seed + i),
                        "message {i}"
                    );
                }
            }));
        }
        for t in tasks {
            timeout(Duration::from_secs(60), t)
                .await
                .expect("a task stalled (a lost wake-up?)")
                .unwrap();
        }
        Arc::try_unwrap(c).unwrap().close().await.unwrap();
        Arc::try_unwrap(s).unwrap().close().await.unwrap();
    });
}

/// Runs `body` on the runtime `build` makes, on a thread of its own, failing the test if it
/// has not ended within 60 s of real time: the runtime may have no timer, or a paused clock,
/// so the limit cannot be tokio's.
fn run_on<F: Future<Output = ()>>(
    build: impl FnOnce() -> tokio::runtime::Runtime + Send + 'static,
    body: impl FnOnce() -> F + Send + 'static,
) {
    let (done, ended) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        build().block_on(body());
        let _ = done.send(());
    });
    match ended.recv_timeout(Duration::from_secs(60)) {
        Ok(()) => {}
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("the body hung"),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => panic!("the body panicked"),
    }
}

/// Keepalives while nobody awaits, messages, and a close with its linger, on a runtime with
/// no timer at all (`enable_io` alone: tokio panicked in the keeper and in `close`), then on
/// one whose clock is paused (the keeper slept on a clock that stood still: no keepalive in
/// 0.9 s of real time). The connections keep time on the monotonic clock, whatever the
/// runtime's clock does.
#[test]
fn connections_run_on_a_runtime_without_timers_and_on_a_paused_clock() {
    async fn talk_idle_and_close() {
        let o = || {
            opts(Establish::Tcp)
                .keepalive(Duration::from_millis(100))
                .peer_timeout(Duration::from_millis(600))
        };
        let (c, s) = pair(o(), o()).await;
        c.send_msg(b"one").await.unwrap();
        assert_eq!(s.recv_msg().await.unwrap().unwrap(), b"one");
        // Over a peer timeout of real time with no task awaiting either end: only the
        // keepers run (a blocking-pool thread sleeps; the runtime has no timer to sleep on).
        tokio::task::spawn_blocking(|| std::thread::sleep(Duration::from_millis(900)))
            .await
            .unwrap();
        c.send_msg(b"two").await.unwrap();
        assert_eq!(s.recv_msg().await.unwrap().unwrap(), b"two");
        let counters = c.counters().unwrap();
        assert!(
            counters.frames_received > 5,
            "PINGs and PONGs went: {counters:?}"
        );
        c.close().await.unwrap();
        assert_eq!(s.recv_msg().await.unwrap(), None);
        s.close().await.unwrap();
    }
    run_on(
        || {
            tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .build()
                .unwrap()
        },
        talk_idle_and_close,
    );
    run_on(
        || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .start_paused(true)
                .build()
                .unwrap()
        },
        talk_idle_and_close,
    );
}

const FDS_CHILD_ENV: &str = "RSRDMA_ASYNC_FDS_CHILD";

/// The listener of `an_async_listener_out_of_descriptors_waits_and_then_accepts`, run only
/// as a child process, as `conn_child_listener_out_of_descriptors` in conn_device.
#[test]
#[ignore = "runs as the child process of an_async_listener_out_of_descriptors_waits_and_then_accepts"]
fn async_child_listener_out_of_descriptors() {
    assert!(std::env::var(FDS_CHILD_ENV).is_ok());
    run(async {
        let l = listen(opts(Establish::Tcp));
        let fds = support::fill_descriptor_table();
        println!("listening {}", l.local_addr());
        let (freed, freer) = support::free_later(fds, Duration::from_millis(700));
        let s = timeout(Duration::from_secs(20), l.accept())
            .await
            .unwrap()
            .unwrap();
        // The premise: no accept could succeed before the table was freed.
        assert!(freed.load(std::sync::atomic::Ordering::SeqCst));
        let m = s.recv_msg().await.unwrap().unwrap();
        s.send_msg(&m).await.unwrap();
        s.close().await.unwrap();
        freer.join().unwrap();
    });
}

/// Running out of descriptors (EMFILE) is a condition that passes: `AsyncListener::accept`
/// waits it out and then accepts the peer that waited, instead of returning the error.
#[test]
fn an_async_listener_out_of_descriptors_waits_and_then_accepts() {
    let (mut child, addr) =
        support::spawn_listening_child("async_child_listener_out_of_descriptors", FDS_CHILD_ENV);
    run(async {
        let c = AsyncConn::dial(addr, opts(Establish::Tcp)).await.unwrap();
        c.send_msg(b"after EMFILE").await.unwrap();
        let m = timeout(Duration::from_secs(20), c.recv_msg())
            .await
            .unwrap();
        assert_eq!(m.unwrap().unwrap(), b"after EMFILE");
        drop(c);
    });
    assert!(child.wait().unwrap().success(), "the child listener failed");
}

/// An async close that finds another one running waits for its end and says what it said
/// (it returned `Ok` as soon as the other's teardown began). The peer is a stopped child
/// process: its slots fill, no credit comes back, and the rest of a message cancelled
/// half-way stays queued, so our FIN cannot go (as in conn_device's twin).
#[test]
fn an_async_close_racing_another_waits_for_its_end_and_says_the_same() {
    run(async {
        let linger = Duration::from_millis(600);
        let server = opts(Establish::Tcp).linger(linger).rendezvous(None);
        let (s, mut child) = child_peer(Establish::Tcp, server).await;
        signal(&child, libc::SIGSTOP);
        let msg = pattern(1 << 20, 1);
        let mut sent = 0;
        while timeout(Duration::from_millis(100), s.send_msg(&msg))
            .await
            .is_ok()
        {
            sent += 1;
            assert!(sent < 10_000, "the stopped peer's slots never filled");
        }
        let t0 = Instant::now();
        let first = async {
            let r = s.close().await;
            (r, t0.elapsed())
        };
        let second = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let r = s.close().await;
            (r, t0.elapsed())
        };
        let ((first, first_took), (second, second_took)) = tokio::join!(first, second);
        signal(&child, libc::SIGKILL);
        child.wait().unwrap();
        support::assert_racing_closes_both_lingered(
            (first, first_took),
            (second, second_took),
            linger,
        );
    });
}

/// `start_send_buffer` is ready in the very poll that queues its message, so a caller that
/// drops it while pending and sends again sends each message once; `send_buffer`'s own
/// cancellation cannot tell (its message may be queued and done by the time it is dropped).
/// A tester's program on a multi-thread runtime, where another thread finishes the sends:
/// retrying cancelled `send_buffer`s on an idle buffer duplicated about 1 message in 2000
/// one run in five; here every message must arrive once, in order.
#[test]
fn a_cancelled_start_send_buffer_queued_nothing_and_a_retry_sends_each_message_once() {
    run_multi_thread(async {
        let o = opts(Establish::Tcp);
        let l = listen(o.clone());
        let addr = l.local_addr();
        let n = 400u64;
        let server = tokio::spawn(async move {
            let s = l.accept().await.unwrap();
            let mut got = Vec::new();
            while let Some(m) = s.recv_msg().await.unwrap() {
                got.push(u64::from_le_bytes(m[..8].try_into().unwrap()));
                // A slow reader: the sender's messages wait for credit.
                if got.len() % 8 == 0 {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
            got
        });
        let c = AsyncConn::dial(addr, o).await.unwrap();
        let mut pending = 0;
        let mut seq = 0u64;
        for size in [100_000usize, 300_000] {
            // Two buffers in turn: one's message still going keeps the next one waiting.
            let mut bufs = [c.alloc_buffer(size).unwrap(), c.alloc_buffer(size).unwrap()];
            for k in 0..n as usize / 2 {
                let buf = &mut bufs[k % 2];
                c.wait_buffer(buf).await.unwrap();
                buf.as_mut_slice().unwrap()[..8].copy_from_slice(&seq.to_le_bytes());
                seq += 1;
                loop {
                    match poll_once(c.start_send_buffer(buf, size)).await {
                        Some(r) => break r.unwrap(),
                        None => {
                            pending += 1;
                            assert!(!buf.is_busy(), "dropped before ready, yet queued");
                            tokio::task::yield_now().await;
                        }
                    }
                }
            }
            for b in &bufs {
                c.wait_buffer(b).await.unwrap();
            }
        }
        assert!(
            pending > 0,
            "no send was ever pending: nothing was cancelled"
        );
        c.close().await.unwrap();
        let got = server.await.unwrap();
        assert_eq!(
            got,
            (0..n).collect::<Vec<_>>(),
            "lost or duplicated messages"
        );
    });
}

/// An `AsyncConn` whose application awaits nothing for a while still answers what its peer
/// sends at once, as the blocking face's progress thread does: with keepalive off, its
/// keeper stepped only on deadlines it had none of, so a blocking peer's PINGs went
/// unanswered and the peer declared it dead; with keepalive on, a withdrawal waited for
/// the next keepalive tick (a tester's blocking send with a 10 ms write timeout took 1 s).
/// In busy mode too, where the keeper never arms the CQ: it looks in every 5 ms.
#[test]
fn an_idle_async_peer_answers_pings_and_withdrawals_at_once() {
    for mode in [PollMode::default(), PollMode::Busy] {
        idle_async_peer_answers(mode);
    }
}

fn idle_async_peer_answers(mode: PollMode) {
    run_multi_thread(async move {
        let l = listen(opts(Establish::Tcp).keepalive(None).poll_mode(mode));
        let addr = l.local_addr();
        let server = tokio::spawn(async move {
            let s = l.accept().await.unwrap();
            // The application does other things: nothing awaits the connection.
            tokio::time::sleep(Duration::from_millis(1500)).await;
            s.send_msg(b"after a while").await.unwrap();
            let mut got = Vec::new();
            while let Some(m) = s.recv_msg().await.unwrap() {
                got.push(m);
            }
            got
        });
        let client = tokio::task::spawn_blocking(move || {
            let o = opts(Establish::Tcp)
                .keepalive(Some(Duration::from_millis(100)))
                .peer_timeout(Duration::from_millis(600));
            let c = rsrdma_net::Conn::dial(addr, o).unwrap();
            // Withdrawals: answered by the idle peer's keeper, a round trip past the timeout.
            c.set_write_timeout(Some(Duration::from_millis(20)))
                .unwrap();
            let threshold = c.info().settled.rendezvous().expect("rendezvous") as usize;
            for _ in 0..3 {
                let t0 = Instant::now();
                let e = c.send_msg(&vec![3u8; 2 * threshold]).unwrap_err();
                assert!(matches!(e, NetError::Timeout { .. }), "{e:?}");
                assert!(
                    t0.elapsed() < Duration::from_millis(500),
                    "the idle peer answered after {:?}",
                    t0.elapsed()
                );
            }
            // Pings: answered, so the peer lives past its 600 ms timeout.
            c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let m = c.recv_msg().unwrap().unwrap();
            assert_eq!(m, b"after a while");
            c.set_write_timeout(None).unwrap();
            c.send_msg(b"bye").unwrap();
            c.close().unwrap();
        });
        client.await.unwrap();
        assert_eq!(server.await.unwrap(), vec![b"bye".to_vec()]);
    });
}

/// As the blocking listener's test of the same name: a connection whose establishment
/// finished but that nobody accepted ends in an error at its dialer when the listener is
/// dropped, not in an end-of-stream (which would say the server read what it was sent).
#[test]
fn a_dropped_listener_refuses_what_it_never_handed_out() {
    run_multi_thread(async {
        let l = listen(opts(Establish::Tcp));
        let addr = l.local_addr();
        let dials: Vec<_> = (0..2)
            .map(|_| tokio::spawn(AsyncConn::dial(addr, opts(Establish::Tcp))))
            .collect();
        let s = timeout(Duration::from_secs(30), l.accept())
            .await
            .unwrap()
            .unwrap();
        let mut dialed = Vec::new();
        for d in dials {
            dialed.push(d.await.unwrap().unwrap());
        }
        let (mut accepted, mut queued): (Vec<AsyncConn>, Vec<AsyncConn>) = dialed
            .into_iter()
            .partition(|c| c.local_addr() == s.peer_addr());
        let (c, unaccepted) = (accepted.pop().unwrap(), queued.pop().unwrap());
        unaccepted
            .send_msg(b"for a server that never reads it")
            .await
            .unwrap();
        // Both finished (the second's report waits for an accept) before the drop.
        tokio::time::sleep(Duration::from_millis(200)).await;
        drop(l);
        let r = timeout(Duration::from_secs(20), unaccepted.recv_msg())
            .await
            .expect("the unaccepted connection's dialer waited past 20 s");
        let told = r.as_ref().err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            matches!(r, Err(NetError::ConnFailed(_)))
                && told.contains("listener closed before anyone accepted"),
            "an unaccepted connection's dialer: {r:?}"
        );
        c.send_msg(b"still here").await.unwrap();
        let got = timeout(Duration::from_secs(10), s.recv_msg())
            .await
            .unwrap();
        assert_eq!(got.unwrap().as_deref(), Some(&b"still here"[..]));
    });
}

/// The async objects that register with tokio's reactor say so as an error, not a panic,
/// outside a runtime or in one built without IO (an outside tester's find: a panic in
/// `AsyncPacketConn::bind`).
#[test]
fn binding_outside_a_runtime_with_io_is_an_error_not_a_panic() {
    let io_error = |r: Result<(), NetError>, what: &str| match r {
        Err(NetError::Io { source, .. }) => {
            assert!(source.to_string().contains(what), "{source}")
        }
        other => panic!("expected an Io error saying {what:?}: {other:?}"),
    };
    io_error(
        AsyncPacketConn::bind(packet_opts()).map(drop),
        "no tokio runtime",
    );
    io_error(
        AsyncListener::bind("127.0.0.1:0", opts(Establish::Tcp)).map(drop),
        "no tokio runtime",
    );
    // A dial polled by another executor than tokio's: it fails at its first poll.
    let mut dial = std::pin::pin!(AsyncConn::dial("127.0.0.1:9", opts(Establish::Tcp)));
    let waker = futures::task::noop_waker();
    match dial.as_mut().poll(&mut Context::from_waker(&waker)) {
        Poll::Ready(r) => io_error(r.map(drop), "no tokio runtime"),
        Poll::Pending => panic!("a dial outside a runtime waited"),
    }
    let no_io = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    no_io.block_on(async {
        io_error(
            AsyncPacketConn::bind(packet_opts()).map(drop),
            "no IO driver",
        );
        io_error(
            AsyncListener::bind("127.0.0.1:0", opts(Establish::Tcp)).map(drop),
            "no IO driver",
        );
    });
}

/// A close polled once and dropped, then the connection dropped: what was queued still
/// reaches the peer whole, then the end of the stream, as with a drop without close (an
/// outside tester's find: the drop tore down at once, and the peer lost a 1 MiB message still
/// waiting for credits, 5 of 5).
#[test]
fn a_close_dropped_half_way_then_the_connection_still_delivers() {
    run(async {
        let l = listen(opts(Establish::Tcp));
        let addr = l.local_addr();
        let size = 1 << 20;
        let server = tokio::spawn(async move {
            let s = l.accept().await.unwrap();
            let mut got = Vec::new();
            loop {
                match s.recv_msg().await {
                    Ok(Some(m)) => got.push(m),
                    Ok(None) => return Ok(got),
                    Err(e) => return Err((got.len(), e)),
                }
            }
        });
        let c = AsyncConn::dial(addr, opts(Establish::Tcp)).await.unwrap();
        let msg = pattern(size, 5);
        c.send_msg(&msg).await.unwrap();
        assert!(
            poll_once(c.close()).await.is_none(),
            "the close finished at once"
        );
        drop(c);
        let got = timeout(Duration::from_secs(30), server)
            .await
            .unwrap()
            .unwrap();
        match got {
            Ok(got) => assert!(got.len() == 1 && got[0] == msg, "{} messages", got.len()),
            Err((n, e)) => panic!("after {n} messages: {e}"),
        }
    });
}
