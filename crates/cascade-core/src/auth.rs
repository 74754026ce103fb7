//! Who asks, and whether they may: the vocabulary every region authorizes
//! in (seed 000's tenants and Kubernetes RBAC's verb × kind × namespace).
//!
//! The core never authenticates anyone: the shell turns a certificate, a
//! token or a JWT into a [`Principal`] and hands it in. The core asks an
//! [`Authorize`] (the shell's policy engine) whether that principal may do
//! a [`Verb`] to a resource, so that a cascade reaching a member its caller
//! may not delete is held, with the reason, rather than carried out.
//! Deciding is pure (the policy in force is data), so steps stay
//! deterministic for a given policy.

use serde::{Deserialize, Serialize};

/// How a principal proved who it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Via {
    /// A TLS client certificate (its SAN: a DNS name or a URI such as a SPIFFE id).
    Certificate,
    /// A bearer JWT verified against the node's JWKS file.
    Jwt,
    /// A static token from the node's tokens file.
    Token,
    /// Authentication is off (`[auth] mode = "none"`): nobody was asked.
    Unauthenticated,
}

impl Via {
    /// Its name in the audit log, status and errors.
    pub fn as_str(self) -> &'static str {
        match self {
            Via::Certificate => "certificate",
            Via::Jwt => "jwt",
            Via::Token => "token",
            Via::Unauthenticated => "unauthenticated",
        }
    }

    /// Parses [`Via::as_str`].
    pub fn parse(text: &str) -> Option<Via> {
        Some(match text {
            "certificate" => Via::Certificate,
            "jwt" => Via::Jwt,
            "token" => Via::Token,
            "unauthenticated" => Via::Unauthenticated,
            _ => return None,
        })
    }
}

/// An authenticated caller: a user or a service, never a region (regions
/// act as themselves only on the Peer service, and vouch for a principal).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Principal {
    /// Its id: a certificate's SAN, a JWT's `sub`, a token's name.
    pub id: String,
    /// Its groups: from the JWT's groups claim or the tokens file.
    pub groups: Vec<String>,
    /// How it proved it.
    pub via: Via,
}

/// The id of the principal of a node that authenticates nobody.
pub const ANONYMOUS: &str = "anonymous";

impl Principal {
    /// The caller of a node that authenticates nobody (`[auth] mode = "none"`).
    pub fn anonymous() -> Principal {
        Principal {
            id: ANONYMOUS.to_owned(),
            groups: Vec::new(),
            via: Via::Unauthenticated,
        }
    }

    /// Whether it is [`Principal::anonymous`].
    pub fn is_anonymous(&self) -> bool {
        self.via == Via::Unauthenticated
    }
}

/// The anonymous principal: what a record written before principals were
/// stored, or a request without one, acts for.
impl Default for Principal {
    fn default() -> Self {
        Principal::anonymous()
    }
}

impl std::fmt::Display for Principal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.id, self.via.as_str())
    }
}

/// What a principal asks to do. A policy names these as actions
/// (`Action::"delete"`, `Action::"admin.force_purge"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Verb {
    /// Read one resource (Get, ExplainDeletion, GetOperation).
    Get,
    /// List resources (List, ListReferences).
    List,
    /// Watch events (Watch, WatchOperation).
    Watch,
    /// Create a resource.
    Create,
    /// Update a resource; also what an `unset` reference of a cascade and
    /// an orphan delete do to each referrer they change.
    Update,
    /// Delete a resource; also what a cascade does to each member it deletes.
    Delete,
    /// Start a cascade from a resource (a Delete with `cascade`).
    Cascade,
    /// Delete a resource leaving its `cascade` referrers alive (a Delete with `orphan`).
    Orphan,
    /// Add or remove a lien.
    Lien,
    /// Remove a finalizer or report its failure (a finalizer controller).
    Finalize,
    /// Admin.ListDeletions.
    AdminListDeletions,
    /// Admin.RetryDeletion.
    AdminRetryDeletion,
    /// Admin.ForcePurge.
    AdminForcePurge,
    /// Admin.ListAudit.
    AdminListAudit,
    /// Admin.GetClusterStatus.
    AdminClusterStatus,
    /// Admin.CanI asked about another principal (`cascade auth can-i --as`).
    AdminImpersonate,
    /// Admin.Purge: count, sample or delete every resource a filter matches.
    AdminPurge,
    /// PauseOperation, on the operation's root.
    OperationPause,
    /// ResumeOperation, on the operation's root.
    OperationResume,
    /// CancelOperation, on the operation's root.
    OperationCancel,
    /// Admin.ExtendBudget.
    AdminExtendBudget,
    /// Undelete (issue 29), on the deletion's root: take back a
    /// soft-deleting operation in every region it reached.
    Undelete,
    /// Admin.CheckSchema: a schema file checked against the schema in
    /// force and the stored data (issue 31).
    AdminCheckSchema,
}

impl Verb {
    /// Every verb, in a fixed order (policy schemas, docs, tests).
    pub const ALL: [Verb; 23] = [
        Verb::Get,
        Verb::List,
        Verb::Watch,
        Verb::Create,
        Verb::Update,
        Verb::Delete,
        Verb::Cascade,
        Verb::Orphan,
        Verb::Lien,
        Verb::Finalize,
        Verb::AdminListDeletions,
        Verb::AdminRetryDeletion,
        Verb::AdminForcePurge,
        Verb::AdminListAudit,
        Verb::AdminClusterStatus,
        Verb::AdminImpersonate,
        Verb::AdminPurge,
        Verb::OperationPause,
        Verb::OperationResume,
        Verb::OperationCancel,
        Verb::AdminExtendBudget,
        Verb::Undelete,
        Verb::AdminCheckSchema,
    ];

    /// Its name in policies, errors and the audit log.
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Delete => "delete",
            Verb::Cascade => "cascade",
            Verb::Orphan => "orphan",
            Verb::Lien => "lien",
            Verb::Finalize => "finalize",
            Verb::AdminListDeletions => "admin.list_deletions",
            Verb::AdminRetryDeletion => "admin.retry_deletion",
            Verb::AdminForcePurge => "admin.force_purge",
            Verb::AdminListAudit => "admin.list_audit",
            Verb::AdminClusterStatus => "admin.cluster_status",
            Verb::AdminImpersonate => "admin.impersonate",
            Verb::AdminPurge => "admin.purge",
            Verb::OperationPause => "operation.pause",
            Verb::OperationResume => "operation.resume",
            Verb::OperationCancel => "operation.cancel",
            Verb::AdminExtendBudget => "admin.extend_budget",
            Verb::Undelete => "undelete",
            Verb::AdminCheckSchema => "admin.check_schema",
        }
    }

    /// Parses [`Verb::as_str`].
    pub fn parse(text: &str) -> Option<Verb> {
        Verb::ALL.into_iter().find(|v| v.as_str() == text)
    }

    /// Whether it is a call of the Admin service (decided on a region, not a resource).
    pub fn is_admin(self) -> bool {
        self.as_str().starts_with("admin.")
    }
}

impl std::fmt::Display for Verb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a verb is asked on: a resource, or (Admin calls, listings of a
/// whole region) a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target<'a> {
    /// One resource, by its full name `{region}/{kind}/{id}`.
    Resource(&'a crate::ResourceName),
    /// A region as a whole; `kind` narrows a listing to one kind.
    Region {
        /// The region.
        region: &'a crate::RegionId,
        /// The kind listed, if one.
        kind: Option<&'a str>,
    },
}

/// An answer of the policy: allowed or not, and which rule said so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Whether the verb is allowed.
    pub allowed: bool,
    /// The rule that decided: a policy's id, or `default deny` when none
    /// permitted it, or `authentication off` when nobody is asked.
    pub rule: String,
}

impl Decision {
    /// Allowed by `rule`.
    pub fn allow(rule: impl Into<String>) -> Decision {
        Decision {
            allowed: true,
            rule: rule.into(),
        }
    }

    /// Refused by `rule`.
    pub fn deny(rule: impl Into<String>) -> Decision {
        Decision {
            allowed: false,
            rule: rule.into(),
        }
    }
}

/// The policy engine, as the core and the shell ask it. Implementations
/// are cheap to call (no IO; the shell keeps the parsed policy in memory)
/// and deterministic for the policy in force.
pub trait Authorize: Send + Sync {
    /// May `principal` do `verb` to `target`?
    fn decide(&self, principal: &Principal, verb: Verb, target: Target<'_>) -> Decision;

    /// Whether every decision is an allow whatever is asked (authentication
    /// off): callers then skip what exists only to find refusals (the
    /// closure check's walk, the cascade's per-member checks and their
    /// audit entries), so a node without authentication pays nothing.
    fn allows_everything(&self) -> bool {
        false
    }
}

/// Everybody may do everything: a node with authentication off, and tests.
#[derive(Debug, Clone, Copy, Default)]
pub struct AllowAll;

/// The rule [`AllowAll`] names.
pub const AUTHENTICATION_OFF: &str = "authentication off";

impl Authorize for AllowAll {
    fn decide(&self, _: &Principal, _: Verb, _: Target<'_>) -> Decision {
        Decision::allow(AUTHENTICATION_OFF)
    }

    fn allows_everything(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbs_round_trip_through_their_names() {
        for verb in Verb::ALL {
            assert_eq!(Verb::parse(verb.as_str()), Some(verb));
        }
        assert_eq!(Verb::parse("drop"), None);
        assert!(Verb::AdminForcePurge.is_admin());
        assert!(!Verb::Delete.is_admin());
    }

    #[test]
    fn via_round_trips_through_its_name() {
        for via in [Via::Certificate, Via::Jwt, Via::Token, Via::Unauthenticated] {
            assert_eq!(Via::parse(via.as_str()), Some(via));
        }
    }
}
