//! Rules through the admin API: write, delete, read one, and how the admin listing shows where
//! each rule in force came from.

use super::Admin;
use crate::rules::api::Entry;
use crate::rules::book::ChangeError;
use ringlimit_core::clock::unix_ms;
use ringlimit_proto::discovery::RuleInfo;
use serde::Serialize;

/// A rule as `GET /v1/admin/rules` lists it: its fields, where it came from, and for an API
/// rule, the version of its last change.
#[derive(Debug, Clone, Serialize)]
pub struct AdminRule {
    #[serde(flatten)]
    pub info: RuleInfo,
    /// `file` (the rules file, or built in) or `api`.
    pub source: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub updated_at_ms: Option<u64>,
    /// The node that made the last change.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub updated_by: Option<String>,
}

/// A change's version as the API shows it: `ms.counter.node`, ordered as the versions are.
fn version(e: &Entry) -> String {
    format!("{}.{}.{}", e.version.ms, e.version.counter, e.version.node)
}

impl Admin {
    /// Every rule in force with its source.
    pub fn admin_rule_list(&self) -> Vec<AdminRule> {
        let api = self.book.api_in_force();
        self.here
            .engine()
            .rules()
            .iter()
            .map(|r| {
                let entry = api.get(&r.name);
                AdminRule {
                    info: r.info(),
                    source: if entry.is_some() { "api" } else { "file" },
                    version: entry.map(version),
                    updated_at_ms: entry.map(|e| e.version.ms),
                    updated_by: entry.map(|e| e.version.node.clone()),
                }
            })
            .collect()
    }

    /// One rule in force, as listed; `None` when no rule has that name.
    pub fn admin_rule(&self, name: &str) -> Option<AdminRule> {
        self.admin_rule_list()
            .into_iter()
            .find(|r| r.info.name == name)
    }

    /// Creates or replaces API rule `name`; `who` names the caller in the log.
    pub fn put_rule(
        &self,
        name: &str,
        spec: serde_json::Value,
        who: &str,
    ) -> Result<AdminRule, ChangeError> {
        let entry = self.book.put(name, spec.clone(), unix_ms())?;
        tracing::info!(rule = %name, %who, version = %version(&entry), fields = %spec, "API rule written");
        self.admin_rule(name)
            .ok_or_else(|| ChangeError::NotFound(name.to_owned()))
    }

    /// Deletes API rule `name`; `who` names the caller in the log.
    pub fn delete_rule(&self, name: &str, who: &str) -> Result<(), ChangeError> {
        let entry = self.book.delete(name, unix_ms())?;
        tracing::info!(rule = %name, %who, version = %version(&entry), "API rule deleted");
        Ok(())
    }
}
