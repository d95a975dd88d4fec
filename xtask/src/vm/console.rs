//! The guest's serial console: following it while qemu runs (the boot log hidden, the command's
//! output streamed between two markers), and the command's exit status at the end.

use super::{say, VmOpts, VmRun, TIMEOUT_STATUS};
use anyhow::{bail, Context, Result};
use std::io::{Read, Write};
use std::process::{Child, ChildStdout};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long the guest may take to power off after the command ended.
const POWEROFF_GRACE: Duration = Duration::from_secs(60);

/// Lines the guest prints around the command's output (unique per run).
pub(super) struct Markers {
    /// Printed on a line of its own before the command runs.
    pub begin: String,
    /// Printed right after the command's output, which may not end with a newline.
    pub end: String,
}

impl Markers {
    pub(super) fn new() -> Markers {
        let nonce = format!("{:x}-{:x}", std::process::id(), now_nanos());
        Markers {
            begin: format!("@@xtask-vm-{nonce}:begin@@"),
            end: format!("@@xtask-vm-{nonce}:end@@"),
        }
    }
}

fn now_nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// Follows qemu's console (its stdout) until qemu exits, the time limit passes, or the guest
/// takes too long to power off after the command; kills qemu in the last two cases.
pub(super) fn watch(
    mut child: Child,
    started: Instant,
    opts: &VmOpts,
    markers: &Markers,
) -> Result<VmRun> {
    let stdout = child.stdout.take().context("qemu's stdout is not piped")?;
    let (rx, reader) = spawn_reader(stdout);
    let mut console = Console::new(markers, opts.verbose);
    let pumped = pump(&mut child, &rx, &mut console, started, opts.timeout);
    if pumped.is_err() {
        let _ = child.kill();
    }
    let exit = child.wait()?;
    drop(rx);
    let _ = reader.join();
    let (boot_time, timed_out) = pumped.context("writing the guest's output")?;
    let total = started.elapsed();
    console.flush()?;
    if console.state == State::Booting && !opts.verbose {
        // Never got to the command: show what the guest said (firmware, kernel, init).
        eprintln!("[vm] guest console (the guest never reached the command; qemu {exit}):");
        eprintln!("{}", String::from_utf8_lossy(&console.boot_log));
    } else if console.state == State::Running && !timed_out {
        eprintln!("[vm] the guest stopped while the command was running (qemu {exit})");
    }
    Ok(VmRun {
        status: if timed_out { TIMEOUT_STATUS } else { -1 },
        timed_out,
        output: String::from_utf8_lossy(&console.output).into_owned(),
        boot: boot_time.unwrap_or(total),
        total,
    })
}

/// A thread that forwards qemu's stdout in chunks.
fn spawn_reader(mut stdout: ChildStdout) -> (mpsc::Receiver<Vec<u8>>, JoinHandle<()>) {
    let (tx, rx) = mpsc::channel::<Vec<u8>>();
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match stdout.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx.send(buf[..n].to_vec()).is_err() {
                        break;
                    }
                }
            }
        }
    });
    (rx, reader)
}

/// Feeds the console until qemu's stdout closes or a limit passes (then kills qemu). Returns
/// when the guest became ready, and whether the time limit killed it; fails when our own
/// stdout is gone (a closed pipe: nobody sees the run any more).
fn pump(
    child: &mut Child,
    rx: &mpsc::Receiver<Vec<u8>>,
    console: &mut Console,
    started: Instant,
    timeout: Duration,
) -> Result<(Option<Duration>, bool)> {
    let deadline = started + timeout;
    let mut boot_time = None;
    let mut end_seen_at: Option<Instant> = None;
    loop {
        let now = Instant::now();
        // After the end marker the guest only has to power off.
        let limit = end_seen_at.map_or(deadline, |t| deadline.min(t + POWEROFF_GRACE));
        if now >= limit {
            let _ = child.kill();
            return Ok((boot_time, end_seen_at.is_none()));
        }
        match rx.recv_timeout(limit - now) {
            Ok(chunk) => console.feed(&chunk)?,
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => return Ok((boot_time, false)),
        }
        if boot_time.is_none() && console.state != State::Booting {
            let t = started.elapsed();
            boot_time = Some(t);
            say(format!(
                "guest ready after {:.1} s; running the command",
                t.as_secs_f64()
            ));
        }
        if end_seen_at.is_none() && console.state == State::Done {
            end_seen_at = Some(Instant::now());
        }
    }
}

/// Completes `run` with the exit status the guest wrote to the control share (`status_file`),
/// and says how the run ended.
pub(super) fn finish(opts: &VmOpts, mut run: VmRun, status_file: &str) -> Result<VmRun> {
    if run.timed_out {
        eprintln!(
            "[vm] TIMEOUT: killed the VM after {} s (limit --timeout {}); exit status {TIMEOUT_STATUS}",
            run.total.as_secs(),
            opts.timeout.as_secs()
        );
        return Ok(run);
    }
    run.status = parse_status(status_file, run.total)?;
    eprintln!(
        "[vm] exit status {} (boot {:.1} s, total {:.1} s)",
        run.status,
        run.boot.as_secs_f64(),
        run.total.as_secs_f64()
    );
    Ok(run)
}

/// The command's exit status from the control share's `status` file.
fn parse_status(status_file: &str, total: Duration) -> Result<i32> {
    match status_file.trim() {
        s if s.starts_with("setup-failed") => {
            bail!(
                "the VM started but its setup failed: {} (guest console above)",
                s.trim_start_matches("setup-failed").trim()
            )
        }
        "" => bail!(
            "the VM exited without reporting the command's exit status after {:.1} s (guest crash, \
             kernel panic or out of memory?)",
            total.as_secs_f64()
        ),
        s => s
            .parse()
            .with_context(|| format!("bad status {s:?} from the guest")),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Booting,
    Running,
    Done,
}

/// Splits the serial console into the boot log (hidden unless the boot fails), the command's
/// output (streamed to stdout live and kept) and what follows the end marker (dropped).
struct Console {
    begin: Vec<u8>,
    end: Vec<u8>,
    /// Copy the boot log to stderr as it comes.
    verbose: bool,
    /// Stream the command's output to stdout (off in unit tests).
    live: bool,
    state: State,
    boot_log: Vec<u8>,
    /// How much of the boot log `verbose` has shown.
    shown: usize,
    /// Bytes held back because they could be the start of the end marker.
    pending: Vec<u8>,
    output: Vec<u8>,
}

impl Console {
    fn new(markers: &Markers, verbose: bool) -> Self {
        Console {
            begin: markers.begin.as_bytes().to_vec(),
            end: markers.end.as_bytes().to_vec(),
            verbose,
            live: true,
            state: State::Booting,
            boot_log: Vec::new(),
            shown: 0,
            pending: Vec::new(),
            output: Vec::new(),
        }
    }

    fn feed(&mut self, chunk: &[u8]) -> Result<()> {
        match self.state {
            State::Booting => self.feed_boot(chunk),
            State::Running => self.feed_output(chunk),
            State::Done => Ok(()),
        }
    }

    fn feed_boot(&mut self, chunk: &[u8]) -> Result<()> {
        self.boot_log.extend_from_slice(chunk);
        let begin = self.begin_line();
        if self.verbose {
            // Whole lines only, so that a marker is never shown in pieces.
            let upto = begin.map_or_else(|| self.whole_lines_end(), |(i, _)| i);
            if upto > self.shown {
                std::io::stderr()
                    .lock()
                    .write_all(&self.boot_log[self.shown..upto])?;
                self.shown = upto;
            }
        }
        if let Some((i, rest)) = begin {
            let rest = self.boot_log.split_off(rest);
            self.boot_log.truncate(i);
            self.state = State::Running;
            self.feed(&rest)?;
        }
        Ok(())
    }

    /// Where the begin marker starts and its line ends, once that line is complete ("\n", or
    /// "\r\n" if the console still translates newlines).
    fn begin_line(&self) -> Option<(usize, usize)> {
        let i = find(&self.boot_log, &self.begin)?;
        let after = &self.boot_log[i + self.begin.len()..];
        let eol = [&b"\n"[..], b"\r\n"]
            .into_iter()
            .find(|e| after.starts_with(e))?;
        Some((i, i + self.begin.len() + eol.len()))
    }

    /// The end of the last complete line of the boot log.
    fn whole_lines_end(&self) -> usize {
        self.boot_log
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |i| i + 1)
    }

    fn feed_output(&mut self, chunk: &[u8]) -> Result<()> {
        self.pending.extend_from_slice(chunk);
        let (emit, done) = match find(&self.pending, &self.end) {
            Some(i) => (i, true),
            None => (
                self.pending.len() - partial_suffix(&self.pending, &self.end),
                false,
            ),
        };
        let out: Vec<u8> = self.pending.drain(..emit).collect();
        self.emit(&out)?;
        if done {
            self.pending.clear();
            self.state = State::Done;
        }
        Ok(())
    }

    fn emit(&mut self, bytes: &[u8]) -> Result<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        self.output.extend_from_slice(bytes);
        if !self.live {
            return Ok(());
        }
        let mut stdout = std::io::stdout().lock();
        stdout.write_all(bytes)?;
        stdout.flush()?;
        Ok(())
    }

    /// Emits what was held back, and ends the output with a newline if it has none.
    fn flush(&mut self) -> Result<()> {
        let pending = std::mem::take(&mut self.pending);
        self.emit(&pending)?;
        if self.live && self.output.last().is_some_and(|&b| b != b'\n') {
            let mut stdout = std::io::stdout().lock();
            stdout.write_all(b"\n")?;
            stdout.flush()?;
        }
        Ok(())
    }
}

pub(super) fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The length of the longest suffix of `data` that is a proper prefix of `marker`.
fn partial_suffix(data: &[u8], marker: &[u8]) -> usize {
    (1..marker.len().min(data.len() + 1))
        .rev()
        .find(|&n| data.ends_with(&marker[..n]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn console_splits_and_holds_back_marker_prefixes() {
        let markers = Markers {
            begin: "<B>".into(),
            end: "<END>".into(),
        };
        let mut c = Console::new(&markers, false);
        c.live = false;
        c.feed(b"firmware noise\n<B").unwrap();
        assert_eq!(c.state, State::Booting);
        c.feed(b">\nhello <E").unwrap();
        assert_eq!(c.state, State::Running);
        assert_eq!(c.output, b"hello ");
        c.feed(b"x <EN").unwrap();
        assert_eq!(c.output, b"hello <Ex ");
        c.feed(b"D>poweroff").unwrap();
        assert_eq!(c.state, State::Done);
        assert_eq!(c.output, b"hello <Ex ");
    }

    #[test]
    fn partial_suffixes() {
        assert_eq!(partial_suffix(b"abc<E", b"<END>"), 2);
        assert_eq!(partial_suffix(b"abc", b"<END>"), 0);
        assert_eq!(partial_suffix(b"<", b"<END>"), 1);
    }

    #[test]
    fn statuses_from_the_guest() {
        let t = Duration::from_secs(1);
        assert_eq!(parse_status("3\n", t).unwrap(), 3);
        let setup = parse_status("setup-failed mount /proc\n", t).unwrap_err();
        assert!(setup.to_string().contains("mount /proc"), "{setup}");
        assert!(parse_status("", t).is_err());
        assert!(parse_status("garbage", t).is_err());
    }
}
