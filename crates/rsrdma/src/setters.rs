//! Chained setters for option structs.
//!
//! Option structs are `#[non_exhaustive]` so that a new field is not a breaking change; users
//! outside this crate then cannot write struct literals, so each field gets a setter of the
//! same name: `ConnectOptions::default().port(2).gid_index(3)`. Fields stay public for reading
//! and for plain assignment.

/// `setters!(Type { field: FieldType, ... })` generates `pub fn field(mut self, v: impl
/// Into<FieldType>) -> Self` for each field.
macro_rules! setters {
    ($ty:ident { $($(#[$doc:meta])* $field:ident : $fty:ty),* $(,)? }) => {
        impl $ty {
            $(
                $(#[$doc])*
                #[must_use]
                pub fn $field(mut self, v: impl Into<$fty>) -> Self {
                    self.$field = v.into();
                    self
                }
            )*
        }
    };
}

pub(crate) use setters;
