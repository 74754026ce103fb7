//! The web console (issue 30): what a cascade across regions looks like
//! while it runs, served by every node on its own listener (`[console]
//! listen`, off by default; README, "The console").
//!
//! **The console is a client of its node's API, never a way around it.**
//! Every page is made of the answers of `cascade.v1.Resources` and
//! `cascade.v1.Admin` calls to this node's own gRPC address, each carrying
//! the browser caller's bearer token (a cookie set by the sign-in form, or
//! the request's own `Authorization: Bearer` header) and nothing else: the
//! console holds no credential of its own and presents no client
//! certificate, so a page shows exactly what its caller may read, the
//! node's authentication, policy and audit decide every call as for the
//! CLI, and a page works through any node because the API does. So this
//! module names nothing of the crate (`tests/architecture.rs`,
//! `the_console_reads_only_through_the_api`): it is a second wire edge
//! beside `api/`, on the client side, and the one other place that knows
//! `cascade.v1` messages (`crates/cascade-node/tests/wire_edge.rs`).
//!
//! - `server.rs`: the listener (HTTP, or HTTPS with the node's own
//!   certificate when the node has `[tls]`), the routes, the embedded
//!   assets and the headers every answer carries (a Content Security
//!   Policy that runs no script but the console's own file).
//! - `context.rs`: what every handler shares, and the checks of ids,
//!   names and page tokens from a browser.
//! - `hosts.rs`: the host a request names must be the console's own (its
//!   address, `localhost`, `[console] allowed_hosts`): no DNS rebinding.
//! - `session.rs`: who the browser is (the token); signing in and out are
//!   routes of `server.rs`.
//! - `backend.rs`: the API calls, each within `CALL_BUDGET`, and what a
//!   page needs of their answers.
//! - `delete.rs`: the dry run of a cascade and its delete button, bound to
//!   the plan shown, shown only when the API's dry run says the caller
//!   may delete, and taken only from the console's own page (`Origin`).
//! - `pages.rs` and `pages/`: the HTML (maud: compile-time checked, every
//!   value escaped); `live.rs`: server-sent events that re-render a page's
//!   live part as the operation moves.
//! - `error.rs`: `ConsoleError`, the one mapping from an API refusal to
//!   an HTTP status and a page that says what to do.

mod backend;
mod cluster;
mod context;
mod delete;
mod error;
mod hosts;
mod live;
mod pages;
mod server;
mod session;

pub(crate) use server::{serve, ConsoleSetup};

// Its limits, for the table of every limit (`api/limits.rs`).
pub(crate) use backend::{
    CALL_BUDGET, DELETIONS_PER_REGION, HISTORY_PAGE, OPERATIONS_SHOWN, OUTCOMES_PAGE, REFERENCES_PAGE,
};
pub(crate) use live::{LIVE_EVERY, MAX_LIVE_STREAMS};
pub(crate) use pages::MAX_TREE_MEMBERS;
pub(crate) use session::MAX_TOKEN_BYTES;
