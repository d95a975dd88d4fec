//! The tools' entry point: parse, open the device, connect the exchange channel (TCP, or
//! rdma_cm with `-R`) and run one end
//! ([`crate::session::run_connected`]), or both with `--loopback`.

use crate::args::{self, Params, ParseOutcome};
use crate::cmlink;
use crate::device::{adjust_for_device, open_device, port_info};
use crate::error::{Error, Result};
use crate::oob::{self, Oob};
use crate::out::Out;
use crate::report;
use crate::session::run_connected;
use crate::Tool;
use std::io::Write;

/// What the binaries call: parse, run, print errors, return the exit code.
pub fn main(tool: Tool) -> i32 {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let p = match args::parse(tool, &argv) {
        Ok(p) => p,
        Err(ParseOutcome::Print { stdout, code }) => {
            print!("{stdout}");
            return code;
        }
        Err(ParseOutcome::Error { stderr, stdout }) => {
            eprint!("{stderr}");
            print!("{stdout}");
            return 1;
        }
    };
    // A report that cannot be written fails the run before it starts, not silently after
    // it (the run said "Couldn't write" and exited 0, so a script took it for a success).
    if let Some(path) = &p.out_json {
        let opened = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(path);
        if let Err(e) = opened {
            eprintln!(" Couldn't open the json report file {path}: {e}");
            return 1;
        }
    }
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let r = if p.loopback {
        loopback(&p, &mut out)
    } else {
        single(&p, &mut out)
    };
    let _ = out.flush();
    match r {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("{e}");
            1
        }
    }
}

/// Runs one end as its own process would: open the device, connect, run.
fn single(p: &Params, out: &mut dyn Write) -> Result<()> {
    let mut o = Out::new(out, p.output.is_some());
    o.notes(p);
    one_end(p, &mut o, |p, o| {
        let host = p.host.as_deref().unwrap_or_default();
        match (p.is_server(), p.rdma_cm) {
            (false, false) => Oob::connect(host, p.port),
            (false, true) => Oob::connect_rdma_cm(host, p.port),
            (true, false) => {
                let l = oob::listen(p.port)?;
                o.text(report::BANNER);
                o.flush();
                Oob::accept(l)
            }
            (true, true) => {
                let l = cmlink::listen(p.port, 1)?;
                o.text(report::BANNER);
                o.flush();
                Oob::accept_rdma_cm(l)
            }
        }
    })
}

/// Opens the device and its port, applies the device's rules, gets the TCP channel from
/// `channel` and runs.
fn one_end(
    p: &Params,
    o: &mut Out<'_>,
    channel: impl FnOnce(&Params, &mut Out<'_>) -> Result<Oob>,
) -> Result<()> {
    let ctx = open_device(p)?;
    let port = port_info(&ctx, p)?;
    let p = adjust_for_device(p, &ctx, &port, o)?;
    let oob = channel(&p, o)?;
    run_connected(&p, &ctx, &port, oob, o)
}

/// `--loopback`: the server runs on a thread with its output discarded; this thread is the
/// client and prints what a client prints.
fn loopback(p: &Params, out: &mut dyn Write) -> Result<()> {
    let mut o = Out::new(out, p.output.is_some());
    o.notes(p);
    let listener = oob::listen(p.port)?;
    let port_no = listener.local_addr().map(|a| a.port()).unwrap_or(p.port);
    let server = spawn_server(p, listener)?;
    let mut cp = p.clone();
    cp.loopback = false;
    cp.host = Some("127.0.0.1".into());
    let client = one_end(&cp, &mut o, |_, _| Oob::connect("127.0.0.1", port_no));
    let srv = server
        .join()
        .unwrap_or_else(|_| Err(Error::Oob(" The loopback server thread panicked".into())));
    match (client, srv) {
        (Ok(()), Ok(())) => Ok(()),
        (Err(e), _) => Err(e),
        (Ok(()), Err(e)) => Err(Error::Oob(format!(" loopback server: {e}"))),
    }
}

/// The loopback server: a thread that accepts on `listener`, its output discarded.
fn spawn_server(
    p: &Params,
    listener: std::net::TcpListener,
) -> Result<std::thread::JoinHandle<Result<()>>> {
    let mut sp = p.clone();
    sp.loopback = false;
    sp.host = None;
    sp.out_json = None;
    std::thread::Builder::new()
        .name("loopback-server".into())
        .spawn(move || {
            let mut sink = std::io::sink();
            let mut so = Out::new(&mut sink, true);
            one_end(&sp, &mut so, |_, _| Oob::accept(listener))
        })
        .map_err(|e| Error::Oob(format!(" Unable to start the loopback server thread: {e}")))
}
