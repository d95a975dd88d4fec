//! Chained setters for option structs.
//!
//! Option structs are `#[non_exhaustive]` so that a new field is not a breaking change; users
//! outside the defining crate then cannot write struct literals, so each field gets a setter
//! of the same name: `ConnectOptions::default().port(2).gid_index(3)`. Fields stay public for
//! reading and for plain assignment. `rsrdma-net` uses the same macro for its options.

/// `option_setters!(Type { field: FieldType, opt: Option<Inner>, ... })` generates `pub fn
/// field(mut self, v: FieldType) -> Self` for each field; an `Option` field's setter takes
/// `impl Into<Option<Inner>>`, so `gid_index(3)` and `gid_index(None)` both read well, and a
/// plain field takes its own type, so integer literals need no suffix.
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
        pub fn $field(mut self, v: impl Into<Option<$inner>>) -> Self {
            self.$field = v.into();
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
