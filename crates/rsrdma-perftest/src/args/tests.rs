//! Unit tests of the command line: defaults, derived rules, perftest's messages.

use super::*;

fn tool(name: &str) -> Tool {
    let (v, k) = name.split_once('_').unwrap();
    let verb = match v {
        "send" => Verb::Send,
        "write" => Verb::Write,
        "atomic" => Verb::Atomic,
        _ => Verb::Read,
    };
    Tool::new(verb, if k == "bw" { Kind::Bw } else { Kind::Lat })
}

fn ok(name: &str, args: &[&str]) -> Params {
    let a: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    parse(tool(name), &a).unwrap_or_else(|e| panic!("{name} {args:?}: {e:?}"))
}

fn err(name: &str, args: &[&str]) -> (String, String) {
    let a: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    match parse(tool(name), &a) {
        Err(ParseOutcome::Error { stderr, stdout }) => (stderr, stdout),
        other => panic!("{name} {args:?}: expected an error, got {other:?}"),
    }
}

#[test]
fn defaults_per_tool() {
    // (tool, size, iters, tx depth, rx depth, cq_mod) as perftest 4.5-0.17 derives them.
    for (name, size, iters, tx, rx, cq) in [
        ("write_bw", 65536, 5000, 128, 1, 1),
        ("read_bw", 65536, 1000, 128, 1, 1),
        ("send_bw", 65536, 1000, 128, 512, 1),
        ("write_lat", 2, 1000, 1, 1, 1),
        ("read_lat", 2, 1000, 1, 1, 1),
        ("send_lat", 2, 1000, 1, 512, 1),
    ] {
        let p = ok(name, &[]);
        assert_eq!(
            (p.size, p.iters, p.tx_depth, p.rx_depth, p.cq_mod),
            (size, iters, tx, rx, cq),
            "{name}"
        );
        assert!(p.is_server() && p.host.is_none());
        assert_eq!(
            (p.port, p.ib_port, p.num_qps, p.conn),
            (18515, 1, 1, Conn::Rc)
        );
        assert_eq!((p.gid_index, p.inline, p.post_list), (None, None, 1));
    }
    assert!(!ok("write_lat", &[]).relaxed_ordering);
    assert!(ok("write_bw", &[]).relaxed_ordering);
    assert!(!ok("write_bw", &["--disable_pcie_relaxed"]).relaxed_ordering);
}

#[test]
fn derived_rules() {
    // tx depth and rx depth clamp to the iterations; odd rx depth becomes even.
    let p = ok("send_bw", &["-n", "21"]);
    assert_eq!((p.tx_depth, p.rx_depth), (21, 22));
    assert_eq!(ok("send_bw", &["-n", "21", "-a"]).rx_depth, 21);
    // CQ moderation: 100 up to 8 KiB, 1 above (unless -Q, with a warning).
    assert_eq!(ok("write_bw", &["-s", "8192"]).cq_mod, 100);
    assert_eq!(ok("write_bw", &["-s", "8193"]).cq_mod, 1);
    let p = ok("write_bw", &["-s", "65536", "-Q", "10"]);
    assert_eq!(p.cq_mod, 10);
    assert!(p.notes[0].contains("Warning: Large message requested and CQ moderation enabled"));
    // `-Q 1` moderates nothing: no warning (an outside tester's find).
    let p = ok("write_bw", &["-s", "65536", "-Q", "1"]);
    assert!(
        p.notes.iter().all(|n| !n.contains("CQ moderation")),
        "{:?}",
        p.notes
    );
    // UD keeps moderation, clamped to the tx depth; UD rx depth is min(iters, 16000).
    let p = ok("send_bw", &["-c", "UD", "-n", "20"]);
    assert_eq!((p.cq_mod, p.rx_depth), (20, 20));
    assert_eq!(ok("send_bw", &["-c", "UD", "-n", "20000"]).rx_depth, 16000);
    assert_eq!(ok("write_bw", &["-a", "-n", "5"]).cq_mod, 5);
    // A post list sets the moderation and must divide the iterations.
    let p = ok("write_bw", &["-l", "10", "-n", "100"]);
    assert_eq!((p.cq_mod, p.post_list), (10, 10));
    assert!(p.notes[0]
        .ends_with("Post List requested - CQ moderation will be the size of the post list\n"));
    assert!(err("write_bw", &["-l", "10", "-n", "105"])
        .0
        .contains("multiple"));
    // Duration mode keeps the depths.
    assert_eq!(ok("write_bw", &["-D", "3"]).tx_depth, 128);
}

#[test]
fn values_suffixes_and_last_one_wins() {
    assert_eq!(ok("write_bw", &["-s", "64K"]).size, 65536);
    assert_eq!(ok("write_bw", &["-s", "1M"]).size, 1 << 20);
    assert_eq!(ok("write_bw", &["--size=4096"]).size, 4096);
    assert_eq!(ok("write_bw", &["-x", "1", "-x", "3"]).gid_index, Some(3));
    let p = ok(
        "send_bw",
        &["-d", "rxe0", "10.0.0.1", "-x", "1", "-c", "UD"],
    );
    assert_eq!(p.host.as_deref(), Some("10.0.0.1"));
    assert_eq!((p.device.as_deref(), p.conn), (Some("rxe0"), Conn::Ud));
    let p = ok("write_bw", &["-a"]);
    assert_eq!(p.sizes(MAX_ALL_SIZE).len(), 23);
    assert_eq!(
        p.sizes(1024),
        vec![2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    );
    let p = ok(
        "write_bw",
        &["--output=bandwidth", "--out_json", "--report_gbits", "-N"],
    );
    assert_eq!(p.output, Some(OutputOnly::Bandwidth));
    assert_eq!(p.out_json.as_deref(), Some("perftest_out.json"));
    assert!(p.report_gbits && p.no_peak());
    assert_eq!(
        ok("read_lat", &["--out_json_file=/tmp/x.json"])
            .out_json
            .as_deref(),
        Some("/tmp/x.json")
    );
    assert_eq!(ok("write_lat", &["-m", "1024"]).mtu, Some(1024));
    assert_eq!(ok("write_lat", &["-m", "1000"]).mtu_invalid, Some(1000));
}

#[test]
fn peak_and_roles() {
    assert!(!ok("write_bw", &["h"]).no_peak());
    assert!(ok("write_bw", &["h", "-n", "20001"]).no_peak());
    assert!(ok("send_bw", &[]).no_peak(), "send_bw server");
    assert!(!ok("send_bw", &["-b"]).no_peak());
    assert!(ok("write_bw", &["h"]).sends() && !ok("write_bw", &[]).sends());
    assert!(ok("write_lat", &[]).sends() && !ok("read_lat", &[]).sends());
    assert!(ok("send_lat", &["h"]).receives() && !ok("send_bw", &["h"]).receives());
}

#[test]
fn perftests_errors() {
    assert_eq!(
        err("write_bw", &["-n", "3"]).0,
        " Iteration num should be between 5 and 100000000\n Parser function exited with Error\n"
    );
    assert_eq!(
        err("send_lat", &["-q", "2"]).0,
        " Multiple QPs only available on bw tests\n Parser function exited with Error\n"
    );
    assert_eq!(
        err("send_bw", &["-x", "200"]).0,
        " Gid index should be between 0 and 64\n Parser function exited with Error\n"
    );
    assert_eq!(
        err("write_bw", &["--output=foo"]).0,
        " Invalid verbosity level output flag. Please use bandwidth, latency, message_rate\n Parser function exited with Error\n"
    );
    let (e, usage) = err("write_bw", &["--bogus"]);
    assert!(e.starts_with("rs_write_bw: "), "{e}");
    assert!(e.contains(" Invalid Command or flag.\n Please check command line and run again.\n\n Parser function exited with Error\n"));
    assert!(usage.starts_with("Usage:"));
    assert!(err("write_bw", &["-c", "UD"]).0.contains("UD"));
    assert!(err("read_bw", &["-c", "UC"]).0.contains("UC"));
    assert!(err("write_bw", &["-r", "10"]).0.contains("-r"));
    assert!(err("write_bw", &["-s", "0"]).0.contains("Size"));
    assert!(err("write_bw", &["h", "--loopback"])
        .0
        .contains("--loopback"));
}

#[test]
fn help_and_version_exit_1_on_stdout() {
    for name in [
        "send_bw",
        "send_lat",
        "write_bw",
        "write_lat",
        "read_bw",
        "read_lat",
    ] {
        let a = vec!["-h".to_string()];
        match parse(tool(name), &a) {
            Err(ParseOutcome::Print { stdout, code }) => {
                assert_eq!(code, 1);
                assert!(stdout.starts_with(&format!("Usage:\n  rs_{name} ")));
                for flag in [
                    "-d,",
                    "-i,",
                    "-x,",
                    "-s,",
                    "-n,",
                    "-a,",
                    "-D,",
                    "-c,",
                    "-R,",
                    "-p,",
                    "-m,",
                    "-V,",
                    "--output=",
                    "--out_json",
                    "--out_json_file=",
                    "--loopback",
                ] {
                    assert!(stdout.contains(flag), "{name} help lacks {flag}");
                }
                let bw = name.ends_with("bw");
                for flag in ["-b,", "-t,", "-q,", "-l,", "-Q,", "-N,", "--report_gbits"] {
                    assert_eq!(stdout.contains(flag), bw, "{name} {flag}");
                }
                assert_eq!(
                    stdout.contains("-r,"),
                    name.starts_with("send"),
                    "{name} -r"
                );
                assert_eq!(
                    stdout.contains("-o,"),
                    name.starts_with("read"),
                    "{name} -o"
                );
                assert_eq!(
                    stdout.contains("-I,"),
                    !name.starts_with("read"),
                    "{name} -I"
                );
                assert_eq!(
                    stdout.contains("-e,"),
                    !name.starts_with("write"),
                    "{name} -e"
                );
            }
            other => panic!("{other:?}"),
        }
    }
    let a = vec!["-V".to_string()];
    assert_eq!(
        parse(tool("read_bw"), &a),
        Err(ParseOutcome::Print {
            stdout: "Version: 6.06\n".into(),
            code: 1
        })
    );
}

#[test]
fn values_are_checked_in_perftests_words() {
    let parser = |s: &str| format!(" {s}\n Parser function exited with Error\n");
    assert_eq!(
        err("write_bw", &["-n", "abc"]).0,
        parser("Invalid value 'abc' for option -n")
    );
    assert_eq!(
        err("write_bw", &["--tclass", "300"]).0,
        parser("Traffic class should be between 0 and 255")
    );
    assert_eq!(
        err("write_bw", &["-p", "0"]).0,
        parser("Port should be between 1 and 65535")
    );
    assert_eq!(
        err("write_bw", &["-s", "4G"]).0,
        parser("Message Size should be between 1 and 2147483647")
    );
    assert_eq!(
        err("send_bw", &["-c", "XX"]).0,
        parser("Connection type XX is not supported by this test (supported: RC, UC, UD)")
    );
    assert_eq!(
        err("write_bw", &["-c", "UD"]).0,
        parser("Connection type UD is not supported by this test (supported: RC, UC)")
    );
    // -I's limit depends on -c, wherever -c is on the line.
    assert_eq!(
        err("send_bw", &["-I", "900", "-c", "UD"]).0,
        parser("Inline size should be between 0 and 884")
    );
    assert_eq!(ok("send_bw", &["-I", "900"]).inline, Some(900));
    assert_eq!(ok("send_bw", &["-c", "UD", "-I", "884"]).inline, Some(884));
    assert_eq!(ok("write_bw", &["-c", "UC"]).conn, Conn::Uc);
    assert_eq!(ok("read_bw", &["-o", "4", "-u", "20"]).out_reads, Some(4));
    assert_eq!(ok("read_bw", &["-u", "20"]).qp_timeout, 20);
    // A flag without its value is getopt's complaint, with the usage.
    let (e, usage) = err("write_bw", &["-n"]);
    assert!(
        e.starts_with("rs_write_bw: ") && e.contains(" Invalid Command or flag.\n"),
        "{e}"
    );
    assert!(usage.starts_with("Usage:"));
}

#[test]
fn atomic_tools_as_perftest() {
    for name in ["atomic_bw", "atomic_lat"] {
        let p = ok(name, &[]);
        assert_eq!(
            (p.size, p.iters, p.atomic_type),
            (8, 1000, AtomicType::FetchAndAdd)
        );
        assert_eq!(ok(name, &["-s", "8"]).size, 8);
        let p = ok(name, &["-A", "CMP_AND_SWAP", "-o", "4"]);
        assert_eq!(
            (p.atomic_type, p.out_reads),
            (AtomicType::CmpAndSwap, Some(4))
        );
        // Another size, or -a: perftest's text on stdout, exit 1, no parser trailer.
        for bad in [&["-s", "16"][..], &["-a"]] {
            let (stderr, stdout) = err(name, bad);
            assert_eq!(stderr, "");
            assert_eq!(
                stdout,
                format!("{RESULT_LINE}Message size cannot be changed for Atomic tests \n")
            );
        }
        let (stderr, _) = err(name, &["-A", "FOO"]);
        assert_eq!(
            stderr,
            " Invalid Atomic type! please choose from {CMP_AND_SWAP,FETCH_AND_ADD}\n"
        );
        assert!(err(name, &["-I", "16"])
            .0
            .contains("option -I is not available"));
        assert!(err(name, &["-c", "UC"])
            .0
            .contains("not supported by this test"));
    }
    assert_eq!(ok("atomic_bw", &["-n", "50"]).cq_mod, 50);
    assert!(!ok("atomic_lat", &[]).sends(), "the server is passive");
    assert!(ok("atomic_lat", &["h"]).sends());
    assert!(err("read_bw", &["-A", "CMP_AND_SWAP"])
        .0
        .contains("option -A is not available"));
    let help = help_text(tool("atomic_bw"));
    assert!(help.contains("  -A, --atomic_type=<type>  type of atomic operation from {CMP_AND_SWAP,FETCH_AND_ADD} (default FETCH_AND_ADD)\n"));
    assert!(
        !help.contains("-s, --size") && !help.contains("-a, --all"),
        "{help}"
    );
    assert!(
        help.contains("-o, --outs") && !help.contains("-I, --inline"),
        "{help}"
    );
}

#[test]
fn duration_on_latency_tools() {
    for name in ["write_lat", "send_lat", "read_lat", "atomic_lat"] {
        let p = ok(name, &["-D", "3"]);
        assert_eq!(p.duration, Some(3), "{name}");
    }
    assert!(err("write_lat", &["-D", "3", "-n", "100"])
        .0
        .contains("cannot be used together"));
}

#[test]
fn rdma_cm_over_rc_only_and_not_with_loopback() {
    assert!(ok("write_bw", &["-R", "10.77.0.1"]).rdma_cm);
    assert!(ok("read_lat", &["--rdma_cm"]).rdma_cm);
    for (name, args, want) in [
        (
            "send_bw",
            &["-R", "-c", "UD"][..],
            "with UD is not supported",
        ),
        ("send_bw", &["-R", "-c", "UC"][..], "does not support UC"),
        (
            "write_bw",
            &["-R", "--loopback"][..],
            "--loopback with rdma_cm",
        ),
    ] {
        let (stderr, _) = err(name, args);
        assert!(stderr.contains(want), "{args:?}: {stderr}");
    }
}
