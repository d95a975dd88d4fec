//! `cargo xtask examples`: builds every example, runs each in one boot of the soft-RoCE VM (a
//! server in the background and its clients, where it has both) and checks what each printed.
//! One line per example: `example NAME ok` or `example NAME FAILED: why`, then
//! `N passed, M failed`. `cargo xtask test` runs the same fragment in its own VM boot, after
//! the device tests. With `--soft` they run on this host over the software device soft0
//! instead (all but `post_overhead`, see [`on_soft`]), as `cargo xtask test`'s host stage
//! does with rdma-core hidden.
//!
//! An example is one entry of [`EXAMPLES`]: its processes, in order, and a check of their
//! output. A process with a `ready` marker runs in the background; the next one starts once
//! the marker's line appears, and the rest of that line (a listening address, a UD address)
//! is `$R_<label>` in later arguments. Placeholders in arguments: `{ip}` (the guest's RDMA
//! address, for rdma_cm), `{port}` (a port of the example's own), `{dev}` (`-d`/`-x` naming
//! the guest's device; most runs leave them out, to test the default choice). Every process
//! runs under `timeout`, so nothing hangs; every process but a `daemon` (killed at the end)
//! must exit with status 0, and then the example's `check` looks at the outputs.

use crate::vm::{self, sh_quote, VmOpts};
use anyhow::{anyhow, bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Seconds one process may run in the guest.
const PROC_LIMIT_SECS: u32 = 120;
/// Seconds a background process gets to print its ready line.
const READY_LIMIT_SECS: u32 = 60;
/// The first example's port; each example gets its own ten.
const BASE_PORT: u16 = 19000;

/// One process of an example run.
pub struct Proc {
    /// Its name in checks and messages (letters, digits, `_`).
    pub label: &'static str,
    /// Arguments, as shell text (placeholders: see the module docs).
    pub args: &'static str,
    /// For a background process: the text that starts its ready line.
    pub ready: Option<&'static str>,
    /// Background, killed at the end instead of awaited (a service that never exits).
    pub daemon: bool,
    /// Shell text whose output becomes its stdin (default: nothing).
    pub stdin: Option<&'static str>,
    /// Another example target of the same package to run instead (a helper service).
    pub program: Option<&'static str>,
}

/// A foreground process: runs to its end before the next one starts.
const fn fg(label: &'static str, args: &'static str) -> Proc {
    Proc {
        label,
        args,
        ready: None,
        daemon: false,
        stdin: None,
        program: None,
    }
}

/// A background process that must exit by itself; the next process starts once it has
/// printed a line starting with `ready`.
const fn bg(label: &'static str, args: &'static str, ready: &'static str) -> Proc {
    Proc {
        ready: Some(ready),
        ..fg(label, args)
    }
}

/// A background process that prints nothing to wait for: its client retries its dial.
const fn bg_unmarked(label: &'static str, args: &'static str) -> Proc {
    bg(label, args, "")
}

/// A background service, killed once the others are done.
const fn daemon(label: &'static str, args: &'static str, ready: &'static str) -> Proc {
    Proc {
        daemon: true,
        ..bg(label, args, ready)
    }
}

/// The usual pair: a server that prints `NAME: listening on ADDR` and exits by itself.
const fn server(args: &'static str) -> Proc {
    bg("server", args, "listening on ")
}

/// One example run.
pub struct Example {
    /// The name in the report (the example's, plus `/variant` where it runs more than once).
    pub name: &'static str,
    pub package: &'static str,
    /// The example target.
    pub example: &'static str,
    /// Shell run first, in the example's scratch directory.
    pub setup: &'static str,
    pub procs: &'static [Proc],
    /// Looks at what the processes printed (after the exit statuses passed).
    pub check: fn(&Outputs) -> Result<(), String>,
}

/// Every example, in the order they run.
pub const EXAMPLES: &[Example] = &[
    Example {
        name: "echo-msg",
        procs: &[server("-l {ip}:{port}"), fg("client", "{ip}:{port}")],
        check: |o| {
            o.has("server", "received \"hello rdmanet\"")?;
            o.has("client", "echo \"hello rdmanet\"")
        },
        ..net("echo-msg")
    },
    Example {
        name: "echo-stream",
        procs: &[server("-l {ip}:{port}"), fg("client", "{ip}:{port}")],
        check: |o| {
            o.has(
                "client",
                "echo \"hello rdmanet stream, in more than 32 bytes\" (43 bytes in",
            )?;
            o.has("server", "echoed 43 bytes, then the end of the stream")
        },
        ..net("echo-stream")
    },
    Example {
        name: "handshake-dial",
        procs: &[
            server("-l 0.0.0.0:{port}"),
            fg("client", "127.0.0.1:{port}"),
        ],
        check: |o| {
            o.has("server", "established over Tcp")?;
            o.has("client", "established over Tcp")?;
            o.has("client", "echo \"hello handshake\"")
        },
        ..net("handshake-dial")
    },
    Example {
        name: "packet",
        procs: &[server("-l"), fg("client", "\"$R_server\"")],
        check: |o| {
            o.has("server", "received \"hello datagram\" from QPN")?;
            o.has("client", "reply \"hello datagram\"")
        },
        ..net("packet")
    },
    Example {
        name: "batch",
        procs: &[server("-l {ip}:{port}"), fg("client", "{ip}:{port}")],
        check: |o| {
            o.has("server", "server: message 7")?;
            o.has("server", "received 8 messages in")?;
            o.has("client", "server says \"got 8\"")
        },
        ..net("batch")
    },
    Example {
        name: "registry",
        procs: &[
            daemon("directory", "--registry 127.0.0.1:{port}", "listening on "),
            bg(
                "server",
                "-l \"$R_directory\" --name svc",
                "server: registered ",
            ),
            fg("client", "\"$R_directory\" --name svc"),
        ],
        check: |o| {
            o.has("client", "\"svc\" is ")?;
            o.has("server", "received \"hello registry\"")?;
            o.has("client", "reply \"hello registry\"")
        },
        ..net("registry")
    },
    Example {
        name: "pollmode",
        procs: &[
            server("-l {ip}:{port} --poll event"),
            fg("client", "{ip}:{port} --poll busy -n 200"),
        ],
        check: |o| {
            o.has("client", "poll=Busy, 200 round trips")?;
            o.has("server", "poll=Event, echoed 200 messages")
        },
        ..net("pollmode")
    },
    Example {
        name: "file-transfer",
        setup: "head -c 1048576 /dev/urandom > in.bin",
        procs: &[
            server("-l {ip}:{port} --out out.bin"),
            fg("client", "{ip}:{port} --in in.bin"),
        ],
        check: |o| {
            o.has("server", "received 1048576 bytes")?;
            o.has("client", "sent 1048576 bytes")?;
            o.same("client", "server", "sha256 ")
        },
        ..net("file-transfer")
    },
    Example {
        name: "large-message",
        procs: &[
            server("-l {ip}:{port} --size 4 --buf 64"),
            fg("client", "{ip}:{port} --size 4 --buf 64"),
        ],
        check: |o| {
            o.has("server", "received one message of 4194304 bytes")?;
            o.same("client", "server", "sha256 ")
        },
        ..net("large-message")
    },
    Example {
        name: "rpc",
        procs: &[server("-l {ip}:{port}"), fg("client", "{ip}:{port} -n 10")],
        check: |o| {
            o.has("client", "10 calls")?;
            o.has("client", "last reply \"reply: HELLO RPC 9\"")?;
            o.has("server", "served 10 requests")
        },
        ..net("rpc")
    },
    Example {
        name: "chat",
        procs: &[
            Proc {
                stdin: Some("printf 'hi from the server\\n'; sleep 30"),
                ..server("-l {ip}:{port}")
            },
            Proc {
                stdin: Some("printf 'hi from the client\\n'; sleep 6"),
                ..fg("client", "{ip}:{port}")
            },
        ],
        check: |o| {
            o.has("server", "peer: hi from the client")?;
            o.has("client", "peer: hi from the server")?;
            // The client's stdin ended: it closed, and the server saw the peer close.
            o.has("server", "chat: peer closed")?;
            o.has("client", "chat: closed")
        },
        ..net("chat")
    },
    Example {
        name: "connection-styles/rc-cm",
        procs: &[
            server("-l {ip}:{port} --mode rc-cm"),
            fg("client", "{ip}:{port} --mode rc-cm"),
        ],
        check: |o| {
            o.has("server", "server (Cm): received \"hello RC\"")?;
            o.has("client", "client (Cm): echo \"hello RC\"")
        },
        ..net("connection-styles")
    },
    Example {
        name: "connection-styles/rc-handshake",
        procs: &[
            server("-l 0.0.0.0:{port} --mode rc-handshake"),
            fg("client", "127.0.0.1:{port} --mode rc-handshake"),
        ],
        check: |o| {
            o.has("server", "server (Tcp): received \"hello RC\"")?;
            o.has("client", "client (Tcp): echo \"hello RC\"")
        },
        ..net("connection-styles")
    },
    Example {
        name: "connection-styles/ud",
        procs: &[
            server("-l - --mode ud"),
            fg("client", "\"$R_server\" --mode ud"),
        ],
        check: |o| {
            o.has("server", "server (UD): received \"hello UD\"")?;
            o.has("client", "client (UD): reply \"hello UD\"")
        },
        ..net("connection-styles")
    },
    Example {
        name: "multi-client",
        procs: &[
            server("-l {ip}:{port} --clients 3"),
            fg("client1", "{ip}:{port} -m 'client 1'"),
            fg("client2", "{ip}:{port} -m 'client 2'"),
            fg("client3", "{ip}:{port} -m 'client 3'"),
        ],
        check: |o| {
            o.has("client1", "echo \"client 1\"")?;
            o.has("client3", "echo \"client 3\"")?;
            o.has("server", "client 2 (")?;
            o.has("server", "served 3 clients")
        },
        ..net("multi-client")
    },
    Example {
        name: "ud-broadcast",
        procs: &[
            daemon("directory", "--registry 127.0.0.1:{port}", "listening on "),
            bg(
                "node1",
                "-l \"$R_directory\" --name node1",
                "node1: registered ",
            ),
            bg(
                "node2",
                "-l \"$R_directory\" --name node2",
                "node2: registered ",
            ),
            fg("sender", "\"$R_directory\" --to node1,node2 -n 3"),
        ],
        check: |o| {
            // One handle per destination GID, not per datagram: the guest's receivers share
            // its one GID; on soft0 each process is a device of its own, with its own GID.
            let one_per_gid = [
                "6 datagrams to 2 receivers, 1 address handles created for 1 destination GIDs",
                "6 datagrams to 2 receivers, 2 address handles created for 2 destination GIDs",
            ];
            if !one_per_gid.iter().any(|l| o.has("sender", l).is_ok()) {
                return o.has("sender", one_per_gid[0]);
            }
            o.has("node1", "node1: received 3 datagrams")?;
            o.has("node2", "received \"round 2 to node2\"")
        },
        ..net("ud-broadcast")
    },
    Example {
        name: "bench-throughput",
        procs: &[
            server("-l {ip}:{port}"),
            fg("client", "{ip}:{port} -n 2000 -s 1024 -b 32"),
        ],
        check: |o| {
            o.has("client", "send_msg  : 2000 messages of 1024 B")?;
            o.has("client", "send_batch: 2000 messages of 1024 B")?;
            o.has("client", "Mmsg/s")?;
            o.has("server", "pass 2: received 2000 messages, 2048000 bytes")
        },
        ..net("bench-throughput")
    },
    Example {
        name: "zerocopy",
        procs: &[server("-l {ip}:{port}"), fg("client", "{ip}:{port}")],
        check: |o| {
            o.has("server", "received \"hello zero-copy\" (15 bytes)")?;
            o.has("server", "received 1048576 bytes into a registered buffer")?;
            o.same("client", "server", "sha256 ")?;
            o.has("client", "payload bytes copied into send slots: 0")
        },
        ..net("zerocopy")
    },
    Example {
        name: "tuning",
        procs: &[
            server("-l {ip}:{port} {dev} --depth 16 --buf 16 --poll event"),
            fg(
                "client",
                "{ip}:{port} {dev} --depth 8 --buf 64 --poll busy --keepalive-ms 500",
            ),
        ],
        check: |o| {
            o.has(
                "server",
                "registered memory per connection = (16 + 16) x 16384 B = 524288 B",
            )?;
            o.has("client", "poll=Busy")?;
            // The smaller frame wins, whichever side asked for it.
            o.has("client", "settled frame 16384 B")?;
            o.has("server", "settled frame 16384 B")?;
            o.has("client", "client: echoed")
        },
        ..net("tuning")
    },
    Example {
        name: "async-echo",
        procs: &[
            server("-l {ip}:{port} --clients 2"),
            fg("client1", "{ip}:{port} -n 50"),
            fg("client2", "{ip}:{port} -n 50 -s 4096"),
        ],
        check: |o| {
            o.has("client1", "50 echoes of 64 B")?;
            o.has("client2", "50 echoes of 4096 B")?;
            o.has("server", "2 connections, 100 messages echoed")
        },
        ..net("async-echo")
    },
    Example {
        name: "rdma-write-read",
        procs: &[
            server("-l 0.0.0.0:{port}"),
            fg("client", "127.0.0.1:{port} --size 256"),
        ],
        check: |o| {
            let written = o.value_in("client", "wrote 262144 bytes", "sha256 ")?;
            let landed = o.value_in("server", "after the client's write", "sha256 ")?;
            if written != landed {
                return Err(format!(
                    "the server's region ({landed}) differs from what the client wrote ({written})"
                ));
            }
            let exposed = o.value_in("server", "filled the region", "sha256 ")?;
            let read = o.value_in("client", "read 262144 bytes", "sha256 ")?;
            if exposed != read {
                return Err(format!(
                    "the client read {read}, the server's region held {exposed}"
                ));
            }
            Ok(())
        },
        ..net("rdma-write-read")
    },
    // The examples that were there before gordma's.
    Example {
        name: "conn_echo",
        procs: &[
            daemon("server", "server {ip}:{port}", "conn_echo: listening on "),
            fg("client", "client {ip}:{port} -n 50 -s 256"),
        ],
        check: |o| o.has("client", "50 echoes of 256 B"),
        ..net("conn_echo")
    },
    Example {
        name: "ud_echo",
        procs: &[
            // The directory is the registry example's.
            Proc {
                program: Some("registry"),
                ..daemon("directory", "--registry 127.0.0.1:{port}", "listening on ")
            },
            daemon("server", "server \"$R_directory\"", "echo server at "),
            fg("client", "client \"$R_directory\""),
        ],
        check: |o| o.has("client", "\"hello 9\" from"),
        ..net("ud_echo")
    },
    Example {
        name: "rawconn_bw",
        procs: &[
            // It prints nothing before the client connects; the client retries its dial.
            bg_unmarked("server", "server --port {port}"),
            fg(
                "client",
                "client 127.0.0.1 --port {port} --size 4096 --iters 500 --depth 32 --batch 8",
            ),
        ],
        check: |o| {
            o.has("client", "rawconn_bw: mode=batch size=4096 iters=500")?;
            o.has("server", "received 500 messages, 2048000 bytes")
        },
        ..net("rawconn_bw")
    },
    Example {
        name: "async_vs_blocking",
        procs: &[fg("run", "{ip} 200 3")],
        check: |o| o.has("run", "async/blocking"),
        ..net("async_vs_blocking")
    },
    Example {
        name: "rc_transfer",
        procs: &[
            bg_unmarked("server", "server --port {port}"),
            fg(
                "client",
                "client 127.0.0.1 --port {port} --size 4096 --iters 200",
            ),
        ],
        check: |o| {
            o.has("client", "data verified")?;
            o.lacks("client", "MISMATCH")?;
            o.has("client", "client: done")?;
            o.has("server", "server: done")
        },
        ..verbs("rc_transfer")
    },
    Example {
        name: "post_overhead",
        // callgrind (the instruction counts where the CPU has no counters) is far too slow
        // under the VM's emulation.
        procs: &[fg("run", "--rounds 1 --wrs 20000 --no-callgrind")],
        check: |o| o.has("run", "pipeline step: post 1, poll 1"),
        ..verbs("post_overhead")
    },
    Example {
        name: "idle_queue_pairs",
        // Small: a check that it runs (`cargo xtask bench soft` measures).
        procs: &[fg("run", "--idle 16 --iters 200 --rounds 1")],
        check: |o| o.has("run", "idle queue pairs: ratio"),
        ..verbs("idle_queue_pairs")
    },
];

/// An rsrdma-net example's entry, to fill in.
const fn net(example: &'static str) -> Example {
    Example {
        name: example,
        package: "rsrdma-net",
        example,
        setup: "",
        procs: &[],
        check: |_| Ok(()),
    }
}

/// An rsrdma (verbs) example's entry, to fill in.
const fn verbs(example: &'static str) -> Example {
    Example {
        package: "rsrdma",
        ..net(example)
    }
}

/// What an example's processes printed, and how they ended.
pub struct Outputs {
    pub procs: Vec<ProcOutput>,
}

pub struct ProcOutput {
    pub label: String,
    /// The exit status (`None`: never reported).
    pub status: Option<i32>,
    pub text: String,
}

impl Outputs {
    fn of(&self, label: &str) -> Result<&ProcOutput, String> {
        self.procs
            .iter()
            .find(|p| p.label == label)
            .ok_or_else(|| format!("{label} did not run"))
    }

    /// `label` printed `what`.
    pub fn has(&self, label: &str, what: &str) -> Result<(), String> {
        let p = self.of(label)?;
        if p.text.contains(what) {
            Ok(())
        } else {
            Err(format!(
                "{label} did not print {what:?}{}",
                last_line(&p.text)
            ))
        }
    }

    /// `label` did not print `what`.
    pub fn lacks(&self, label: &str, what: &str) -> Result<(), String> {
        if self.of(label)?.text.contains(what) {
            return Err(format!("{label} printed {what:?}"));
        }
        Ok(())
    }

    /// The word after `key` on the first line of `label`'s output that contains both `line`
    /// and `key`.
    pub fn value_in(&self, label: &str, line: &str, key: &str) -> Result<String, String> {
        let p = self.of(label)?;
        p.text
            .lines()
            .filter(|l| l.contains(line))
            .find_map(|l| {
                let rest = &l[l.find(key)? + key.len()..];
                rest.split(|c: char| c.is_whitespace() || c == ',' || c == ';')
                    .next()
                    .map(str::to_string)
            })
            .ok_or_else(|| format!("{label} printed no line with {line:?} and {key:?}"))
    }

    /// `a` and `b` printed the same word after `key` (on their first lines with it).
    pub fn same(&self, a: &str, b: &str, key: &str) -> Result<(), String> {
        let va = self.value_in(a, "", key)?;
        let vb = self.value_in(b, "", key)?;
        if va == vb {
            Ok(())
        } else {
            Err(format!("{a} printed {key}{va}, {b} printed {key}{vb}"))
        }
    }
}

/// `: <the last line>` of a process's output, for a failure message.
fn last_line(text: &str) -> String {
    match text.lines().rev().find(|l| !l.trim().is_empty()) {
        Some(l) => format!(" (its last line: {:?})", l.trim()),
        None => " (it printed nothing)".to_string(),
    }
}

/// The examples whose name contains `filter`.
pub fn selected(filter: Option<&str>) -> Vec<&'static Example> {
    EXAMPLES
        .iter()
        .filter(|e| filter.is_none_or(|f| e.name.contains(f)))
        .collect()
}

/// Builds the examples' targets (debug, as the tests) as the unit stage's `cargo test`
/// does (see `build.rs`: nothing is compiled again after it), returning the directory of the
/// executables, `target/debug/examples`.
pub fn build(root: &Path, examples: &[&Example]) -> Result<PathBuf> {
    eprintln!(
        "[examples] cargo test --no-run --workspace --all-features (examples among its targets)"
    );
    let metadata = vm::cargo_metadata()?;
    let built = crate::build::with_unit_selection(root, &metadata, &[], false)?;
    let dir = vm::target_dir()?.join("debug").join("examples");
    for e in examples {
        let manifest_dir = crate::build::manifest_dir_of(&metadata, e.package)?;
        for target in std::iter::once(e.example).chain(e.procs.iter().filter_map(|p| p.program)) {
            let exe = &crate::build::find(&built, &manifest_dir, "example", target)?.exe;
            if *exe != dir.join(target) {
                bail!(
                    "cargo built example {target} at {}, not in {}",
                    exe.display(),
                    dir.display()
                );
            }
        }
    }
    Ok(dir)
}

const BEGIN: &str = "[ex] ==> ";
const PROC: &str = "[ex] --- ";
const END: &str = "[ex] <== ";
const TOOK: &str = "[ex] seconds: ";

/// Where the examples run: the VM's device and address, or soft0 on this host.
#[derive(Debug, Clone, Copy)]
pub struct Place {
    /// The RDMA address for rdma_cm (`{ip}`).
    pub ip: &'static str,
    pub device: &'static str,
    pub gid_index: &'static str,
}

/// rxe0 in the VM.
pub const VM: Place = Place {
    ip: vm::GUEST_IP,
    device: vm::GUEST_DEVICE,
    gid_index: vm::GUEST_GID_INDEX,
};

/// soft0 on this host (with `RSRDMA_SOFT_DEVICE=1`: listed, and rdma_cm is its CM).
pub const SOFT: Place = Place {
    ip: "127.0.0.1",
    device: "soft0",
    gid_index: "1",
};

/// The examples that run on soft0 (`cargo xtask examples --soft`, and the host stage of
/// `cargo xtask test`): all but `post_overhead`, which runs no device (a do-nothing
/// provider) and compiles its C baseline against rdma-core's headers, which the host stage
/// hides.
pub fn on_soft(examples: Vec<&'static Example>) -> Vec<&'static Example> {
    examples
        .into_iter()
        .filter(|e| e.name != "post_overhead")
        .collect()
}

/// The shell for all of `examples` at `place`: it prints each one's outputs between markers
/// that [`report`] reads, and never exits (so it can run after other work in one script).
pub fn script(examples: &[&Example], exe_dir: &Path, place: Place) -> String {
    let mut s = format!(
        "ex_root=$(mktemp -d /tmp/examples.XXXXXX); ex_t0=$(date +%s)\n\
         ex_ready() {{ # FILE MARKER PID: wait for MARKER's line, print the rest of it\n\
         \x20   i=0\n\
         \x20   while [ $i -lt {ready} ]; do\n\
         \x20       v=$(awk -v m=\"$2\" 'k = index($0, m) {{ print substr($0, k + length(m)); exit }}' \"$1\")\n\
         \x20       if [ -n \"$v\" ]; then echo \"$v\"; return 0; fi\n\
         \x20       kill -0 \"$3\" 2>/dev/null || return 1\n\
         \x20       sleep 0.1; i=$((i + 1))\n\
         \x20   done\n\
         \x20   return 1\n\
         }}\n",
        ready = READY_LIMIT_SECS * 10,
    );
    for (i, ex) in examples.iter().enumerate() {
        let port = BASE_PORT + 10 * i as u16;
        s.push_str(&format!(
            "\n# {name}\n\
             echo {begin}\n\
             d=\"$ex_root/{i}\"; mkdir -p \"$d\"; cd \"$d\"\n\
             ex_fail=; ex_fgfail=\n",
            name = ex.name,
            begin = sh_quote(&format!("{BEGIN}{}", ex.name)),
        ));
        if !ex.setup.is_empty() {
            s.push_str(&format!(
                "( {} ) > setup.out 2>&1 || ex_fail=setup\n",
                ex.setup
            ));
        }
        for p in ex.procs {
            let args = p
                .args
                .replace("{ip}", place.ip)
                .replace("{port}", &port.to_string())
                .replace(
                    "{dev}",
                    &format!("-d {} -x {}", place.device, place.gid_index),
                );
            let exe = exe_dir.join(p.program.unwrap_or(ex.example));
            let command = format!(
                "timeout {PROC_LIMIT_SECS} {} {args}",
                sh_quote(&exe.to_string_lossy())
            );
            let stdin = match p.stdin {
                Some(input) => format!("( {input} ) | "),
                None => String::new(),
            };
            let redirect = match p.stdin {
                Some(_) => format!("> {0}.out 2>&1", p.label),
                None => format!("< /dev/null > {0}.out 2>&1", p.label),
            };
            let l = p.label;
            if is_background(p) {
                s.push_str(&format!(
                    "[ -z \"$ex_fail\" ] && {{ {stdin}{command} {redirect} & pid_{l}=$!; }}\n"
                ));
                if let Some(marker) = p.ready.filter(|m| !m.is_empty()) {
                    s.push_str(&format!(
                        "[ -z \"$ex_fail\" ] && {{ R_{l}=$(ex_ready {l}.out {m} $pid_{l}) || ex_fail=\"{l} never printed {qm}\"; }}\n",
                        m = sh_quote(marker),
                        qm = marker.trim().replace(['"', '\'', '$', '`', '\\'], ""),
                    ));
                }
            } else {
                s.push_str(&format!(
                    "[ -z \"$ex_fail\" ] && {{ {stdin}{command} {redirect}; st_{l}=$?; \
                     [ $st_{l} -eq 0 ] || ex_fgfail=1; }}\n"
                ));
            }
        }
        // Await the background processes (their `timeout` bounds it), kill the daemons.
        for p in ex.procs.iter().filter(|p| is_background(p)) {
            let l = p.label;
            if p.daemon {
                s.push_str(&format!(
                    "[ -n \"$pid_{l}\" ] && {{ kill $pid_{l} 2>/dev/null; wait $pid_{l}; st_{l}=0; }}\n"
                ));
            } else {
                // After a failure it gets a few seconds to finish, then it is stopped.
                s.push_str(&format!(
                    "if [ -n \"$pid_{l}\" ]; then\n\
                     \x20   killer=; [ -n \"$ex_fail$ex_fgfail\" ] && {{ (sleep 10; kill $pid_{l} 2>/dev/null) & killer=$!; }}\n\
                     \x20   wait $pid_{l}; st_{l}=$?\n\
                     \x20   [ -n \"$killer\" ] && kill $killer 2>/dev/null\n\
                     fi\n"
                ));
            }
        }
        s.push_str(&format!(
            "[ -n \"$ex_fail\" ] && echo \"{PROC}(script) 1\" && echo \"$ex_fail\" && [ -f setup.out ] && cat setup.out\n"
        ));
        for p in ex.procs {
            let l = p.label;
            s.push_str(&format!(
                "echo \"{PROC}{l} ${{st_{l}:-none}}\"; [ -f {l}.out ] && cat {l}.out\n\
                 unset pid_{l} st_{l} R_{l}\n"
            ));
        }
        s.push_str(&format!(
            "echo {}\ncd /\n",
            sh_quote(&format!("{END}{}", ex.name))
        ));
    }
    s.push_str(&format!(
        "rm -rf \"$ex_root\"\necho \"{TOOK}$(( $(date +%s) - ex_t0 ))\"\n"
    ));
    s
}

/// Runs the script for `examples` on this host over soft0 (`RSRDMA_SOFT_DEVICE=1`), with
/// rdma-core hidden when `hide` (see `no_rdma_core.rs`); returns what it printed.
///
/// # Errors
/// The shell could not be started.
pub fn run_on_host(examples: &[&Example], exe_dir: &Path, hide: bool) -> Result<String> {
    let mut cmd = Command::new("sh");
    cmd.args(["-c", &script(examples, exe_dir, SOFT)])
        .env("RSRDMA_SOFT_DEVICE", "1");
    if hide {
        cmd = crate::no_rdma_core::wrap(&cmd)?;
    }
    let out = cmd
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("running the examples' script")?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// How long the examples took in the guest, as the script reported it.
pub fn took(output: &str) -> Option<Duration> {
    output
        .lines()
        .find_map(|l| l.trim_end_matches('\r').strip_prefix(TOOK))
        .and_then(|secs| secs.trim().parse().ok())
        .map(Duration::from_secs)
}

/// Runs in the background: a daemon, or a process with a ready line (an empty one: its
/// client finds it by retrying).
fn is_background(p: &Proc) -> bool {
    p.daemon || p.ready.is_some()
}

/// Reads the script's output and checks every example in `examples`: prints one line each
/// and the closing count; returns (passed, failed).
pub fn report(examples: &[&Example], output: &str, verbose: bool) -> (u64, u64) {
    let runs = parse(output);
    let (mut passed, mut failed) = (0, 0);
    let mut failures = Vec::new();
    for ex in examples {
        let verdict = match runs.iter().find(|(name, _)| name == ex.name) {
            None => Err("did not run".to_string()),
            Some((_, outputs)) => judge(ex, outputs),
        };
        match verdict {
            Ok(()) => {
                passed += 1;
                println!("example {} ok", ex.name);
            }
            Err(why) => {
                failed += 1;
                println!("example {} FAILED: {why}", ex.name);
                failures.push(ex.name);
            }
        }
    }
    for (name, outputs) in &runs {
        if verbose || failures.contains(&name.as_str()) {
            eprintln!("[examples] ---- what {name} printed:");
            for p in &outputs.procs {
                let status = p.status.map_or("none".into(), |s| s.to_string());
                eprintln!("[examples]   -- {} (exit status {status}):", p.label);
                for line in p.text.lines() {
                    eprintln!("[examples]      {line}");
                }
            }
        }
    }
    println!("{passed} passed, {failed} failed");
    (passed, failed)
}

fn judge(ex: &Example, o: &Outputs) -> Result<(), String> {
    if let Some(p) = o.procs.iter().find(|p| p.label == "(script)") {
        return Err(p
            .text
            .lines()
            .next()
            .unwrap_or("the script failed")
            .to_string());
    }
    for p in ex.procs {
        let out = o.of(p.label)?;
        match out.status {
            Some(0) => {}
            Some(124) => return Err(format!("{} timed out{}", p.label, last_line(&out.text))),
            Some(s) => {
                return Err(format!(
                    "{} exited with status {s}{}",
                    p.label,
                    last_line(&out.text)
                ))
            }
            None => return Err(format!("{} did not run", p.label)),
        }
    }
    (ex.check)(o)
}

/// Per example (by name): each process's status and output, as the script printed them.
fn parse(output: &str) -> Vec<(String, Outputs)> {
    let mut runs: Vec<(String, Outputs)> = Vec::new();
    let mut open = false;
    for line in output.lines() {
        let line = line.trim_end_matches('\r');
        if let Some(name) = line.strip_prefix(BEGIN) {
            runs.push((name.to_string(), Outputs { procs: Vec::new() }));
            open = true;
        } else if line.starts_with(END) {
            open = false;
        } else if let (true, Some(rest)) = (open, line.strip_prefix(PROC)) {
            if let Some((_, o)) = runs.last_mut() {
                let (label, status) = rest.rsplit_once(' ').unwrap_or((rest, ""));
                o.procs.push(ProcOutput {
                    label: label.to_string(),
                    status: status.parse().ok(),
                    text: String::new(),
                });
            }
        } else if open {
            if let Some(p) = runs.last_mut().and_then(|(_, o)| o.procs.last_mut()) {
                p.text.push_str(line);
                p.text.push('\n');
            }
        }
    }
    runs
}

const USAGE: &str = "usage: cargo xtask examples [--filter SUBSTRING] [--no-build] [--soft] \
                     [--timeout SECS] [--mem MB] [--cpus N] [--verbose]";

/// `cargo xtask examples`.
pub fn main(root: &Path, args: &[String]) -> Result<i32> {
    let mut vm_opts = VmOpts {
        timeout: Duration::from_secs(900),
        ..VmOpts::default()
    };
    let mut filter: Option<String> = None;
    let mut build_first = true;
    let mut soft = false;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        if vm::parse_common_opt(arg, &mut it, &mut vm_opts)? {
            continue;
        }
        match arg.as_str() {
            "--filter" => {
                filter = Some(
                    it.next()
                        .cloned()
                        .ok_or_else(|| anyhow!("--filter needs a value"))?,
                )
            }
            "--no-build" => build_first = false,
            "--soft" => soft = true,
            "-h" | "--help" => {
                eprintln!("{USAGE}");
                return Ok(0);
            }
            _ => bail!("unknown argument {arg:?}\n{USAGE}"),
        }
    }
    let mut examples = selected(filter.as_deref());
    if soft {
        examples = on_soft(examples);
    }
    if examples.is_empty() {
        bail!("no example matches the filter {filter:?}");
    }
    if soft {
        // On soft0, on this host: no VM, no root, no package.
        let exe_dir = if build_first {
            build(root, &examples)?
        } else {
            vm::target_dir()?.join("debug").join("examples")
        };
        let started = std::time::Instant::now();
        let output = run_on_host(&examples, &exe_dir, false)?;
        eprintln!("[examples] results (soft0):");
        let (_, failed) = report(&examples, &output, vm_opts.verbose);
        eprintln!(
            "[examples] took {:.1} s on soft0",
            started.elapsed().as_secs_f64()
        );
        return Ok(i32::from(failed != 0));
    }
    vm::ensure_packages(vm::HOST_PACKAGES)?;
    let exe_dir = if build_first {
        build(root, &examples)?
    } else {
        vm::target_dir()?.join("debug").join("examples")
    };
    let run = vm::run_in_vm_captured(&vm_opts, &script(&examples, &exe_dir, VM))?;
    eprintln!("[examples] results:");
    let (_, failed) = report(&examples, &run.output, vm_opts.verbose);
    eprintln!(
        "[examples] the VM part took {:.1} s (boot {:.1} s){}",
        run.total.as_secs_f64(),
        run.boot.as_secs_f64(),
        if run.timed_out { ", TIMED OUT" } else { "" }
    );
    Ok(if failed == 0 && !run.timed_out { 0 } else { 1 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_labels_are_shell_words() {
        for (i, a) in EXAMPLES.iter().enumerate() {
            assert!(
                EXAMPLES[i + 1..].iter().all(|b| b.name != a.name),
                "{}",
                a.name
            );
            assert!(!a.procs.is_empty(), "{} runs nothing", a.name);
            for p in a.procs {
                assert!(
                    p.label
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_'),
                    "{}: label {:?}",
                    a.name,
                    p.label
                );
            }
        }
    }

    #[test]
    fn every_example_target_is_in_the_table() {
        let metadata = vm::cargo_metadata().unwrap();
        for pkg in metadata["packages"].as_array().unwrap() {
            for t in pkg["targets"].as_array().unwrap() {
                if t["kind"].as_array().unwrap().iter().any(|k| k == "example") {
                    let name = t["name"].as_str().unwrap();
                    assert!(
                        EXAMPLES.iter().any(|e| e.example == name),
                        "example {name} is not run by `cargo xtask examples`"
                    );
                }
            }
        }
    }

    #[test]
    fn parses_outputs_and_judges_them() {
        let out = "\
noise
[ex] ==> echo-msg
[ex] --- server 0
echo-msg: listening on 10.77.0.1:19000
server: received \"hello rdmanet\" from 10.77.0.1:1234
[ex] --- client 0
client: echo \"hello rdmanet\"
[ex] <== echo-msg
[ex] ==> rpc
[ex] --- server 0
[ex] --- client 1
rpc: the server is gone
[ex] <== rpc
";
        let runs = parse(out);
        assert_eq!(runs.len(), 2);
        let echo = &EXAMPLES[0];
        assert_eq!(echo.name, "echo-msg");
        assert_eq!(judge(echo, &runs[0].1), Ok(()));
        let rpc = EXAMPLES.iter().find(|e| e.name == "rpc").unwrap();
        let why = judge(rpc, &runs[1].1).unwrap_err();
        assert!(why.contains("client exited with status 1"), "{why}");
        assert!(why.contains("the server is gone"), "{why}");
        // A wrong output fails the check.
        let wrong = parse(&out.replace("client: echo \"hello rdmanet\"", "client: echo \"bye\""));
        assert!(judge(echo, &wrong[0].1)
            .unwrap_err()
            .contains("did not print"));
    }

    #[test]
    fn the_script_is_valid_shell() {
        let script = script(&selected(None), Path::new("/x"), VM);
        let st = Command::new("sh")
            .args(["-n", "-c", &script])
            .status()
            .unwrap();
        assert!(st.success(), "sh -n refused the script:\n{script}");
        assert!(script.contains("/x/echo-msg' -l 10.77.0.1:19000"));
        // A helper program runs from the same directory.
        assert!(script.contains("/x/registry' --registry 127.0.0.1:"));
    }

    #[test]
    fn values_after_a_key_are_compared() {
        let o = Outputs {
            procs: vec![
                ProcOutput {
                    label: "client".into(),
                    status: Some(0),
                    text: "client: sent 3 bytes, sha256 abc\n".into(),
                },
                ProcOutput {
                    label: "server".into(),
                    status: Some(0),
                    text: "server: received 3 bytes, sha256 abd\n".into(),
                },
            ],
        };
        assert!(o.same("client", "server", "sha256 ").is_err());
        assert_eq!(o.value_in("client", "sent", "sha256 ").unwrap(), "abc");
    }
}
