//! The set operations every flag type of the verbs layer has ([`crate::AccessFlags`],
//! [`crate::SendOps`], [`crate::cq_ex::WcFields`]): written once, so the three cannot drift.

/// `flag_set!(Type, raw)` for `struct Type(raw)`: `bits`, `contains`, `|` and `|=`.
macro_rules! flag_set {
    ($t:ident, $raw:ty) => {
        impl $t {
            /// The raw bits.
            pub fn bits(self) -> $raw {
                self.0
            }

            /// Whether every flag of `other` is set here.
            pub fn contains(self, other: $t) -> bool {
                self.0 & other.0 == other.0
            }
        }

        impl std::ops::BitOr for $t {
            type Output = $t;
            fn bitor(self, rhs: $t) -> $t {
                $t(self.0 | rhs.0)
            }
        }

        impl std::ops::BitOrAssign for $t {
            fn bitor_assign(&mut self, rhs: $t) {
                self.0 |= rhs.0;
            }
        }
    };
}

pub(crate) use flag_set;
