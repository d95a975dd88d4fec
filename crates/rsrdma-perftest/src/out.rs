//! Where a run's text goes: stdout (or a sink for the loopback server), honouring `--output=`.

use crate::args::Params;
use std::io::Write;

/// Output that honours `--output=` (only the bare value) and flushes per line.
pub struct Out<'a> {
    w: &'a mut dyn Write,
    quiet: bool,
}

impl<'a> Out<'a> {
    /// Output to `w`; with `quiet`, only [`Out::value`] prints.
    pub fn new(w: &'a mut dyn Write, quiet: bool) -> Out<'a> {
        Out { w, quiet }
    }

    /// Normal text.
    pub fn text(&mut self, s: &str) {
        if !self.quiet {
            let _ = self.w.write_all(s.as_bytes());
        }
    }

    /// A note perftest writes to stderr (its `fprintf(stderr, …)` beside the report): there,
    /// after what stdout holds so far; not with `--output=` (nor from the loopback server,
    /// whose output is discarded).
    pub fn text_err(&mut self, s: &str) {
        if !self.quiet {
            let _ = self.w.flush();
            eprint!("{s}");
        }
    }

    /// The `--output=` value.
    pub fn value(&mut self, s: &str) {
        if self.quiet {
            let _ = self.w.write_all(s.as_bytes());
        }
    }

    /// Pushes what was written to the terminal or pipe.
    pub fn flush(&mut self) {
        let _ = self.w.flush();
    }

    /// The parser's notes, printed before anything else.
    pub fn notes(&mut self, p: &Params) {
        for n in &p.notes {
            self.text(n);
        }
    }
}
