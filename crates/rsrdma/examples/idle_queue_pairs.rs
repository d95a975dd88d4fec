//! What idle queue pairs cost the busy ones: a send and its receive between two queue pairs
//! of this process, alone and beside many idle connected ones, in alternating rounds.
//!
//! ```text
//! idle_queue_pairs [-d|--device D] [-x|--gid-index N] [--idle N] [--iters N] [--rounds N]
//! ```
//!
//! Each round times `iters` round trips (post a receive and a signalled 8-byte SEND, reap
//! both completions) with no other queue pair, then connects `idle` pairs of queue pairs
//! that do nothing and times the same again, then drops them. It prints each side's median
//! in nanoseconds and their ratio. On `soft0` a device-wide pump served every queue pair on
//! every post and poll: with 1024 queue pairs in the process a round trip took about 100 µs
//! against 1 µs without them; it now serves only those with work, and the ratio is about 1.
//! On a NIC the ratio is about 1 too (idle queue pairs cost the hardware nothing).
//!
//! `cargo xtask bench soft` runs it; `cargo xtask test` runs it small, as a check that it
//! works.

use rsrdma::{AccessFlags, ConnectOptions, Context, Cq, Mr, Pd, Qp, QpType, RecvWr, SendWr, Wc};
use std::time::Instant;

struct Opts {
    device: Option<String>,
    gid_index: Option<u8>,
    idle: usize,
    iters: usize,
    rounds: usize,
}

fn parse() -> Result<Opts, String> {
    let mut o = Opts {
        device: None,
        gid_index: None,
        idle: 512,
        iters: 20_000,
        rounds: 5,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        let number = |v: String, name: &str| {
            v.parse::<usize>()
                .map_err(|_| format!("{name}: not a number: {v:?}"))
        };
        match a.as_str() {
            "-d" | "--device" => o.device = Some(value("--device")?),
            "-x" | "--gid-index" => {
                let v = value("--gid-index")?;
                o.gid_index = Some(v.parse().map_err(|_| format!("bad GID index {v:?}"))?);
            }
            "--idle" => o.idle = number(value("--idle")?, "--idle")?,
            "--iters" => o.iters = number(value("--iters")?, "--iters")?.max(1),
            "--rounds" => o.rounds = number(value("--rounds")?, "--rounds")?.max(1),
            _ => return Err(format!("unknown argument {a:?}")),
        }
    }
    Ok(o)
}

/// Two RC queue pairs of this process connected to each other.
fn connected(
    pd: &Pd,
    gid_index: Option<u8>,
    a_cq: &Cq,
    b_cq: &Cq,
) -> Result<(Qp, Qp), rsrdma::Error> {
    let a = Qp::builder(QpType::Rc).build(pd, a_cq, a_cq)?;
    let b = Qp::builder(QpType::Rc).build(pd, b_cq, b_cq)?;
    let mut opts = ConnectOptions::default();
    opts.gid_index = gid_index;
    let (ea, eb) = (a.endpoint(1, gid_index, 1)?, b.endpoint(1, gid_index, 2)?);
    a.connect(&opts, ea.psn, &eb)?;
    b.connect(&opts, eb.psn, &ea)?;
    Ok((a, b))
}

/// The busy pair and the memory its requests use.
struct Busy {
    a: Qp,
    b: Qp,
    a_cq: Cq,
    b_cq: Cq,
    mr: Mr,
}

impl Busy {
    /// Nanoseconds per round trip over `iters`.
    fn time(&self, iters: usize) -> Result<f64, Box<dyn std::error::Error>> {
        let send = [self.mr.sge(0, 8)?];
        let recv = [self.mr.sge(64, 8)?];
        let mut wcs = [Wc::default(); 4];
        let t0 = Instant::now();
        for i in 0..iters as u64 {
            // SAFETY: `self.mr` outlives both requests, whose completions are reaped below
            // before the next round trip.
            unsafe {
                self.b.post_recv(&RecvWr::new(i, &recv))?;
                self.a.post_send(&SendWr::send(i, &send).signaled(true))?;
            }
            for cq in [&self.b_cq, &self.a_cq] {
                let n = cq.poll_blocking(&mut wcs[..1], std::time::Duration::from_secs(10))?;
                if n != 1 {
                    return Err("a completion did not come".into());
                }
                wcs[0].ok()?;
            }
        }
        Ok(t0.elapsed().as_nanos() as f64 / iters as f64)
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn run(o: &Opts) -> Result<(), Box<dyn std::error::Error>> {
    let ctx = match &o.device {
        Some(name) => rsrdma::open(name)?,
        None => {
            let list = rsrdma::devices()?;
            let first = list.iter().next().ok_or("no RDMA device found")?;
            Context::open(&first)?
        }
    };
    let gid_index = ctx.resolve_gid_index(1, o.gid_index)?;
    let pd = Pd::new(&ctx)?;
    let (a_cq, b_cq) = (Cq::new(&ctx, 16, None)?, Cq::new(&ctx, 16, None)?);
    let (a, b) = connected(&pd, gid_index, &a_cq, &b_cq)?;
    let mr = Mr::new(&pd, 128, AccessFlags::LOCAL_WRITE)?;
    let busy = Busy {
        a,
        b,
        a_cq,
        b_cq,
        mr,
    };
    let idle_cq = Cq::new(&ctx, 16, None)?;
    // Warm up (the first requests fault the pages in).
    busy.time(o.iters.min(1000))?;
    let (mut alone, mut beside) = (Vec::new(), Vec::new());
    for _ in 0..o.rounds {
        alone.push(busy.time(o.iters)?);
        let idle = (0..o.idle)
            .map(|_| connected(&pd, gid_index, &idle_cq, &idle_cq))
            .collect::<Result<Vec<_>, _>>()?;
        beside.push(busy.time(o.iters)?);
        drop(idle);
    }
    let (a, b) = (median(&mut alone), median(&mut beside));
    println!(
        "{:<34} {:>12} {:>12}",
        "send + receive round trip, ns",
        "2 QPs",
        format!("+{} QPs", 2 * o.idle)
    );
    println!(
        "{:<34} {a:>12.0} {b:>12.0}",
        format!("median of {} rounds", o.rounds)
    );
    println!("idle queue pairs: ratio {:.2} (target <= 1.5)", b / a);
    Ok(())
}

fn main() {
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("idle_queue_pairs: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(&o) {
        eprintln!("idle_queue_pairs: {e}");
        std::process::exit(1);
    }
}
