//! A run's results: the REPORT exchange with the peer and the printed lines (with `--output=`
//! and `--out_json`).

use crate::args::{OutputOnly, Params};
use crate::error::{Error, Result};
use crate::handshake::Ends;
use crate::oob::Wait;
use crate::out::Out;
use crate::report::{self, HeaderInfo, JsonResults};
use crate::stats::{BwResult, LatDurationResult, LatResult};
use crate::wire::Report;

/// The bandwidth unit: Gbit/s with `--report_gbits`, else MiB/s.
pub fn unit(p: &Params) -> f64 {
    if p.report_gbits {
        crate::stats::GBIT
    } else {
        crate::stats::MIB
    }
}

/// Sends this side's report and returns the peer's (five 8-byte messages each way).
///
/// # Errors
/// perftest's message for a failed read.
pub fn exchange_report(ends: &mut Ends<'_>, r: &Report) -> Result<Report> {
    let msgs = r.encode();
    let mut got = [[0u8; 8]; 5];
    for (m, g) in msgs.iter().zip(got.iter_mut()) {
        ends.oob
            .exchange("reports", m, g, Wait::Prompt)
            .map_err(|e| Error::Oob(format!("ethernet_read_data: Couldn't read reports\n{e}")))?;
    }
    Ok(Report::decode(&got))
}

/// Prints a bandwidth line (or the `--output=` value) and writes the JSON report if asked.
pub fn print_bw(p: &Params, h: &HeaderInfo, o: &mut Out<'_>, r: &BwResult) {
    o.text(&report::bw_line(r, p.report_gbits));
    match p.output {
        Some(OutputOnly::Bandwidth) => o.value(&format!("{:.6}\n", r.avg)),
        Some(OutputOnly::MessageRate) => o.value(&format!("{:.6}\n", r.msg_rate)),
        _ => {}
    }
    if let Some(path) = &p.out_json {
        let res = match p.output {
            Some(OutputOnly::Bandwidth) => JsonResults::Only(format!("bw_avg: {:.6},\n", r.avg)),
            Some(OutputOnly::MessageRate) => {
                JsonResults::Only(format!("msgRate_avg: {:.6},\n", r.msg_rate))
            }
            _ => JsonResults::Bw(*r),
        };
        if let Err(e) = std::fs::write(path, report::json(p, h, &res)) {
            eprintln!(" Couldn't write the json report {path}: {e}");
        }
    }
    o.flush();
}

/// Prints a latency line (or the `--output=` value) and writes the JSON report if asked.
pub fn print_lat(p: &Params, h: &HeaderInfo, o: &mut Out<'_>, r: &LatResult) {
    o.text(&report::lat_line(r));
    if p.output == Some(OutputOnly::Latency) {
        o.value(&format!("{:.6}\n", r.avg));
    }
    if let Some(path) = &p.out_json {
        let res = if p.output == Some(OutputOnly::Latency) {
            JsonResults::Only(format!("avg_lat: {:.6}\n", r.avg))
        } else {
            JsonResults::Lat(*r)
        };
        if let Err(e) = std::fs::write(path, report::json(p, h, &res)) {
            eprintln!(" Couldn't write the json report {path}: {e}");
        }
    }
    o.flush();
}

/// Prints a duration latency line (or the `--output=latency` value) and writes the JSON
/// report if asked.
pub fn print_lat_duration(p: &Params, h: &HeaderInfo, o: &mut Out<'_>, r: &LatDurationResult) {
    o.text(&report::lat_duration_line(r));
    if p.output == Some(OutputOnly::Latency) {
        o.value(&format!("{:.6}\n", r.avg));
    }
    if let Some(path) = &p.out_json {
        let res = JsonResults::Only(format!(
            "t_avg: {:.2},\ntps_average: {:.2},\n",
            r.avg, r.tps
        ));
        if let Err(e) = std::fs::write(path, report::json(p, h, &res)) {
            eprintln!(" Couldn't write the json report {path}: {e}");
        }
    }
    o.flush();
}

/// This side's result plus the peer's (bidirectional runs).
pub fn sum(a: &BwResult, b: &Report) -> BwResult {
    BwResult {
        size: a.size,
        iters: a.iters,
        peak: a.peak + b.bw_peak,
        avg: a.avg + b.bw_avg,
        msg_rate: a.msg_rate + b.msg_rate,
    }
}

/// A result as the REPORT message carries it.
pub fn to_report(r: &BwResult) -> Report {
    Report {
        size: r.size,
        iters: r.iters,
        bw_peak: r.peak,
        bw_avg: r.avg,
        msg_rate: r.msg_rate,
    }
}
