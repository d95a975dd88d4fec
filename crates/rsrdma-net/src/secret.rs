//! [`Secret`]: a shared secret's bytes, which `Debug` never shows. Options structs are
//! printed and logged (`{:?}` of a `ConnOptions` in an error report, a `tracing` field), and
//! a secret must not travel with them.

use crate::error::{NetError, Result};
use rsrdma::IntoOption;
use std::fmt;
use std::io::Read;
use std::ops::Deref;

/// A shared secret (see [`crate::ConnOptions::secret`]). Dereferences to its bytes; its
/// `Debug` shows only its length.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl Secret {
    /// A secret of these bytes.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Secret {
        Secret(bytes.into())
    }

    /// The secret in the file at `path`, without its trailing line ends: a file written by
    /// `echo`, `base64` or an editor ends in one, which a peer that read the same file with
    /// this (or `rs_registry --secret-file`) does not count, so both sides agree. (A secret
    /// read with `std::fs::read` keeps it: one side trimming and the other not fails the
    /// proof, an outside tester's find.)
    ///
    /// # Errors
    /// [`NetError::Io`] when the file cannot be read, naming it.
    pub fn from_file(path: impl AsRef<std::path::Path>) -> Result<Secret> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|e| {
            let named = std::io::Error::new(e.kind(), format!("{}: {e}", path.display()));
            NetError::io("read the secret file", named)
        })?;
        Ok(Secret::from_text(bytes))
    }

    /// A secret given as text (a file's contents, an environment variable's), without its
    /// trailing line ends, as [`Secret::from_file`] reads one.
    pub fn from_text(bytes: impl Into<Vec<u8>>) -> Secret {
        let mut bytes = bytes.into();
        while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
            bytes.pop();
        }
        Secret(bytes)
    }

    /// The secret's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// 32 random bytes from the kernel's random source: a secret that meets
    /// [`Secret::MIN_LEN`] with room to spare. Store it where both sides read it (a file only
    /// they can read, a secret store), never in code.
    ///
    /// # Errors
    /// [`NetError::Io`] when `/dev/urandom` cannot be read.
    pub fn generate() -> Result<Secret> {
        let mut key = vec![0u8; 32];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut key))
            .map_err(|e| NetError::io("read /dev/urandom", e))?;
        Ok(Secret(key))
    }

    /// The shortest secret accepted: 16 bytes (128 bits). One proof is all an impostor can
    /// collect; a shorter secret could be guessed from it offline.
    pub const MIN_LEN: usize = crate::handshake::auth::MIN_SECRET_LEN;

    /// Refuses a secret shorter than [`Secret::MIN_LEN`].
    ///
    /// # Errors
    /// [`NetError::InvalidArgument`] naming `whose` secret, the limit and the remedy.
    pub fn check(&self, whose: &str) -> Result<()> {
        crate::handshake::auth::check_secret(&self.0)
            .map_err(|why| NetError::InvalidArgument(format!("{whose}: {why}")))
    }
}

/// Checks an optional secret (see [`Secret::check`]).
pub(crate) fn check_secret(secret: Option<&Secret>, whose: &str) -> Result<()> {
    secret.map_or(Ok(()), |s| s.check(whose))
}

impl Deref for Secret {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret(<{} bytes, redacted>)", self.0.len())
    }
}

impl From<Vec<u8>> for Secret {
    fn from(v: Vec<u8>) -> Secret {
        Secret(v)
    }
}

impl From<&[u8]> for Secret {
    fn from(v: &[u8]) -> Secret {
        Secret(v.to_vec())
    }
}

impl From<&str> for Secret {
    fn from(v: &str) -> Secret {
        Secret(v.as_bytes().to_vec())
    }
}

// What an options setter takes for a secret: the bytes as a caller has them.
impl IntoOption<Secret> for Vec<u8> {
    fn into_option(self) -> Option<Secret> {
        Some(Secret(self))
    }
}

impl IntoOption<Secret> for &[u8] {
    fn into_option(self) -> Option<Secret> {
        Some(Secret(self.to_vec()))
    }
}

impl<const N: usize> IntoOption<Secret> for &[u8; N] {
    fn into_option(self) -> Option<Secret> {
        Some(Secret(self.to_vec()))
    }
}

impl IntoOption<Secret> for &Vec<u8> {
    fn into_option(self) -> Option<Secret> {
        Some(Secret(self.clone()))
    }
}

impl IntoOption<Secret> for &str {
    fn into_option(self) -> Option<Secret> {
        Some(Secret(self.as_bytes().to_vec()))
    }
}

#[cfg(test)]
mod tests {
    use crate::registry::{ClientOptions, RegistryOptions};
    use crate::{ConnOptions, RawOptions, Secret};

    /// A secret file's trailing line ends are not the secret's, as `rs_registry
    /// --secret-file` reads them: one file read by both sides agrees.
    #[test]
    fn a_secret_file_loses_its_trailing_line_ends_only() {
        let dir = std::env::temp_dir().join(format!("rsrdma-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("secret");
        for (written, want) in [
            (&b"0123456789abcdef0123\n"[..], &b"0123456789abcdef0123"[..]),
            (b"0123456789abcdef0123\r\n", b"0123456789abcdef0123"),
            (b"0123456789\nabcdef", b"0123456789\nabcdef"),
        ] {
            std::fs::write(&path, written).unwrap();
            assert_eq!(Secret::from_file(&path).unwrap().as_bytes(), want);
        }
        // One that cannot be read is named (a program reading several could not tell which).
        let none = dir.join("none");
        let missing = Secret::from_file(&none).unwrap_err();
        let text = missing.to_string();
        assert!(text.contains("secret file"), "{text}");
        assert_eq!(text.matches(&*none.to_string_lossy()).count(), 1, "{text}");
        assert_eq!(missing.io_kind(), std::io::ErrorKind::NotFound);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn no_options_debug_shows_a_secret() {
        let key = b"hunter2-hunter2-";
        let shown = [
            format!("{:?}", ConnOptions::default().secret(key)),
            format!("{:?}", RawOptions::default().secret(key.to_vec())),
            format!("{:?}", RegistryOptions::default().secret(&key[..])),
            format!("{:?}", ClientOptions::default().secret("hunter2-hunter2-")),
        ];
        for s in &shown {
            assert!(!s.contains("hunter2"), "{s}");
            assert!(!s.contains("104, 117"), "the bytes as numbers: {s}");
            assert!(s.contains("Secret(<16 bytes, redacted>)"), "{s}");
        }
        let o = ConnOptions::default().secret(key).secret(None);
        assert!(o.secret.is_none());
        let o = ConnOptions::default().secret(Some(crate::Secret::new(&key[..])));
        assert_eq!(o.secret.as_deref(), Some(&key[..]));
    }
}
