//! `cargo xtask test`: every test, in order: formatting, clippy, the host's unit tests (doctests
//! included: the README's and the guide's code blocks), the guide (`cargo xtask docs`: the book
//! builds and has no broken link), then the device tests and the examples (`cargo xtask
//! examples`, see `examples.rs`) inside one boot of the soft-RoCE VM (see `vm/mod.rs`).
//!
//! Device tests are integration-test targets declared with `test = false` in their crate's
//! Cargo.toml, so that a plain `cargo test` on a machine without RDMA does not run them:
//!
//! ```toml
//! [[test]]
//! name = "device"
//! path = "tests/device/main.rs"
//! test = false
//! ```
//!
//! They are found through `cargo metadata`, built on the host, and run in the guest with
//! `--test-threads=1` each (soft RDMA under emulation is slow, and a test may spawn child
//! processes of its own binary): the binaries of `SOLO` first, alone, then the others in two
//! lanes at once (`SECOND_LANE`; `RSRDMA_VM_LANES=1` runs them one after another).
//! `--vm-only` runs only this stage and the VM's examples.

use crate::examples;
use crate::vm::{self, sh_quote, VmOpts};
use anyhow::{anyhow, bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const USAGE: &str = "usage: cargo xtask test [--no-vm | --vm-only] [--filter SUBSTRING] \
                     [--timeout SECS] [--mem MB] [--cpus N] [--verbose]";

pub fn main(root: &Path, args: &[String]) -> Result<i32> {
    // The device tests and the examples share the boot: a longer limit than one of them needs.
    let mut vm_opts = VmOpts {
        timeout: Duration::from_secs(1200),
        ..VmOpts::default()
    };
    let mut no_vm = false;
    // Only the VM's device tests and examples (the host's stages are skipped): for work on
    // the VM stage itself.
    let mut vm_only = false;
    let mut filter: Option<String> = None;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        if vm::parse_common_opt(arg, &mut it, &mut vm_opts)? {
            continue;
        }
        match arg.as_str() {
            "--no-vm" => no_vm = true,
            "--vm-only" => vm_only = true,
            "--filter" => {
                filter = Some(
                    it.next()
                        .cloned()
                        .ok_or_else(|| anyhow!("--filter needs a value"))?,
                )
            }
            a if a.starts_with("--filter=") => filter = Some(a["--filter=".len()..].to_string()),
            "-h" | "--help" => {
                eprintln!("{USAGE}");
                return Ok(0);
            }
            _ => bail!("unknown argument {arg:?}\n{USAGE}"),
        }
    }

    // The VM's packages (rdma-core's user space and headers among them: the layout test
    // compiles C against the headers) first, so the README's command works on a fresh machine.
    vm::ensure_packages(vm::HOST_PACKAGES)?;
    let mut steps: Vec<(String, bool, Duration)> = Vec::new();
    let (mut total_passed, mut total_failed) = (0u64, 0u64);
    let cargo = |args: &[&str]| {
        let mut cmd = Command::new(vm::cargo());
        cmd.args(args).current_dir(root);
        cmd
    };
    for (name, args) in [
        ("fmt", &["fmt", "--all", "--check"][..]),
        (
            "clippy",
            &[
                "clippy",
                "--workspace",
                "--all-targets",
                // The device tests too: they are `test = false` targets (run by this
                // command, not by `cargo test`), which `--all-targets` leaves out, and
                // warnings in them went unseen.
                "--test",
                "*",
                // Feature-gated code (tokio, bench-support) is linted too.
                "--all-features",
                "--",
                "-D",
                "warnings",
            ],
        ),
        (
            // What a user who builds without the optional features gets: no warnings either
            // (unused items of code only a feature calls hid behind --all-features).
            "clippy, default features",
            &[
                "clippy",
                "--workspace",
                "--lib",
                "--bins",
                "--",
                "-D",
                "warnings",
            ],
        ),
        ("unit tests", &["test", "--workspace", "--all-features"]),
    ]
    .into_iter()
    .filter(|_| !vm_only)
    {
        banner(&format!("{name}: cargo {}", args.join(" ")));
        let started = Instant::now();
        let ok = if name == "unit tests" {
            // Streamed through, and counted for the closing line.
            let (ok, p, f) = run_counting(cargo(args))?;
            total_passed += p;
            total_failed += f;
            ok
        } else {
            cargo(args)
                .status()
                .with_context(|| format!("running cargo {}", args[0]))?
                .success()
        };
        if !ok {
            eprintln!("[test] {name} FAILED");
        }
        steps.push((name.to_string(), ok, started.elapsed()));
    }

    if !vm_only {
        banner("docs: mdbook build docs/guide, then every link checked");
        let started = Instant::now();
        let ok = match crate::docs::run(root) {
            Ok(report) => {
                let (p, f) = report.counts();
                total_passed += p;
                total_failed += f;
                f == 0
            }
            Err(e) => {
                eprintln!("[test] docs FAILED: {e:#}");
                total_failed += 1;
                false
            }
        };
        if !ok {
            eprintln!("[test] docs FAILED");
        }
        steps.push(("docs".into(), ok, started.elapsed()));

        banner("device tests on the software device soft0, on the host, rdma-core hidden");
        let started = Instant::now();
        // In a mount namespace without rdma-core's libraries and headers (see no_rdma_core.rs):
        // the tests' build and every test run as on a machine that never had rdma-core.
        // `RSRDMA_KEEP_RDMA_CORE=1` runs them with it.
        // Where no namespace can be made (no unshare, no privilege for it), the stage runs with
        // rdma-core and says so in the summary.
        let mut hide = std::env::var_os("RSRDMA_KEEP_RDMA_CORE").is_none_or(|v| v != "1");
        let mut soft_step = "device tests (soft0)".to_string();
        if hide {
            if let Err(e) = crate::no_rdma_core::available() {
                eprintln!("[test] *** rdma-core NOT hidden for this stage: {e:#} ***");
                soft_step = "device tests (soft0, rdma-core NOT hidden)".into();
                hide = false;
            }
        } else {
            soft_step = "device tests (soft0, rdma-core kept)".into();
        }
        // The one crate that meets C, built afresh with neither headers nor libraries; the tests
        // run only once it builds.
        let built = !hide || {
            let mut cmd = cargo(&["build", "-p", "rsrdma-sys", "--target-dir"]);
            cmd.arg(root.join("target/no-rdma-core"));
            crate::no_rdma_core::wrap(&cmd)?
                .status()
                .context("building rsrdma-sys without rdma-core")?
                .success()
        };
        if !built {
            eprintln!("[test] rsrdma-sys did not build without rdma-core");
        }
        let mut soft_ok = built;
        let lists = [
            (crate::soft_tests::SOFT_TESTS, "1"),
            (crate::soft_tests::SOFT_TESTS_OVER_TCP, "0"),
        ];
        let runs: Vec<_> = lists
            .iter()
            .flat_map(|(list, shm)| list.iter().map(move |t| (t, *shm)))
            .collect();
        // One build of every target (see build.rs), in the namespace as the runs.
        let targets: Vec<&str> = runs.iter().map(|((_, target, _), _)| *target).collect();
        let metadata = vm::cargo_metadata()?;
        let soft_built = if built {
            crate::build::with_unit_selection(root, &metadata, &targets, hide)
                .inspect_err(|e| eprintln!("[test] building the device tests: {e:#}"))
                .ok()
        } else {
            None
        };
        soft_ok &= soft_built.is_some();
        let built = soft_built.unwrap_or_default();
        for ((pkg, target, tests), shm) in runs.iter().filter(|_| !built.is_empty()) {
            let dir = crate::build::manifest_dir_of(&metadata, pkg)?;
            let exe = &crate::build::find(&built, &dir, "test", target)?.exe;
            eprintln!("[test] ==> {pkg}/{target} on soft0 (RSRDMA_SOFT_SHM={shm})");
            let mut cmd = Command::new(exe);
            cmd.args(["--exact", "--test-threads", "4"])
                .args(tests.iter())
                .current_dir(&dir)
                .env("CARGO_MANIFEST_DIR", &dir)
                .env("RSRDMA_TEST_DEVICE", "soft0")
                .env("RSRDMA_TEST_IP", "127.0.0.1")
                .env("RSRDMA_SOFT_DEVICE", "1")
                .env("RSRDMA_SOFT_SHM", shm);
            if hide {
                cmd.env("RSRDMA_EXPECT_NO_RDMA_CORE", "1");
                cmd = crate::no_rdma_core::wrap(&cmd)?;
            }
            let (ok, p, f) = run_counting_within(cmd, Some(SOFT_BINARY_LIMIT))?;
            total_passed += p;
            total_failed += f;
            // Every named test must have run: a renamed test would otherwise drop out unseen.
            let ran_all = p + f == tests.len() as u64;
            if !ran_all {
                eprintln!(
                "[test] {pkg}/{target} on soft0 (RSRDMA_SOFT_SHM={shm}): {} of {} named tests ran",
                p + f,
                tests.len()
            );
            }
            soft_ok &= ok && ran_all;
        }
        if !soft_ok {
            eprintln!("[test] device tests on soft0 FAILED");
        }
        steps.push((soft_step, soft_ok, started.elapsed()));

        // The examples on soft0 too, as a user without RDMA runs them (rdma-core hidden as above).
        let on_soft = examples::on_soft(examples::selected(filter.as_deref()));
        if !on_soft.is_empty() {
            banner("examples on soft0, on the host");
            let started = Instant::now();
            let ok = match examples::build(root, &on_soft)
                .and_then(|exe_dir| examples::run_on_host(&on_soft, &exe_dir, hide))
            {
                Ok(output) => {
                    let (p, f) = examples::report(&on_soft, &output, vm_opts.verbose);
                    total_passed += p;
                    total_failed += f;
                    f == 0
                }
                Err(e) => {
                    eprintln!("[test] examples on soft0: {e:#}");
                    total_failed += 1;
                    false
                }
            };
            if !ok {
                eprintln!("[test] examples on soft0 FAILED");
            }
            steps.push(("examples (soft0)".into(), ok, started.elapsed()));
        }
    }

    if no_vm {
        eprintln!();
        let line = "*** SKIPPED the device tests (--no-vm): nothing ran against RDMA ***";
        let stars = "*".repeat(line.len());
        eprintln!("[test] {stars}\n[test] {line}\n[test] {stars}");
    } else {
        banner("device tests in the VM");
        let started = Instant::now();
        let mut examples_step = None;
        let ok = match device_tests(root, &vm_opts, filter.as_deref()) {
            Ok((ok, p, f, ex)) => {
                total_passed += p;
                total_failed += f;
                // The examples ran in the same boot: a step of their own, counted too.
                if let Some((ex_ok, ex_p, ex_f, took)) = ex {
                    total_passed += ex_p;
                    total_failed += ex_f;
                    examples_step = Some(("examples (VM)".to_string(), ex_ok, took));
                }
                ok
            }
            Err(e) => {
                eprintln!("[test] device tests FAILED: {e:#}");
                false
            }
        };
        // The examples' time is theirs, not the device tests'.
        let examples_took = examples_step
            .as_ref()
            .map_or(Duration::ZERO, |(_, _, t)| *t);
        let took = started.elapsed().saturating_sub(examples_took);
        steps.push(("device tests (VM)".into(), ok, took));
        steps.extend(examples_step);
    }

    eprintln!();
    eprintln!("[test] summary:");
    for (name, ok, took) in &steps {
        let verdict = if *ok { "ok" } else { "FAILED" };
        eprintln!(
            "[test]   {name:<20} {verdict:<7} {:>7.1} s",
            took.as_secs_f64()
        );
    }
    if no_vm {
        eprintln!("[test]   {:<20} SKIPPED (--no-vm)", "device tests (VM)");
        eprintln!("[test]   {:<20} SKIPPED (--no-vm)", "examples (VM)");
    }
    let failed = steps.iter().filter(|(_, ok, _)| !ok).count();
    if failed == 0 {
        let skipped = if no_vm { " (device tests SKIPPED)" } else { "" };
        eprintln!("[test] all passed{skipped}");
    } else {
        eprintln!("[test] {failed} step(s) FAILED");
    }
    // The closing line: every test that ran, host and VM, plainly counted.
    println!("total: {total_passed} passed, {total_failed} failed");
    Ok(if failed == 0 { 0 } else { 1 })
}

fn banner(title: &str) {
    eprintln!();
    eprintln!("[test] ==== {title}");
}

/// An integration-test target declared with `test = false`.
#[derive(Debug)]
struct DeviceTarget {
    package: String,
    name: String,
    manifest_dir: PathBuf,
}

impl DeviceTarget {
    fn label(&self) -> String {
        format!("{}/{}", self.package, self.name)
    }
}

fn discover(metadata: &serde_json::Value) -> Vec<DeviceTarget> {
    crate::build::integration_tests(metadata)
        .filter(|(_, t)| !crate::build::runs_in_cargo_test(t))
        .map(|(pkg, t)| {
            let manifest = Path::new(pkg["manifest_path"].as_str().unwrap_or_default());
            DeviceTarget {
                package: pkg["name"].as_str().unwrap_or_default().to_string(),
                name: t["name"].as_str().unwrap_or_default().to_string(),
                manifest_dir: manifest.parent().unwrap_or(Path::new("/")).to_path_buf(),
            }
        })
        .collect()
}

/// What one test binary did in the guest.
#[derive(Debug, Default, PartialEq, Eq)]
struct BinaryResult {
    status: Option<i32>,
    passed: u64,
    failed: u64,
    ignored: u64,
    /// Whether libtest printed its final "test result:" line.
    summarised: bool,
}

const START: &str = "[test] ==> ";
const FINISH: &str = "[test] <== ";

/// How long one soft0 device-test binary may run (each takes seconds; the whole stage about
/// a minute): past it, its threads' stacks are shown and it is killed, so a hang fails the
/// stage at once with where it hung, not CI's whole limit later with nothing.
const SOFT_BINARY_LIMIT: Duration = Duration::from_secs(300);

/// How long one device-test binary may run in the VM (the slowest takes about three minutes
/// under load): past it, `timeout` ends it and the stage goes on, its failure shown.
const VM_BINARY_LIMIT_SECS: u64 = 600;

/// Runs `cmd` with its stdout streamed through, and adds up libtest's "test result:" lines.
/// Returns whether it succeeded, and the tests passed and failed.
fn run_counting(cmd: Command) -> Result<(bool, u64, u64)> {
    run_counting_within(cmd, None)
}

/// [`run_counting`], killing `cmd` (and every process of its group) past `limit`, after
/// showing its threads' stacks where gdb is installed.
fn run_counting_within(mut cmd: Command, limit: Option<Duration>) -> Result<(bool, u64, u64)> {
    use std::io::{BufRead, BufReader};
    use std::os::unix::process::CommandExt;
    // Under a limit, a group of its own: the children a test spawns go with it. (Not
    // otherwise: a group of its own leaves a terminal's Ctrl-C to xtask alone.)
    if limit.is_some() {
        cmd.process_group(0);
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .context("running cargo test")?;
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let pid = child.id();
    let watchdog = limit.map(|limit| {
        std::thread::spawn(move || {
            if finished.recv_timeout(limit) != Err(std::sync::mpsc::RecvTimeoutError::Timeout) {
                return;
            }
            eprintln!(
                "[test] *** still running after {} s: its threads' stacks, then killed ***",
                limit.as_secs()
            );
            show_stacks(pid);
            // SAFETY: kill has no memory preconditions; the group is the child's own.
            unsafe { libc::kill(-(pid as i32), libc::SIGKILL) };
        })
    });
    let (mut passed, mut failed) = (0, 0);
    for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
        let line = line.context("reading cargo test's output")?;
        println!("{line}");
        if let Some(summary) = line.trim_start().strip_prefix("test result: ") {
            let count = |word: &str| {
                summary
                    .split(';')
                    .find_map(|part| {
                        part.trim()
                            .strip_suffix(word)?
                            .trim()
                            .rsplit(' ')
                            .next()?
                            .parse::<u64>()
                            .ok()
                    })
                    .unwrap_or(0)
            };
            passed += count("passed");
            failed += count("failed");
        }
    }
    let status = child.wait()?;
    drop(done);
    if let Some(w) = watchdog {
        let _ = w.join();
    }
    Ok((status.success(), passed, failed))
}

/// Prints every thread's stack of process `pid` with gdb, where it is installed.
fn show_stacks(pid: u32) {
    let shown = Command::new("timeout")
        .args([
            "60",
            "gdb",
            "-p",
            &pid.to_string(),
            "-batch",
            "-ex",
            "thread apply all bt",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .status();
    if !shown.is_ok_and(|s| s.success()) {
        eprintln!("[test] (no stacks: gdb is not installed or could not attach)");
    }
}

/// The device-test binaries the VM runs alone, before the lanes: those that run C perftest,
/// whose clock calibration fails (r² < 0.9, "Can't produce a report") when the other lane
/// keeps the VM's CPUs busy.
const SOLO: &[&str] = &["rsrdma-perftest/device"];

/// The device-test binaries of the VM's second lane, run beside the others (after [`SOLO`]).
/// One test at a time left the VM's two vCPUs mostly idle (a typical binary kept about half
/// of one busy: the tests wait on the emulated network, on timers and on child processes),
/// and the stage took 8 of CI's 15 minutes. Balanced by the stage's measured times; the
/// examples run after both lanes. A test that counts the device's resources counts only its
/// own process's (the other lane's come and go).
const SECOND_LANE: &[&str] = &[
    "rsrdma-net/async_device",
    "rsrdma-net/shared_recv_device",
    "rsrdma-net/rails_device",
    "rsrdma-perftest/rdmanet_device",
    "rsrdma-net/zerocopy_device",
    "rsrdma-net/packet_device",
];

/// What the examples did: whether all passed, the counts, and the time they took.
type ExamplesResult = Option<(bool, u64, u64, Duration)>;

/// Runs the device tests, then the examples (those whose name contains the filter), in one
/// VM boot. Returns whether all device tests passed, their counts, and the examples' result
/// (`None` when no example matched the filter).
fn device_tests(
    root: &Path,
    vm_opts: &VmOpts,
    filter: Option<&str>,
) -> Result<(bool, u64, u64, ExamplesResult)> {
    let metadata = vm::cargo_metadata()?;
    let targets = discover(&metadata);
    if targets.is_empty() {
        bail!(
            "no device test targets found: declare them as `[[test]] … test = false` in a \
             workspace crate's Cargo.toml (cargo metadata lists no test target with \"test\": false)"
        );
    }
    let labels: Vec<String> = targets.iter().map(DeviceTarget::label).collect();
    eprintln!("[test] device test targets: {}", labels.join(", "));

    // One build of every target (see build.rs).
    let names: Vec<&str> = targets.iter().map(|t| t.name.as_str()).collect();
    let built = crate::build::with_unit_selection(root, &metadata, &names, false)?;
    let mut runs: Vec<(&DeviceTarget, PathBuf)> = Vec::new();
    for t in &targets {
        let exe = crate::build::find(&built, &t.manifest_dir, "test", &t.name)?;
        runs.push((t, exe.exe.clone()));
    }

    // `RSRDMA_TEST_REPORT_TIME=1` on the host makes libtest print each test's time in the
    // guest (an unstable libtest option, hence RUSTC_BOOTSTRAP): where the VM stage's minutes go.
    let report_time = std::env::var_os("RSRDMA_TEST_REPORT_TIME").is_some_and(|v| v == "1");
    let mut script = String::from(if report_time {
        "export RUSTC_BOOTSTRAP=1; times='-Z unstable-options --report-time'\n"
    } else {
        "times=\n"
    });
    script.push_str(&format!("limit={VM_BINARY_LIMIT_SECS}\n"));
    script.push_str(
        "failed=0\n\
         : \"${RUST_BACKTRACE:=1}\"; export RUST_BACKTRACE\n\
         run() {\n\
         \x20   label=$1; dir=$2; exe=$3; shift 3\n\
         \x20   echo \"[test] ==> $label\"\n\
         \x20   (cd \"$dir\" && CARGO_MANIFEST_DIR=\"$dir\" exec timeout -k 10 $limit \"$exe\" --test-threads=1 $times \"$@\")\n\
         \x20   st=$?\n\
         \x20   echo \"[test] <== $label $st\"\n\
         \x20   [ $st -eq 0 ] || failed=1\n\
         }\n",
    );
    let run_line = |t: &DeviceTarget, exe: &Path| {
        format!(
            "run {} {} {}{}\n",
            sh_quote(&t.label()),
            sh_quote(&t.manifest_dir.to_string_lossy()),
            sh_quote(&exe.to_string_lossy()),
            filter
                .map(|f| format!(" {}", sh_quote(f)))
                .unwrap_or_default()
        )
    };
    // The binaries of SOLO first, alone; then two lanes of the others at once (see
    // SECOND_LANE), unless `RSRDMA_VM_LANES=1` (one after another). The second lane's output
    // is kept in a file and shown after the first's, so that each binary's lines stay
    // together for the parser.
    let lanes = std::env::var("RSRDMA_VM_LANES").map_or(2, |v| if v == "1" { 1 } else { 2 });
    let (solo, rest): (Vec<_>, Vec<_>) = runs
        .iter()
        .partition(|(t, _)| SOLO.contains(&t.label().as_str()));
    let (second, first): (Vec<_>, Vec<_>) = rest
        .into_iter()
        .partition(|(t, _)| lanes == 2 && SECOND_LANE.contains(&t.label().as_str()));
    for (t, exe) in &solo {
        script.push_str(&run_line(t, exe));
    }
    if !second.is_empty() {
        script.push_str("lane2_log=$(mktemp /tmp/lane2.XXXXXX)\n(\n");
        for (t, exe) in &second {
            script.push_str(&run_line(t, exe));
        }
        script.push_str("exit $failed\n) > \"$lane2_log\" 2>&1 &\nlane2=$!\n");
    }
    for (t, exe) in &first {
        script.push_str(&run_line(t, exe));
    }
    if !second.is_empty() {
        script.push_str("wait $lane2 || failed=1\ncat \"$lane2_log\"\n");
    }
    // The examples after the device tests, in the same boot.
    let selected = examples::selected(filter);
    let mut examples_built = true;
    if !selected.is_empty() {
        match examples::build(root, &selected) {
            Ok(exe_dir) => script.push_str(&examples::script(&selected, &exe_dir, examples::VM)),
            Err(e) => {
                eprintln!("[test] examples: {e:#}");
                examples_built = false;
            }
        }
    }
    script.push_str("exit $failed\n");

    let run = vm::run_in_vm_captured(vm_opts, &script)?;
    let results = parse_results(&run.output);
    let examples_result = if selected.is_empty() {
        None
    } else if !examples_built {
        Some((false, 0, selected.len() as u64, Duration::ZERO))
    } else {
        eprintln!("[test] examples:");
        let (p, f) = examples::report(&selected, &run.output, vm_opts.verbose);
        let took = examples::took(&run.output).unwrap_or_default();
        Some((f == 0 && !run.timed_out, p, f, took))
    };

    let mut ok = !run.timed_out && run.status == 0;
    let (mut passed, mut failed, mut ignored) = (0, 0, 0);
    for label in &labels {
        let r = results.iter().find(|(l, _)| l == label).map(|(_, r)| r);
        match r {
            None => {
                eprintln!("[test] {label}: did not run");
                ok = false;
            }
            Some(r) => {
                passed += r.passed;
                failed += r.failed;
                ignored += r.ignored;
                if r.status != Some(0) || !r.summarised {
                    let status = r.status.map_or("none".into(), |s| s.to_string());
                    let note = if r.summarised {
                        ""
                    } else {
                        ", no libtest summary (crashed?)"
                    };
                    eprintln!("[test] {label}: FAILED (exit status {status}{note})");
                    ok = false;
                }
            }
        }
    }
    if passed + failed == 0 {
        match filter {
            Some(f) => eprintln!("[test] no device test matched the filter {f:?}"),
            None => eprintln!("[test] the device test targets contain no tests"),
        }
        ok = false;
    }
    eprintln!(
        "[test] device tests: {passed} passed, {failed} failed, {ignored} ignored in {} target(s); \
         the VM part took {:.1} s (boot {:.1} s){}",
        labels.len(),
        run.total.as_secs_f64(),
        run.boot.as_secs_f64(),
        if run.timed_out { ", TIMED OUT" } else { "" }
    );
    Ok((ok, passed, failed, examples_result))
}

/// Per binary (by label): its exit status and libtest's last "test result:" line (a test's child
/// processes may print their own summaries before it).
fn parse_results(output: &str) -> Vec<(String, BinaryResult)> {
    let mut results: Vec<(String, BinaryResult)> = Vec::new();
    for line in output.lines() {
        let line = line.trim_end_matches('\r');
        if let Some(label) = line.strip_prefix(START) {
            results.push((label.to_string(), BinaryResult::default()));
        } else if let Some(rest) = line.strip_prefix(FINISH) {
            if let (Some((label, status)), Some((current, r))) =
                (rest.rsplit_once(' '), results.last_mut())
            {
                if label == current {
                    r.status = status.parse().ok();
                }
            }
        } else if let Some(summary) = line.trim_start().strip_prefix("test result: ") {
            if let Some((_, r)) = results.last_mut() {
                let count = |what: &str| {
                    summary
                        .split([';', '.'])
                        .filter_map(|part| part.trim().strip_suffix(what))
                        .find_map(|n| n.trim().parse::<u64>().ok())
                        .unwrap_or(0)
                };
                r.passed = count("passed");
                r.failed = count("failed");
                r.ignored = count("ignored");
                r.summarised = true;
            }
        }
    }
    results
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A binary past its limit is killed with the processes it started (a child holding the
    /// output open kept the stage waiting for it), and counts as failed.
    #[test]
    fn a_binary_past_its_limit_ends_with_its_children() {
        let mut cmd = Command::new("sh");
        cmd.args([
            "-c",
            "sleep 120 & echo 'test result: ok. 1 passed; 0 failed'; wait",
        ]);
        let t0 = Instant::now();
        let (ok, passed, failed) =
            run_counting_within(cmd, Some(Duration::from_millis(500))).unwrap();
        assert!(!ok && passed == 1 && failed == 0);
        assert!(
            t0.elapsed() < Duration::from_secs(100),
            "{:?}",
            t0.elapsed()
        );
    }

    #[test]
    fn parses_libtest_summaries_per_binary() {
        let out = "\
[test] ==> rsrdma/device
running 3 tests
test a ... ok
running 1 test
test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 2 filtered out; finished in 0.10s
test result: FAILED. 2 passed; 1 failed; 1 ignored; 0 measured; 0 filtered out; finished in 3.21s
[test] <== rsrdma/device 101
[test] ==> other/device
[test] <== other/device 134
";
        let r = parse_results(out);
        assert_eq!(r.len(), 2);
        assert_eq!(
            r[0],
            (
                "rsrdma/device".into(),
                BinaryResult {
                    status: Some(101),
                    passed: 2,
                    failed: 1,
                    ignored: 1,
                    summarised: true
                }
            )
        );
        assert_eq!(
            r[1].1,
            BinaryResult {
                status: Some(134),
                ..Default::default()
            }
        );
    }

    #[test]
    fn discovers_only_tests_with_test_false() {
        let metadata = serde_json::json!({"packages": [{
            "name": "rsrdma",
            "manifest_path": "/w/crates/rsrdma/Cargo.toml",
            "targets": [
                {"name": "rsrdma", "kind": ["lib"], "test": true},
                {"name": "device", "kind": ["test"], "test": false},
                {"name": "unit", "kind": ["test"], "test": true},
                {"name": "rc_transfer", "kind": ["example"], "test": false}
            ]
        }]});
        let found = discover(&metadata);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].label(), "rsrdma/device");
        assert_eq!(found[0].manifest_dir, PathBuf::from("/w/crates/rsrdma"));
    }
}
