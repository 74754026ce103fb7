//! The pure core of Cascade: identity, schema, resource model and the
//! deletion protocol of one region, as functions from state and command to
//! writes and events. No IO, no async, no clock: the node crate is the shell
//! that stores, serves and schedules.
//!
//! # Layout
//!
//! - [`auth`]: principals, verbs and the policy engine the core asks.
//! - [`name`]: region ids, resource names `{region}/{kind}/{id}`, uids.
//! - [`schema`]: kinds and their references with `on_delete` behaviour, loaded from TOML.
//! - [`model`]: the records a node keeps (resources, back-references,
//!   deletion records, operations, outcomes, retry queue, events).
//! - [`state`]: the read trait a snapshot implements, the read-your-writes
//!   overlay, and the write set a step produces.
//! - [`protocol`]: create, update, delete (with dry run) and the deletion
//!   work loop.
//! - [`peer`]: the cross-region half: attach/release at the owner, deletion
//!   events, CREATING resources and releases at the importer.
//! - [`plan`]: the cross-region dry run: region parts re-planned to a
//!   fixpoint and merged.
//! - [`operation_view`]: one operation from every region's parts: what to
//!   read where, counters summed, outcomes paged across the parts.
//! - [`closure`]: whether a cascade is finished in every region it
//!   touched, asked of those regions only (a double collect along
//!   `reached`).
//! - [`request_path`]: a refused reference named as the client's request
//!   named it, whichever region refused it.
//! - [`selector`]: a listing's attribute selector (the Kubernetes
//!   label-selector grammar), parsed and matched.
//! - [`listing`]: a listing of every region: each region's position and
//!   one merged page from their answers.
//! - [`memory`]: an in-memory state for tests and model checking.
//! - [`error`]: protocol errors with their status class.
//! - [`limits`]: the size of every field a request carries or a node
//!   stores, and [`limits::quote`], how an error quotes client input.
//! - [`invariants`]: the invariant checker over every region's state.
//! - [`time_text`]: durations (`3m 4s`) and RFC 3339 instants in the
//!   messages the core composes.

#![deny(missing_docs)]

pub mod auth;
pub mod closure;
pub mod error;
pub mod explain;
pub mod history;
pub mod invariants;
pub mod limits;
pub mod listing;
pub mod memory;
pub mod model;
pub mod name;
pub mod operation_view;
pub mod peer;
pub mod plan;
pub mod protocol;
pub mod request_path;
pub mod schema;
pub mod selector;
pub mod state;
pub mod time_text;

pub use error::{CoreError, ErrorCode};
pub use model::*;
pub use name::{IdSource, OperationId, RegionId, ResourceName, SequentialIds, Uid};
pub use protocol::{Ctx, DeleteOutcome, DeleteRequest, Plan, Policy, RefRequest, ResourceSpec, Step};
pub use schema::{OnDelete, Schema, SchemaError};
