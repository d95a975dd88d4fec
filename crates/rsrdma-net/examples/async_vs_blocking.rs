//! AsyncConn against the blocking Conn: one-way throughput of 64 KiB messages over two
//! connections of the same options, measured in alternating runs in one process; prints
//! each run, the medians and their ratio (async / blocking).
//!
//! Each side of each connection runs on a thread of its own: the blocking ends in plain
//! threads (plus their progress threads), the async ends each in a current-thread runtime.
//!
//! ```text
//! cargo build --release -p rsrdma-net --features tokio --example async_vs_blocking
//! cargo xtask vm -- target/release/examples/async_vs_blocking [IP] [MESSAGES] [RUNS] [MODE]
//! ```
//! Defaults: 10.77.0.1 (the VM's rxe0), 1000 messages per run, 9 runs of each, adaptive.
//! MODE is `event`, `adaptive` or `busy`.

use rsrdma_net::progress::PollMode;
use rsrdma_net::{AsyncConn, AsyncListener, Conn, ConnOptions, Listener};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

const MSG: usize = 64 * 1024;

/// A worker's queue of runs (message counts; 0 stops it). Tokio's channel, so that the
/// async workers keep their runtime (and so their keepers) running between runs.
type Job = UnboundedReceiver<usize>;
/// The sending end of a worker's queue.
type Go = UnboundedSender<usize>;
/// Where a receiver reports the end of a run.
type Done = mpsc::Sender<Instant>;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let ip = args.get(1).cloned().unwrap_or_else(|| "10.77.0.1".into());
    let msgs: usize = args.get(2).and_then(|v| v.parse().ok()).unwrap_or(1000);
    let runs: usize = args.get(3).and_then(|v| v.parse().ok()).unwrap_or(9);
    let mode = match args.get(4).map(String::as_str) {
        Some("event") => PollMode::Event,
        Some("busy") => PollMode::Busy,
        _ => PollMode::default(),
    };
    // A long peer timeout: the emulated VM can stall for seconds when its host is busy, and
    // a stall must not end a connection mid-benchmark (both pairs get the same options).
    let opts = ConnOptions::default()
        .poll_mode(mode)
        .peer_timeout(Duration::from_secs(60));

    let (blocking_go, blocking_done) = start_blocking(&ip, &opts);
    let (async_go, async_done) = start_async(&ip, &opts);

    // Warm both up, then alternate (the order flips every run).
    let _ = measure(&blocking_go, &blocking_done, msgs / 4);
    let _ = measure(&async_go, &async_done, msgs / 4);
    let (mut b, mut a) = (Vec::new(), Vec::new());
    for run in 0..runs {
        let order = if run % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        for is_async in order {
            let mibs = if is_async {
                let r = measure(&async_go, &async_done, msgs);
                a.push(r);
                r
            } else {
                let r = measure(&blocking_go, &blocking_done, msgs);
                b.push(r);
                r
            };
            let what = if is_async { "async   " } else { "blocking" };
            println!("run {run} {what}: {mibs:8.1} MiB/s");
        }
    }
    for go in blocking_go.iter().chain(&async_go) {
        let _ = go.send(0);
    }
    let (mb, ma) = (median(&mut b), median(&mut a));
    println!(
        "64 KiB messages, {msgs} per run, {runs} runs each, {mode:?}: blocking median {mb:.1} \
         MiB/s, async median {ma:.1} MiB/s, async/blocking {:.3}",
        ma / mb
    );
}

/// One run of `msgs` messages; MiB/s from the start to the receiver's last message.
fn measure(go: &[Go; 2], done: &mpsc::Receiver<Instant>, msgs: usize) -> f64 {
    let t0 = Instant::now();
    for g in go {
        g.send(msgs).unwrap();
    }
    let end = done
        .recv_timeout(Duration::from_secs(300))
        .expect("a run took over 300 s");
    (msgs * MSG) as f64 / (1 << 20) as f64 / end.duration_since(t0).as_secs_f64()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Two blocking Conns' worker threads: [sender, receiver].
fn start_blocking(ip: &str, opts: &ConnOptions) -> ([Go; 2], mpsc::Receiver<Instant>) {
    let l = Listener::bind(format!("{ip}:0"), opts.clone()).unwrap();
    let addr = l.local_addr();
    let acceptor = thread::spawn(move || l.accept_timeout(Duration::from_secs(20)).unwrap());
    let client = Conn::dial(addr, opts.clone()).unwrap();
    let server = acceptor.join().unwrap();
    let (done_tx, done) = mpsc::channel();
    let send = worker(
        move |jobs: Job, _| {
            let msg = vec![7u8; MSG];
            let mut jobs = jobs;
            while let Some(n @ 1..) = jobs.blocking_recv() {
                for _ in 0..n {
                    client.send_msg(&msg).unwrap();
                }
            }
        },
        done_tx.clone(),
    );
    let recv = worker(
        move |jobs: Job, done: Done| {
            let mut buf = vec![0u8; MSG];
            let mut jobs = jobs;
            while let Some(n @ 1..) = jobs.blocking_recv() {
                for _ in 0..n {
                    server.recv_msg_into(&mut buf).unwrap().unwrap();
                }
                done.send(Instant::now()).unwrap();
            }
        },
        done_tx,
    );
    ([send, recv], done)
}

/// Two AsyncConns, each end on a current-thread runtime on its own thread.
fn start_async(ip: &str, opts: &ConnOptions) -> ([Go; 2], mpsc::Receiver<Instant>) {
    let (addr_tx, addr_rx) = mpsc::channel();
    let (done_tx, done) = mpsc::channel();
    let (ip, o) = (ip.to_string(), opts.clone());
    let recv = worker(
        move |jobs: Job, done: Done| {
            let rt = runtime();
            let server = rt.block_on(async {
                let l = AsyncListener::bind(format!("{ip}:0"), o).unwrap();
                addr_tx.send(l.local_addr()).unwrap();
                l.accept().await.unwrap()
            });
            let mut buf = vec![0u8; MSG];
            let mut jobs = jobs;
            rt.block_on(async {
                while let Some(n @ 1..) = jobs.recv().await {
                    for _ in 0..n {
                        server.recv_msg_into(&mut buf).await.unwrap().unwrap();
                    }
                    done.send(Instant::now()).unwrap();
                }
                server.close().await.ok();
            });
        },
        done_tx.clone(),
    );
    let addr = addr_rx.recv_timeout(Duration::from_secs(20)).unwrap();
    let o = opts.clone();
    let send = worker(
        move |jobs: Job, _| {
            let rt = runtime();
            let client = rt.block_on(AsyncConn::dial(addr, o)).unwrap();
            let msg = vec![7u8; MSG];
            let mut jobs = jobs;
            rt.block_on(async {
                while let Some(n @ 1..) = jobs.recv().await {
                    for _ in 0..n {
                        client.send_msg(&msg).await.unwrap();
                    }
                }
                client.close().await.ok();
            });
        },
        done_tx,
    );
    ([send, recv], done)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A thread that runs `body` with its job queue; returns the queue's sender.
fn worker(body: impl FnOnce(Job, Done) + Send + 'static, done: Done) -> Go {
    let (tx, rx) = unbounded_channel();
    thread::spawn(move || body(rx, done));
    tx
}
