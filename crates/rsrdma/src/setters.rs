//! Chained setters for option structs.
//!
//! Option structs are `#[non_exhaustive]` so that a new field is not a breaking change; users
//! outside the defining crate then cannot write struct literals, so each field gets a setter
//! of the same name: `ConnectOptions::default().port(2).gid_index(3)`. Fields stay public for
//! reading and for plain assignment. `rsrdma-net` uses the same macro for its options.

/// `option_setters!(Type { field: FieldType, opt: Option<Inner>, ... })` generates `pub fn
/// field(mut self, v: FieldType) -> Self` for each field; an `Option` field's setter takes
/// `impl IntoOption<Inner>`, so `gid_index(3)`, `gid_index(None)`, `device("mlx5_0")` and
/// `secret(b"...")` all read well, and a plain field takes its own type, so integer literals
/// need no suffix.
#[doc(hidden)]
#[macro_export]
macro_rules! option_setters {
    ($ty:ident { $($(#[$doc:meta])* $field:ident : $($fty:ident)::+ $(<$inner:ty>)?),* $(,)? }) => {
        impl $ty {
            $(
                $crate::option_setters!(@one $(#[$doc])* $field : $($fty)::+ $(<$inner>)?);
            )*
        }
    };
    (@one $(#[$doc:meta])* $field:ident : Option<$inner:ty>) => {
        $(#[$doc])*
        #[must_use]
        pub fn $field(mut self, v: impl $crate::IntoOption<$inner>) -> Self {
            self.$field = v.into_option();
            self
        }
    };
    (@one $(#[$doc:meta])* $field:ident : $($fty:ident)::+ $(<$inner:ty>)?) => {
        $(#[$doc])*
        #[must_use]
        pub fn $field(mut self, v: $($fty)::+ $(<$inner>)?) -> Self {
            self.$field = v;
            self
        }
    };
}

pub(crate) use option_setters as setters;

/// A value an option setter takes for an `Option<T>` field: `T` itself, `Option<T>` (`None`
/// clears it), and the borrowed forms a caller has at hand: `&str` for a `String` (a device
/// name: `.device("mlx5_0")`), and `&[u8]`, `&[u8; N]` or `&Vec<u8>` for bytes (a secret:
/// `.secret(b"...")`).
pub trait IntoOption<T> {
    /// The field's new value.
    fn into_option(self) -> Option<T>;
}

impl<T> IntoOption<T> for T {
    fn into_option(self) -> Option<T> {
        Some(self)
    }
}

impl<T> IntoOption<T> for Option<T> {
    fn into_option(self) -> Option<T> {
        self
    }
}

impl IntoOption<String> for &str {
    fn into_option(self) -> Option<String> {
        Some(self.to_owned())
    }
}

impl IntoOption<String> for &String {
    fn into_option(self) -> Option<String> {
        Some(self.clone())
    }
}

impl IntoOption<Vec<u8>> for &[u8] {
    fn into_option(self) -> Option<Vec<u8>> {
        Some(self.to_vec())
    }
}

impl<const N: usize> IntoOption<Vec<u8>> for &[u8; N] {
    fn into_option(self) -> Option<Vec<u8>> {
        Some(self.to_vec())
    }
}

impl IntoOption<Vec<u8>> for &Vec<u8> {
    fn into_option(self) -> Option<Vec<u8>> {
        Some(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::IntoOption;

    #[derive(Default)]
    struct Opts {
        device: Option<String>,
        secret: Option<Vec<u8>>,
        gid_index: Option<u8>,
        depth: u32,
    }

    option_setters!(Opts {
        device: Option<String>,
        secret: Option<Vec<u8>>,
        gid_index: Option<u8>,
        depth: u32,
    });

    #[test]
    fn setters_take_what_a_caller_has_at_hand() {
        let name = String::from("rxe0");
        let key = vec![1u8, 2];
        let o = Opts::default()
            .device("mlx5_0")
            .secret(b"shared")
            .gid_index(3)
            .depth(8);
        assert_eq!(o.device.as_deref(), Some("mlx5_0"));
        assert_eq!(o.secret.as_deref(), Some(&b"shared"[..]));
        assert_eq!((o.gid_index, o.depth), (Some(3), 8));
        let o = o.device(&name).secret(&key).gid_index(None);
        assert_eq!((o.device.as_deref(), o.gid_index), (Some("rxe0"), None));
        assert_eq!(o.secret, Some(key.clone()));
        let o = o
            .device(None)
            .secret(None)
            .device(Some(name.clone()))
            .secret(&key[..1]);
        assert_eq!(o.device, Some(name));
        assert_eq!(o.secret.as_deref(), Some(&[1u8][..]));
        assert_eq!("x".into_option(), Some(String::from("x")));
    }
}
