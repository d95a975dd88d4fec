//! The crate's error type. Every failure ends a run with a message on stderr; most exit 1, as
//! perftest does.

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can end a run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A message printed exactly as given (perftest's own wording), then exit 1.
    #[error("{0}")]
    Perftest(String),
    /// The TCP exchange failed (peer gone, short read, time-out).
    #[error("{0}")]
    Oob(String),
    /// The peer sent something that is not perftest's protocol.
    #[error("{0}")]
    Protocol(String),
    /// The two ends were started with options that cannot work together.
    #[error(" Option mismatch between the two ends: {option}: this side {mine}, peer {theirs}\n Please run both sides with the same options.")]
    Mismatch {
        /// The option, e.g. "-s (message size)".
        option: String,
        /// This side's value.
        mine: String,
        /// The peer's value.
        theirs: String,
    },
    /// A verbs call failed.
    #[error("{context}: {source}")]
    Rdma {
        /// What was being done.
        context: String,
        /// The verbs error.
        #[source]
        source: rsrdma::Error,
    },
    /// The data path made no progress.
    #[error("{0}")]
    Stalled(String),
    /// A feature of perftest that the rs tools do not implement.
    #[error(" {0} is not supported by the rs_* tools")]
    Unsupported(&'static str),
}

impl Error {
    /// Wraps a verbs error with what was being done.
    pub fn rdma(context: impl Into<String>, source: rsrdma::Error) -> Error {
        Error::Rdma {
            context: context.into(),
            source,
        }
    }
}

/// Adds context to verbs results.
pub(crate) trait Ctx<T> {
    fn ctx(self, what: &str) -> Result<T>;
}

impl<T> Ctx<T> for rsrdma::Result<T> {
    fn ctx(self, what: &str) -> Result<T> {
        self.map_err(|e| Error::rdma(what, e))
    }
}
