//! A rule as a check names it: by name (a configured rule) or inline (its parameters).

use ringlimit_proto::{InlineRule, RuleRef};

/// The rule a check names, borrowed from the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleSpec<'a> {
    Named(&'a str),
    Inline(InlineRule),
}

impl<'a> RuleSpec<'a> {
    /// The rule a peer's check names.
    pub fn of(r: &'a RuleRef) -> Self {
        match r {
            RuleRef::Named(name) => RuleSpec::Named(name),
            RuleRef::Inline(r) => RuleSpec::Inline(*r),
        }
    }

    /// This rule as a check travels to its owner.
    pub fn to_ref(self) -> RuleRef {
        match self {
            RuleSpec::Named(name) => RuleRef::Named(name.to_owned()),
            RuleSpec::Inline(r) => RuleRef::Inline(r),
        }
    }

    /// The rule's name; `None` for an inline rule.
    pub fn name(self) -> Option<&'a str> {
        match self {
            RuleSpec::Named(name) => Some(name),
            RuleSpec::Inline(_) => None,
        }
    }
}
