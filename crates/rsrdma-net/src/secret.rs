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
    use crate::{ConnOptions, RawOptions};

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
