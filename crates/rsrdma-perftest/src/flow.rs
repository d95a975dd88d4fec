//! The test phase (spec 1.5): per message size, the sync handshakes, the data path, the
//! REPORT exchange and the printed lines, in each tool's order.

use crate::args::{Params, RESULT_LINE};
use crate::datapath;
use crate::error::Result;
use crate::handshake::Ends;
use crate::oob::Wait;
use crate::out::Out;
use crate::report::{self, HeaderInfo};
use crate::resources::Res;
use crate::results::{
    exchange_report, print_bw, print_lat, print_lat_duration, sum, to_report, unit,
};
use crate::stats::{self, BwResult};
use crate::wire::Report;
use crate::Verb;

/// What the test phase of one run needs besides the resources and the peer.
pub struct Phase<'p, 'o, 'w> {
    /// The options.
    pub p: &'p Params,
    /// The header's values (for the JSON report).
    pub h: &'p HeaderInfo,
    /// Where the text goes.
    pub o: &'o mut Out<'w>,
    /// The message sizes, in order.
    pub sizes: &'p [u64],
}

/// The bandwidth test phase: the table, then any probe lines.
///
/// # Errors
/// A failed exchange or data path.
pub fn bw(ph: &mut Phase<'_, '_, '_>, res: &mut Res, ends: &mut Ends<'_>) -> Result<()> {
    let p = ph.p;
    ph.o.text(&report::bw_table_header(p.report_gbits));
    ph.o.flush();
    let probe_lines = match p.tool.verb {
        Verb::Write | Verb::Read | Verb::Atomic if !p.bidir && p.is_server() => {
            one_sided_passive(ph, ends)?;
            Vec::new()
        }
        Verb::Write | Verb::Read | Verb::Atomic if !p.bidir => one_sided_client(ph, res, ends)?,
        Verb::Write | Verb::Read | Verb::Atomic => one_sided_bidir(ph, res, ends)?,
        Verb::Send => send(ph, res, ends)?,
    };
    ph.o.text(RESULT_LINE);
    for l in probe_lines {
        ph.o.text(&l);
    }
    ph.o.flush();
    Ok(())
}

fn long_wait(p: &Params) -> Wait {
    Wait::Long(p.duration.unwrap_or(0))
}

/// The passive side of write/read: the client runs every size, then reports the last one,
/// which this side prints.
fn one_sided_passive(ph: &mut Phase<'_, '_, '_>, ends: &mut Ends<'_>) -> Result<()> {
    ends.hs.one(ends.oob, long_wait(ph.p))?;
    let got = exchange_report(ends, &Report::default())?;
    let r = BwResult {
        size: got.size,
        iters: got.iters,
        peak: got.bw_peak,
        avg: got.bw_avg,
        msg_rate: got.msg_rate,
    };
    print_bw(ph.p, ph.h, ph.o, &r);
    Ok(())
}

/// The active side of write/read: every size, then the closing report.
fn one_sided_client(
    ph: &mut Phase<'_, '_, '_>,
    res: &mut Res,
    ends: &mut Ends<'_>,
) -> Result<Vec<String>> {
    let mut probe_lines = Vec::new();
    let mut last = BwResult::default();
    for &size in ph.sizes {
        let run = datapath::bw_run(ph.p, res, ends, size, unit(ph.p))?;
        last = run.result;
        print_bw(ph.p, ph.h, ph.o, &last);
        probe_lines.extend(run.probe);
    }
    // The passive server has waited in this handshake since the run began: it answers at
    // once (a server stopped meanwhile is found in 30 s, not after the run's 600 s + D).
    ends.hs.one(ends.oob, Wait::Prompt)?;
    // The server answers with whatever it has (perftest: garbage): ignored.
    let _ = exchange_report(ends, &to_report(&last))?;
    Ok(probe_lines)
}

/// Bidirectional write/read: both sides run each size and print the sum of both reports.
fn one_sided_bidir(
    ph: &mut Phase<'_, '_, '_>,
    res: &mut Res,
    ends: &mut Ends<'_>,
) -> Result<Vec<String>> {
    let p = ph.p;
    let mut probe_lines = Vec::new();
    for (k, &size) in ph.sizes.iter().enumerate() {
        if k == 0 || p.all {
            ends.hs.one(ends.oob, Wait::Prompt)?;
        }
        let run = datapath::bw_run(p, res, ends, size, unit(p))?;
        if p.all {
            ends.hs.one(ends.oob, long_wait(p))?;
        }
        let peer = exchange_report(ends, &to_report(&run.result))?;
        print_bw(p, ph.h, ph.o, &sum(&run.result, &peer));
        probe_lines.extend(run.probe);
    }
    Ok(probe_lines)
}

/// send_bw: receives posted before each size's handshake; bidirectional runs print the sum.
fn send(ph: &mut Phase<'_, '_, '_>, res: &mut Res, ends: &mut Ends<'_>) -> Result<Vec<String>> {
    let p = ph.p;
    let mut probe_lines = Vec::new();
    for (k, &size) in ph.sizes.iter().enumerate() {
        datapath::prepost_recvs(p, res, size)?;
        if k == 0 || p.all {
            ends.hs.one(ends.oob, Wait::Prompt)?;
        }
        let run = datapath::bw_run(p, res, ends, size, unit(p))?;
        if p.bidir {
            let peer = exchange_report(ends, &to_report(&run.result))?;
            print_bw(p, ph.h, ph.o, &sum(&run.result, &peer));
        } else {
            print_bw(p, ph.h, ph.o, &run.result);
        }
        probe_lines.extend(run.probe);
        if p.all {
            ends.hs.one(ends.oob, long_wait(p))?;
        }
    }
    Ok(probe_lines)
}

/// The latency test phase: per size the ping-pong (or reads), the histogram if asked, the
/// summary line (with `-D`, the duration line). The read and atomic servers are passive and
/// print nothing.
///
/// # Errors
/// A failed exchange or data path.
pub fn lat(ph: &mut Phase<'_, '_, '_>, res: &mut Res, ends: &mut Ends<'_>) -> Result<()> {
    let p = ph.p;
    if p.tool.verb.reads() && p.is_server() {
        // Passive: the client reads our memory; we wait in the closing handshake.
        return Ok(());
    }
    ph.o.text(if p.duration.is_some() {
        report::LAT_DURATION_HEADER
    } else {
        report::LAT_TABLE_HEADER
    });
    ph.o.flush();
    let rtt = if p.tool.verb.reads() { 1.0 } else { 2.0 };
    let per_usec = if p.report_cycles {
        rtt
    } else {
        stats::MHZ * rtt
    };
    for &size in ph.sizes {
        let run = match p.tool.verb {
            Verb::Send => {
                datapath::prepost_recvs(p, res, size)?;
                ends.hs.one(ends.oob, Wait::Prompt)?;
                datapath::send_lat(p, res, ends, size)?
            }
            Verb::Write => datapath::write_lat(p, res, ends, size)?,
            Verb::Read | Verb::Atomic => datapath::one_sided_lat(p, res, ends, size)?,
        };
        if let Some((iters, ns)) = run.window {
            let r = stats::lat_duration(size, iters, ns, per_usec);
            print_lat_duration(p, ph.h, ph.o, &r);
            continue;
        }
        let mut samples = stats::lat_samples(&run.tposted);
        if p.histogram {
            histogram(ph, &samples, per_usec);
        }
        let r = stats::lat_summary(size, p.iters, &mut samples, per_usec);
        print_lat(p, ph.h, ph.o, &r);
    }
    ph.o.text(RESULT_LINE);
    ph.o.flush();
    Ok(())
}

/// `-H`/`-U`: every sample (sorted unless `-U`), then the table header again.
fn histogram(ph: &mut Phase<'_, '_, '_>, samples: &[u64], per_usec: f64) {
    let mut shown = samples.to_vec();
    if !ph.p.unsorted {
        shown.sort_unstable();
    }
    let us: Vec<f64> = shown.iter().map(|&c| c as f64 / per_usec).collect();
    ph.o.text(&report::histogram(&us));
    ph.o.text(RESULT_LINE);
    ph.o.text(report::LAT_TABLE_HEADER);
}
