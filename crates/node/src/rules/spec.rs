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

    /// The name its keys are counted under in the top keys: a named rule's name, an inline
    /// rule's policy name (as its `RateLimit-Policy` header says it).
    pub fn policy_name(self) -> std::borrow::Cow<'a, str> {
        match self {
            RuleSpec::Named(name) => name.into(),
            RuleSpec::Inline(r) => ringlimit_core::headers::inline_policy_name(&r).into(),
        }
    }
}
