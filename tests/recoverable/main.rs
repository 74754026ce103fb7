//! Recoverable and bounded deletion (issue 29)

#[path = "../support/mod.rs"]
mod support;

mod budget;
