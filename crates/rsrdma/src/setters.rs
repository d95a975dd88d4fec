//! Chained setters for option structs.
//!
//! Option structs are `#[non_exhaustive]` so that a new field is not a breaking change; users
//! outside this crate then cannot write struct literals, so each field gets a setter of the
//! same name: `ConnectOptions::default().port(2).gid_index(3)`. Fields stay public for reading
//! and for plain assignment.

/// `setters!(Type { field: FieldType, opt: Option<Inner>, ... })` generates `pub fn
/// field(mut self, v: FieldType) -> Self` for each field; an `Option` field's setter takes
/// `impl Into<Option<Inner>>`, so `gid_index(3)` and `gid_index(None)` both read well.
macro_rules! setters {
    ($ty:ident { $($(#[$doc:meta])* $field:ident : $($fty:ident)::+ $(<$inner:ty>)?),* $(,)? }) => {
        impl $ty {
            $(
                $crate::setters::setters!(@one $(#[$doc])* $field : $($fty)::+ $(<$inner>)?);
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
    (@one $(#[$doc:meta])* $field:ident : $($fty:ident)::+) => {
        $(#[$doc])*
        #[must_use]
        pub fn $field(mut self, v: $($fty)::+) -> Self {
            self.$field = v;
            self
        }
    };
}

pub(crate) use setters;
