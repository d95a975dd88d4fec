//! clap value parsers that answer in perftest's words. A bad value stops clap with perftest's
//! message (` Iteration num should be between 5 and 100000000`); [`super::parse`] prints it
//! with perftest's trailer.

use super::params::Conn;
use crate::Verb;
use clap::builder::TypedValueParser;
use clap::error::{ContextKind, ErrorKind};
use clap::{Arg, Command, ValueEnum};
use std::ffi::OsStr;
use std::marker::PhantomData;

/// A value error that carries perftest's message as it is.
fn perftest_error(msg: String) -> clap::Error {
    clap::Error::raw(ErrorKind::ValueValidation, msg)
}

/// The perftest message of an error made by one of these parsers, or `None` for clap's own
/// errors (unknown flags, missing values), which perftest reports as getopt does.
pub(super) fn perftest_message(e: &clap::Error) -> Option<String> {
    // clap's own errors carry context (the argument, the value); the raw ones made here none.
    if e.kind() != ErrorKind::ValueValidation || e.get(ContextKind::InvalidArg).is_some() {
        return None;
    }
    let text = e.to_string();
    Some(text.trim_end().trim_start_matches("error: ").to_string())
}

/// The flag as the user would write it: `-n`, or `--tclass` for long-only options.
fn flag_name(arg: Option<&Arg>) -> String {
    match arg {
        Some(a) => match (a.get_short(), a.get_long()) {
            (Some(c), _) => format!("-{c}"),
            (None, Some(l)) => format!("--{l}"),
            (None, None) => a.get_id().to_string(),
        },
        None => "?".into(),
    }
}

/// A decimal number; with `suffixes`, K, M or G multiply by 2^10, 2^20, 2^30 (perftest's `-s`).
fn number(v: &str, suffixes: bool) -> Option<u64> {
    let (digits, mult) = match v.chars().last() {
        Some('K' | 'k') if suffixes => (&v[..v.len() - 1], 1u64 << 10),
        Some('M' | 'm') if suffixes => (&v[..v.len() - 1], 1 << 20),
        Some('G' | 'g') if suffixes => (&v[..v.len() - 1], 1 << 30),
        _ => (v, 1),
    };
    digits.parse::<u64>().ok()?.checked_mul(mult)
}

/// A number in `lo..=hi`, out of range reported as perftest does (`{what} should be between
/// {lo} and {hi}`), converted to the field's type `T`.
#[derive(Debug)]
pub(super) struct Ranged<T> {
    lo: u64,
    hi: u64,
    what: &'static str,
    suffixes: bool,
    into: PhantomData<fn() -> T>,
}

// Derived Clone/Copy would require T: Clone.
impl<T> Clone for Ranged<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Ranged<T> {}

impl<T> Ranged<T> {
    /// `lo..=hi`, named `what` in the message.
    pub(super) const fn new(lo: u64, hi: u64, what: &'static str) -> Ranged<T> {
        Ranged {
            lo,
            hi,
            what,
            suffixes: false,
            into: PhantomData,
        }
    }

    /// Also takes K/M/G suffixes.
    pub(super) const fn with_suffixes(mut self) -> Ranged<T> {
        self.suffixes = true;
        self
    }

    /// The largest value taken.
    pub(super) const fn hi(&self) -> u64 {
        self.hi
    }

    /// perftest's range message.
    pub(super) fn out_of_range(&self) -> String {
        format!(
            "{} should be between {} and {}",
            self.what, self.lo, self.hi
        )
    }
}

impl<T: TryFrom<u64> + Clone + Send + Sync + 'static> TypedValueParser for Ranged<T> {
    type Value = T;

    fn parse_ref(
        &self,
        _cmd: &Command,
        arg: Option<&Arg>,
        value: &OsStr,
    ) -> Result<T, clap::Error> {
        let text = value.to_string_lossy();
        let text = text.trim();
        let n = number(text, self.suffixes).ok_or_else(|| {
            perftest_error(format!(
                "Invalid value '{text}' for option {}",
                flag_name(arg)
            ))
        })?;
        if n < self.lo || n > self.hi {
            return Err(perftest_error(self.out_of_range()));
        }
        T::try_from(n).map_err(|_| perftest_error(self.out_of_range()))
    }
}

/// `-c`: the transports the tool's verb runs over.
#[derive(Debug, Clone, Copy)]
pub(super) struct ConnOf(pub(super) Verb);

impl TypedValueParser for ConnOf {
    type Value = Conn;

    fn parse_ref(
        &self,
        _cmd: &Command,
        _arg: Option<&Arg>,
        value: &OsStr,
    ) -> Result<Conn, clap::Error> {
        let text = value.to_string_lossy();
        match Conn::from_str(&text, false) {
            Ok(c) if c.carries(self.0) => Ok(c),
            _ => Err(perftest_error(format!(
                "Connection type {text} is not supported by this test (supported: {})",
                match self.0 {
                    Verb::Send => "RC, UC, UD",
                    Verb::Write => "RC, UC",
                    Verb::Read | Verb::Atomic => "RC",
                }
            ))),
        }
    }
}

/// One of a [`ValueEnum`]'s names; anything else gets perftest's fixed `complaint`.
#[derive(Debug)]
pub(super) struct Named<E> {
    complaint: &'static str,
    of: PhantomData<fn() -> E>,
}

impl<E> Clone for Named<E> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<E> Copy for Named<E> {}

impl<E> Named<E> {
    /// Names of `E`, else `complaint`.
    pub(super) const fn new(complaint: &'static str) -> Named<E> {
        Named {
            complaint,
            of: PhantomData,
        }
    }
}

impl<E: ValueEnum + Clone + Send + Sync + 'static> TypedValueParser for Named<E> {
    type Value = E;

    fn parse_ref(
        &self,
        _cmd: &Command,
        _arg: Option<&Arg>,
        value: &OsStr,
    ) -> Result<E, clap::Error> {
        E::from_str(&value.to_string_lossy(), false)
            .map_err(|_| perftest_error(self.complaint.to_string()))
    }
}
