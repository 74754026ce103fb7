//! Who may delete what, over real nodes (issue 27): client identities
//! (certificates, JWTs, static tokens), the policy each region decides
//! with, a cascade checked over its whole closure before anything changes,
//! and the audit log of every change and refusal.
//!
//! One test binary with a module per part, so the suite links once.

#[path = "../support/mod.rs"]
mod support;

mod across_regions;
mod audit;
mod authentication;
mod closure;
mod policy;
