//! perftest's text output (spec section 3), byte for byte, and the `--out_json` file.

use crate::args::{Params, RESULT_LINE};
use crate::stats::{BwResult, LatDurationResult, LatResult};
use crate::wire::Dest;
use crate::{Kind, Verb};

/// C's `%#0Nx`: zero prints without `0x`; anything else gets `0x` inside the width.
pub fn alt_hex(v: u64, width: usize) -> String {
    if v == 0 {
        format!("{:0width$}", 0)
    } else {
        format!("0x{:0w$x}", v, w = width.saturating_sub(2))
    }
}

/// The banner a server prints before waiting.
pub const BANNER: &str = "\n************************************\n* Waiting for client to connect... *\n************************************\n";

/// What the header block shows, resolved against the device.
#[derive(Debug, Clone)]
pub struct HeaderInfo {
    /// The device opened.
    pub device: String,
    /// Negotiated MTU in bytes.
    pub mtu: u32,
    /// "IB" or "Ethernet".
    pub link_type: &'static str,
    /// GID index in use, if any.
    pub gid_index: Option<u8>,
    /// Inline size in use.
    pub inline: u32,
    /// Outstanding reads (READ tests).
    pub out_reads: u32,
}

/// The test's title, e.g. `RDMA_Write BW Test`.
pub fn title(p: &Params) -> String {
    let mut verb = verb_name(p.tool.verb).to_string();
    if p.tool.verb == Verb::Atomic {
        verb = format!("{verb} {}", p.atomic_type.name());
    }
    match p.tool.kind {
        Kind::Bw => format!(
            "{verb} {}{}BW Test",
            if p.bidir { "Bidirectional " } else { "" },
            if p.post_list > 1 { "Post List " } else { "" }
        ),
        Kind::Lat => format!("{verb} Latency Test"),
    }
}

/// perftest's verb strings.
pub fn verb_name(v: Verb) -> &'static str {
    match v {
        Verb::Send => "Send",
        Verb::Write => "RDMA_Write",
        Verb::Read => "RDMA_Read",
        Verb::Atomic => "Atomic",
    }
}

fn shows_tx_depth(p: &Params) -> bool {
    !p.is_server() || p.bidir
}

fn shows_rx_depth(p: &Params) -> bool {
    p.tool.verb == Verb::Send && (p.is_server() || p.bidir)
}

/// The header block (spec 3.2), from the first `RESULT_LINE` to the last.
pub fn header(p: &Params, h: &HeaderInfo) -> String {
    let mut s = String::new();
    s.push_str(RESULT_LINE);
    s.push_str(&format!("                    {}\n", title(p)));
    if p.events {
        s.push_str(&format!(" Test with events. Using {}_comp0\n", h.device));
    }
    s.push_str(&format!(
        " Dual-port       : OFF\t\tDevice         : {}\n",
        h.device
    ));
    s.push_str(&format!(
        " Number of qps   : {}\t\tTransport type : IB\n",
        p.num_qps
    ));
    s.push_str(&format!(
        " Connection type : {}\t\tUsing SRQ      : OFF\n",
        p.conn.name()
    ));
    s.push_str(&format!(
        " PCIe relax order: {}\n",
        if p.relaxed_ordering { "ON" } else { "OFF" }
    ));
    s.push_str(" ibv_wr* API     : OFF\n");
    if shows_tx_depth(p) {
        s.push_str(&format!(" TX depth        : {}\n", p.tx_depth));
    }
    if p.post_list > 1 {
        s.push_str(&format!(" Post List       : {}\n", p.post_list));
    }
    if shows_rx_depth(p) {
        s.push_str(&format!(" RX depth        : {}\n", p.rx_depth));
    }
    if p.tool.kind == Kind::Bw {
        s.push_str(&format!(" CQ Moderation   : {}\n", p.cq_mod));
    }
    s.push_str(&format!(" Mtu             : {}[B]\n", h.mtu));
    s.push_str(&format!(" Link type       : {}\n", h.link_type));
    if let Some(g) = h.gid_index {
        s.push_str(&format!(" GID index       : {g}\n"));
    }
    if p.tool.verb.reads() {
        s.push_str(&format!(" Outstand reads  : {}\n", h.out_reads));
    } else {
        s.push_str(&format!(" Max inline data : {}[B]\n", h.inline));
    }
    if p.rdma_cm {
        s.push_str(" rdma_cm QPs\t : ON\n Data ex. method : rdma_cm\n");
        if p.is_server() {
            s.push_str(RESULT_LINE);
            s.push_str(" Waiting for client rdma_cm QP to connect\n Please run the same command with the IB/RoCE interface IP\n");
        }
    } else {
        s.push_str(" rdma_cm QPs\t : OFF\n Data ex. method : Ethernet\n");
    }
    s.push_str(RESULT_LINE);
    s
}

/// One address line (spec 3.3), plus the GID line when a GID is in use.
pub fn address_line(local: bool, d: &Dest, verb: Verb, with_gid: bool) -> String {
    let mut s = format!(
        " {} address: LID {} QPN {} PSN {}",
        if local { "local" } else { "remote" },
        alt_hex(d.lid.into(), 4),
        alt_hex(d.qpn.into(), 6),
        alt_hex(d.psn.into(), 6)
    );
    if verb == Verb::Read {
        s.push_str(&format!(" OUT {}", alt_hex(d.out_reads.into(), 4)));
    }
    if matches!(verb, Verb::Write | Verb::Read) {
        s.push_str(&format!(
            " RKey {} VAddr {}",
            alt_hex(d.rkey.into(), 8),
            alt_hex(d.vaddr, 16)
        ));
    }
    s.push('\n');
    if with_gid {
        let parts: Vec<String> = d.gid.iter().map(|b| format!("{b:02}")).collect();
        s.push_str(&format!(" GID: {}\n", parts.join(":")));
    }
    s
}

/// The BW table header.
pub fn bw_table_header(gbits: bool) -> String {
    let u = if gbits { "Gb/sec" } else { "MB/sec" };
    format!(" #bytes     #iterations    BW peak[{u}]    BW average[{u}]   MsgRate[Mpps]\n")
}

/// One BW result line, with its newline.
pub fn bw_line(r: &BwResult, gbits: bool) -> String {
    if gbits && r.avg < 0.1 {
        format!(
            " {:<7}    {}           {:<7.6}            {:<7.6}            {:<7.6}\n",
            r.size, r.iters, r.peak, r.avg, r.msg_rate
        )
    } else {
        format!(
            " {:<7}    {:<10}       {:<7.2}            {:<7.2}\t\t   {:<7.6}\n",
            r.size, r.iters, r.peak, r.avg, r.msg_rate
        )
    }
}

/// The latency table header (note the trailing space).
pub const LAT_TABLE_HEADER: &str = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] \n";

/// The latency table header of the duration mode (`-D`).
pub const LAT_DURATION_HEADER: &str =
    " #bytes        #iterations       t_avg[usec]    tps average\n";

/// One latency line of the duration mode, with its newline.
pub fn lat_duration_line(r: &LatDurationResult) -> String {
    format!(
        " {:<7}       {}            {:<7.2}        {:<7.2}\n",
        r.size, r.iters, r.avg, r.tps
    )
}

/// One latency result line, with its newline.
pub fn lat_line(r: &LatResult) -> String {
    format!(
        " {:<7} {}          {:<7.2}        {:<7.2}      {:<7.2}  \t       {:<7.2}     \t{:<7.2}\t\t{:<7.2} \t\t{:<7.2}\n",
        r.size, r.iters, r.min, r.max, r.typical, r.avg, r.stdev, r.p99, r.p999
    )
}

/// The `-H`/`-U` sample listing.
pub fn histogram(samples_usec: &[f64]) -> String {
    let mut s = String::from("#, usec\n");
    for (i, v) in samples_usec.iter().enumerate() {
        s.push_str(&format!("{}, {}\n", i + 1, c_g(*v)));
    }
    s
}

/// C's `%g` for the histogram (6 significant digits, trailing zeros dropped).
pub fn c_g(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let exp = v.abs().log10().floor() as i32;
    if !(-5..6).contains(&exp) {
        let s = format!("{:.5e}", v);
        // Rust prints 1.23450e2; C prints 1.2345e+02.
        let (m, e) = s.split_once('e').unwrap_or((&s, "0"));
        let m = m.trim_end_matches('0').trim_end_matches('.');
        let e: i32 = e.parse().unwrap_or(0);
        return format!("{m}e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs());
    }
    let decimals = (5 - exp).max(0) as usize;
    let s = format!("{v:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// The `--out_json` file (perftest 4.5-0.17's unquoted format).
pub fn json(p: &Params, h: &HeaderInfo, results: &JsonResults) -> String {
    let mut s = String::from("{\ntest_info: {\n");
    s.push_str(&format!("test: {},\n", title(p).replace(' ', "_")));
    s.push_str("Dual_port: OFF,\n");
    s.push_str(&format!("Device: \"{}\",\n", h.device));
    s.push_str(&format!("Number_of_qps: {},\n", p.num_qps));
    s.push_str("Transport_type: IB,\n");
    s.push_str(&format!("Connection_type: {},\n", p.conn.name()));
    s.push_str("Using_SRQ: OFF,\n");
    s.push_str(&format!(
        "PCIe_relax_order: {},\n",
        if p.relaxed_ordering { "ON" } else { "OFF" }
    ));
    s.push_str("ibv_wr_API: OFF,\n");
    if shows_tx_depth(p) {
        s.push_str(&format!("TX_depth : {},\n", p.tx_depth));
    }
    if p.post_list > 1 {
        s.push_str(&format!("Post_List: {},\n", p.post_list));
    }
    if shows_rx_depth(p) {
        s.push_str(&format!("RX_depth: {},\n", p.rx_depth));
    }
    if p.tool.kind == Kind::Bw {
        s.push_str(&format!("CQ_Moderation: {},\n", p.cq_mod));
    }
    s.push_str(&format!("Mtu: {},\n", h.mtu));
    s.push_str(&format!("Link_type: {},\n", h.link_type));
    if let Some(g) = h.gid_index {
        s.push_str(&format!("GID_index: {g},\n"));
    }
    if p.tool.verb.reads() {
        s.push_str(&format!("Outstand_reads: {},\n", h.out_reads));
    } else {
        s.push_str(&format!("Max_inline_data: {},\n", h.inline));
    }
    s.push_str(if p.rdma_cm {
        "rdma_cm_QPs: ON,\nData_ex_method: rdma_cm,\n},\nresults: {\n"
    } else {
        "rdma_cm_QPs: OFF,\nData_ex_method: Ethernet,\n},\nresults: {\n"
    });
    match results {
        JsonResults::Bw(r) => {
            s.push_str(&format!(
                "MsgSize: {},\nn_iterations: {},\n",
                r.size, r.iters
            ));
            if p.report_gbits && r.avg < 0.1 {
                s.push_str(&format!(
                    "BW_peak: {:.6},\nBW_average: {:.6},\n",
                    r.peak, r.avg
                ));
            } else {
                s.push_str(&format!(
                    "BW_peak: {:.2},\nBW_average: {:.2},\n",
                    r.peak, r.avg
                ));
            }
            s.push_str(&format!("MsgRate: {:.6},\n", r.msg_rate));
        }
        JsonResults::Lat(r) => {
            s.push_str(&format!(
                "MsgSize: {},\nn_iterations: {},\nt_min: {:.2},\nt_max: {:.2},\nt_typical: {:.2},\nt_avg: {:.2},\nt_stdev: {:.2},\npercentile_99: {:.2},\npercentile_99.9: {:.2},\n",
                r.size, r.iters, r.min, r.max, r.typical, r.avg, r.stdev, r.p99, r.p999
            ));
        }
        JsonResults::Only(line) => s.push_str(line),
    }
    s.push_str("},\n}\n");
    s
}

/// What the JSON file's results object holds.
#[derive(Debug, Clone)]
pub enum JsonResults {
    /// A bandwidth line.
    Bw(BwResult),
    /// A latency line.
    Lat(LatResult),
    /// The single value of `--output=` (`bw_avg: …,` etc.).
    Only(String),
}

/// What perftest prints when UD caps the default size at the MTU.
pub fn ud_size_note(mtu: u32) -> String {
    format!(" Max msg size in UD is MTU {mtu}\n Changing to this MTU\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::parse;
    use crate::Tool;

    fn params(tool: Tool, args: &[&str]) -> Params {
        let a: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        parse(tool, &a).unwrap()
    }

    #[test]
    fn c_alternate_hex() {
        assert_eq!(alt_hex(0, 4), "0000");
        assert_eq!(alt_hex(3, 4), "0x03");
        assert_eq!(alt_hex(0x93a00, 6), "0x93a00");
        assert_eq!(alt_hex(0x1d, 6), "0x001d");
        assert_eq!(alt_hex(0x4b763, 6), "0x4b763");
        assert_eq!(alt_hex(0x493a, 8), "0x00493a");
        assert_eq!(alt_hex(0x7f2987cd6000, 16), "0x007f2987cd6000");
        assert_eq!(alt_hex(0, 6), "000000");
    }

    #[test]
    fn address_lines_as_observed() {
        let mut d = Dest {
            lid: 3,
            out_reads: 16,
            qpn: 0xe3000,
            psn: 0x1e9d46,
            rkey: 0x4e30,
            vaddr: 0x7fcb7eb47000,
            ..Default::default()
        };
        assert_eq!(
            address_line(true, &d, Verb::Read, false),
            " local address: LID 0x03 QPN 0xe3000 PSN 0x1e9d46 OUT 0x10 RKey 0x004e30 VAddr 0x007fcb7eb47000\n"
        );
        d.lid = 0;
        d.qpn = 0x1d;
        d.psn = 0x914c4c;
        d.gid[10] = 255;
        d.gid[11] = 255;
        d.gid[12..].copy_from_slice(&[10, 77, 0, 1]);
        assert_eq!(
            address_line(false, &d, Verb::Send, true),
            " remote address: LID 0000 QPN 0x001d PSN 0x914c4c\n GID: 00:00:00:00:00:00:00:00:00:00:255:255:10:77:00:01\n"
        );
    }

    #[test]
    fn bw_lines_as_observed() {
        let r = BwResult {
            size: 65536,
            iters: 5000,
            peak: 1490.68,
            avg: 424.02,
            msg_rate: 0.006784,
        };
        assert_eq!(
            bw_line(&r, false),
            " 65536      5000             1490.68            424.02 \t\t   0.006784\n"
        );
        let r = BwResult {
            size: 65536,
            iters: 100,
            peak: 0.0,
            avg: 27.95,
            msg_rate: 0.000447,
        };
        assert_eq!(
            bw_line(&r, false),
            " 65536      100              0.00               27.95  \t\t   0.000447\n"
        );
        let r = BwResult {
            size: 2,
            iters: 1000,
            peak: 0.01,
            avg: 0.005,
            msg_rate: 0.3,
        };
        assert_eq!(
            bw_line(&r, true),
            " 2          1000           0.010000            0.005000            0.300000\n"
        );
        assert_eq!(
            bw_table_header(false),
            " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n"
        );
    }

    #[test]
    fn lat_line_as_observed() {
        let r = LatResult {
            size: 2,
            iters: 100,
            min: 60.89,
            max: 645.77,
            typical: 172.78,
            avg: 165.12,
            stdev: 69.18,
            p99: 645.77,
            p999: 645.77,
        };
        assert_eq!(
            lat_line(&r),
            " 2       100          60.89          645.77       172.78   \t       165.12      \t69.18  \t\t645.77  \t\t645.77 \n"
        );
        let r = LatResult {
            size: 2,
            iters: 20,
            min: 50.69,
            max: 1223.08,
            typical: 86.99,
            avg: 87.55,
            stdev: 17.33,
            p99: 1223.08,
            p999: 1223.08,
        };
        assert_eq!(
            lat_line(&r),
            " 2       20          50.69          1223.08      86.99    \t       87.55       \t17.33  \t\t1223.08 \t\t1223.08\n"
        );
    }

    #[test]
    fn header_blocks_as_observed_on_rxe() {
        let h = HeaderInfo {
            device: "rxe0".into(),
            mtu: 1024,
            link_type: "Ethernet",
            gid_index: Some(1),
            inline: 0,
            out_reads: 128,
        };
        let p = params(Tool::new(Verb::Send, Kind::Bw), &["-n", "100", "127.0.0.1"]);
        let want = "---------------------------------------------------------------------------------------
                    Send BW Test
 Dual-port       : OFF\t\tDevice         : rxe0
 Number of qps   : 1\t\tTransport type : IB
 Connection type : RC\t\tUsing SRQ      : OFF
 PCIe relax order: ON
 ibv_wr* API     : OFF
 TX depth        : 100
 CQ Moderation   : 1
 Mtu             : 1024[B]
 Link type       : Ethernet
 GID index       : 1
 Max inline data : 0[B]
 rdma_cm QPs\t : OFF
 Data ex. method : Ethernet
---------------------------------------------------------------------------------------
";
        assert_eq!(header(&p, &h), want);
        // The server of send_bw shows RX depth instead of TX depth.
        let p = params(Tool::new(Verb::Send, Kind::Bw), &["-n", "100"]);
        let hs = header(&p, &h);
        assert!(hs.contains(" RX depth        : 100\n") && !hs.contains("TX depth"));
        // write_lat: relaxed ordering off; the server shows no depth at all.
        let p = params(Tool::new(Verb::Write, Kind::Lat), &[]);
        let hs = header(&p, &h);
        assert!(hs.contains(" PCIe relax order: OFF\n"));
        assert!(!hs.contains("depth") && !hs.contains("CQ Moderation"));
        // read_lat client: outstanding reads instead of inline.
        let p = params(Tool::new(Verb::Read, Kind::Lat), &["h"]);
        let hs = header(&p, &h);
        assert!(hs.contains("                    RDMA_Read Latency Test\n"));
        assert!(hs.contains(" TX depth        : 1\n Mtu"));
        assert!(hs.contains(" Outstand reads  : 128\n") && !hs.contains("inline"));
    }

    #[test]
    fn rdma_cm_header_lines_as_observed_on_rxe() {
        let h = HeaderInfo {
            device: "rxe0".into(),
            mtu: 1024,
            link_type: "Ethernet",
            gid_index: Some(1),
            inline: 0,
            out_reads: 128,
        };
        let tail = " Max inline data : 0[B]\n rdma_cm QPs\t : ON\n Data ex. method : rdma_cm\n";
        let line = "---------------------------------------------------------------------------------------\n";
        let p = params(Tool::new(Verb::Write, Kind::Bw), &["-R", "10.77.0.1"]);
        assert!(header(&p, &h).ends_with(&format!("{tail}{line}")));
        // The server adds its note between two lines.
        let p = params(Tool::new(Verb::Write, Kind::Bw), &["-R"]);
        assert!(header(&p, &h).ends_with(&format!(
            "{tail}{line} Waiting for client rdma_cm QP to connect\n Please run the same command with the IB/RoCE interface IP\n{line}"
        )));
    }

    #[test]
    fn titles() {
        let p = params(Tool::new(Verb::Send, Kind::Bw), &["-b"]);
        assert_eq!(title(&p), "Send Bidirectional BW Test");
        let p = params(Tool::new(Verb::Write, Kind::Bw), &["-l", "10"]);
        assert_eq!(title(&p), "RDMA_Write Post List BW Test");
        let p = params(Tool::new(Verb::Atomic, Kind::Bw), &["-b"]);
        assert_eq!(title(&p), "Atomic FETCH_AND_ADD Bidirectional BW Test");
        let p = params(Tool::new(Verb::Atomic, Kind::Lat), &["-A", "CMP_AND_SWAP"]);
        assert_eq!(title(&p), "Atomic CMP_AND_SWAP Latency Test");
    }

    #[test]
    fn json_file_as_perftest_writes_it() {
        let h = HeaderInfo {
            device: "mlx5_0".into(),
            mtu: 4096,
            link_type: "IB",
            gid_index: None,
            inline: 0,
            out_reads: 16,
        };
        let p = params(Tool::new(Verb::Write, Kind::Bw), &["-n", "200", "host"]);
        let r = BwResult {
            size: 65536,
            iters: 200,
            peak: 55.18,
            avg: 38.87,
            msg_rate: 0.074147,
        };
        let want = "{\ntest_info: {\ntest: RDMA_Write_BW_Test,\nDual_port: OFF,\nDevice: \"mlx5_0\",\nNumber_of_qps: 1,\nTransport_type: IB,\nConnection_type: RC,\nUsing_SRQ: OFF,\nPCIe_relax_order: ON,\nibv_wr_API: OFF,\nTX_depth : 128,\nCQ_Moderation: 1,\nMtu: 4096,\nLink_type: IB,\nMax_inline_data: 0,\nrdma_cm_QPs: OFF,\nData_ex_method: Ethernet,\n},\nresults: {\nMsgSize: 65536,\nn_iterations: 200,\nBW_peak: 55.18,\nBW_average: 38.87,\nMsgRate: 0.074147,\n},\n}\n";
        assert_eq!(json(&p, &h, &JsonResults::Bw(r)), want);
    }

    #[test]
    fn c_g_format() {
        assert_eq!(c_g(42.5), "42.5");
        assert_eq!(c_g(1.0), "1");
        assert_eq!(c_g(123456.7), "123457");
        assert_eq!(c_g(0.000123), "0.000123");
        assert_eq!(c_g(1234567.0), "1.23457e+06");
    }
}
