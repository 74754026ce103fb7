//! Every limit a node enforces, with its default and the key that changes
//! it: the rows of README's "Limits" table, which `tests/limits.rs` checks
//! against [`limits`], so a limit changed in the code without the table
//! (or the table without the code) fails a test.
//!
//! Why here: each limit lives beside the code it bounds (request fields in
//! the core's `limits.rs`, what an operator tunes in `config.rs`, each
//! fan-out's deadline in its module), and the wire edge is the one floor
//! that may name all of them. The values are read from those constants
//! and from the defaults of the settings, never written again here.

use std::fmt;
use std::time::Duration;

use cascade_core::limits as core_limits;

use crate::config::{
    ApiLimits, DEFAULT_CHECK_INTERVAL, DEFAULT_FORCE_PURGE_AFTER_MS, DEFAULT_OUTBOX_RETENTION, DEFAULT_TICK,
};
use crate::peers::{LinkTimings, PEER_CALL_TIMEOUT, WATCH_HEARTBEAT};

/// One limit, as one row of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    /// What it belongs to: `request`, `error`, `page`, `stored`, `fan-out`,
    /// `stream`, `deletion`, `link`, `store`, `schema`, `auth`.
    pub area: &'static str,
    /// What is limited, in the table's words.
    pub what: &'static str,
    /// Its default.
    pub default: Amount,
    /// The configuration key that changes it (`[limits] max_page_size`),
    /// or empty when it is fixed.
    pub key: &'static str,
}

/// A limit's size: how it reads in the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Amount {
    /// `160 bytes`, `4 KiB`, `16 MiB`.
    Bytes(u64),
    /// `64 characters`.
    Chars(u64),
    /// `1,000`.
    Items(u64),
    /// `10 a second`.
    PerSecond(u64),
    /// `100 ms`, `2 s`, `1 h`.
    Time(Duration),
    /// `off`: a limit that is not applied unless configured.
    Off,
}

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const KIB: u64 = 1024;
        const MIB: u64 = 1024 * 1024;
        match *self {
            Amount::Bytes(n) if n >= MIB && n % MIB == 0 => write!(f, "{} MiB", n / MIB),
            Amount::Bytes(n) if n >= KIB && n % KIB == 0 && n != KIB => write!(f, "{} KiB", n / KIB),
            Amount::Bytes(n) => write!(f, "{} bytes", grouped(n)),
            Amount::Chars(n) => write!(f, "{} characters", grouped(n)),
            Amount::Items(n) => f.write_str(&grouped(n)),
            Amount::PerSecond(n) => write!(f, "{} a second", grouped(n)),
            Amount::Off => f.write_str("off"),
            Amount::Time(d) => {
                let ms = d.as_millis();
                if ms < 1000 || ms % 1000 != 0 {
                    write!(f, "{ms} ms")
                } else if ms % 86_400_000 == 0 && ms >= 2 * 86_400_000 {
                    write!(f, "{} d", ms / 86_400_000)
                } else if ms % 3_600_000 == 0 {
                    write!(f, "{} h", ms / 3_600_000)
                } else {
                    write!(f, "{} s", ms / 1000)
                }
            }
        }
    }
}

/// `1000000` as `1,000,000`.
fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn bytes(n: usize) -> Amount {
    Amount::Bytes(n as u64)
}

fn items(n: usize) -> Amount {
    Amount::Items(n as u64)
}

fn ms(n: u64) -> Amount {
    Amount::Time(Duration::from_millis(n))
}

/// Every limit of a node with its default settings, in the table's order.
pub fn limits() -> Vec<Limit> {
    let api = ApiLimits::default();
    let policy = cascade_core::Policy::default();
    let links = LinkTimings::default();
    let row = |area, what, default, key| Limit {
        area,
        what,
        default,
        key,
    };
    vec![
        // What one request may carry (checked before anything is stored or forwarded).
        row("request", "a gRPC message, either way", bytes(api.max_message_bytes), "[limits] max_message_bytes"),
        row("request", "resources per BatchCreate; back-references per peer call", items(api.max_batch_create), "[limits] max_batch"),
        row("request", "resource name (region/kind/id)", bytes(core_limits::MAX_NAME_BYTES), ""),
        row("request", "region id", bytes(core_limits::MAX_REGION_BYTES), ""),
        row("request", "kind; reference field name", bytes(core_limits::MAX_KIND_BYTES), ""),
        row("request", "uid; operation id", bytes(core_limits::MAX_UID_BYTES), ""),
        row("request", "etag", bytes(core_limits::MAX_ETAG_BYTES), ""),
        row("request", "requested_by", bytes(core_limits::MAX_REQUESTED_BY_BYTES), ""),
        row("request", "page token", bytes(core_limits::MAX_PAGE_TOKEN_BYTES), ""),
        row("request", "reason (lien, finalizer failure, admin action)", bytes(core_limits::MAX_REASON_BYTES), ""),
        row("request", "attributes per resource", items(core_limits::MAX_ATTRIBUTES), ""),
        row("request", "attribute key", bytes(core_limits::MAX_ATTRIBUTE_KEY_BYTES), ""),
        row("request", "attribute value", bytes(core_limits::MAX_ATTRIBUTE_VALUE_BYTES), ""),
        row("request", "reference fields per resource", items(core_limits::MAX_REF_FIELDS), ""),
        row("request", "targets per reference field", items(core_limits::MAX_TARGETS_PER_FIELD), ""),
        row("request", "finalizers per resource", items(core_limits::MAX_FINALIZERS), ""),
        row("request", "finalizer name", bytes(core_limits::MAX_FINALIZER_BYTES), ""),
        row("request", "liens per resource", items(cascade_core::protocol::MAX_LIENS), ""),
        row("request", "lien id", bytes(core_limits::MAX_LIEN_ID_BYTES), ""),
        row("request", "a back-reference's on_delete (peers)", bytes(core_limits::MAX_ON_DELETE_BYTES), ""),
        row("request", "seeds per Peer.Plan call", items(core_limits::MAX_PLAN_SEEDS), ""),
        row("request", "page token of a List of every region", bytes(core_limits::MAX_LIST_PAGE_TOKEN_BYTES), ""),
        row("request", "List name prefix", bytes(core_limits::MAX_NAME_PREFIX_BYTES), ""),
        row("request", "List attribute selector", bytes(core_limits::MAX_SELECTOR_BYTES), ""),
        row("request", "plan token a delete expects (expect_plan)", bytes(core_limits::MAX_PLAN_TOKEN_BYTES), ""),
        row("request", "requirements per attribute selector", items(cascade_core::selector::MAX_SELECTOR_REQUIREMENTS), ""),
        row("request", "values per in or notin set of an attribute selector", items(cascade_core::selector::MAX_SELECTOR_VALUES), ""),
        // What an error says back.
        row("error", "client input quoted in an error (then its length)", Amount::Chars(core_limits::QUOTED_CHARS as u64), ""),
        row("error", "INVALID_ARGUMENT message", bytes(cascade_proto::status::MAX_INVALID_MESSAGE_BYTES), ""),
        row("error", "INVALID_ARGUMENT field path", bytes(cascade_proto::status::MAX_FIELD_PATH_BYTES), ""),
        row("error", "dependents or blockers listed in a refusal", items(policy.max_listed), ""),
        row("error", "members a PLAN_CHANGED refusal lists (added and removed)", items(cascade_core::plan::MAX_PLAN_CHANGES_LISTED), ""),
        // Pages and scans.
        row("page", "items when the request names no page size", items(api.default_page_size), "[limits] default_page_size"),
        row("page", "items at most (larger asks are cut to it)", items(api.max_page_size), "[limits] max_page_size"),
        row("page", "bytes at most (a quarter of max_message_bytes)", bytes(api.page_bytes()), "[limits] max_message_bytes"),
        row("page", "deletion rows ListDeletions scans per call", items(crate::admin::MAX_SCANNED), ""),
        row("page", "Peer.ListDeleting page (a resync)", Amount::Items(u64::from(crate::api::peer_client::LIST_DELETING_PAGE)), ""),
        row("page", "entries a resync reads from a Peer.ListDeleting listing (more fails it)", items(crate::api::peer_client::MAX_LIST_DELETING_ROWS), ""),
        row("page", "stored rows one List page examines (a page may hold fewer items than asked, even none)", items(crate::listing::MAX_LIST_SCANNED), ""),
        row("page", "resources one Admin.Purge examines in each region (past them its count is a lower bound)", items(api.purge_scan), "[limits] purge_scan"),
        row("page", "events of a GetHistory page when the request names no page size", items(crate::history::HISTORY_PAGE_DEFAULT), ""),
        row("page", "events of a GetHistory page at most (larger asks are cut to it)", items(crate::history::MAX_HISTORY_PAGE), ""),
        row("page", "outbox revisions one GetHistory page examines (a page may hold fewer events than asked, even none)", Amount::Items(crate::history::HISTORY_SPAN), ""),
        row("page", "names in an Admin.Purge's sample", items(cascade_core::protocol::PURGE_SAMPLE), ""),
        row("page", "operations per region in a ListOperations page when the request names no size", items(crate::api::list_operations::DEFAULT_OPERATIONS_PAGE), ""),
        row("page", "operations per region in a ListOperations page at most", items(crate::api::list_operations::MAX_OPERATIONS_PAGE), ""),
        row("page", "stored operations one region examines for a ListOperations page", items(crate::cluster::MAX_OPERATIONS_SCANNED), ""),
        row("page", "why a region was given up, kept in a List page token", bytes(cascade_core::listing::MAX_GIVEN_UP_REASON_BYTES), ""),
        row("page", "rows per table in a Peer.Dump (not paged)", items(crate::node::MAX_DUMP_ROWS), ""),
        row("page", "rows per table a metrics scrape or a status reads", items(crate::metrics::SCRAPE_SCAN_LIMIT), ""),
        // What is stored from a caller without refusing it.
        row("stored", "audit entry: who", bytes(core_limits::MAX_AUDIT_WHO_BYTES), ""),
        row("stored", "audit entry: action", bytes(core_limits::MAX_AUDIT_ACTION_BYTES), ""),
        row("stored", "audit entry: target", bytes(core_limits::MAX_AUDIT_TARGET_BYTES), ""),
        row("stored", "audit entry: reason", bytes(core_limits::MAX_REASON_BYTES), ""),
        row("stored", "audit entry: outcome", bytes(core_limits::MAX_AUDIT_OUTCOME_BYTES), ""),
        row("stored", "refusals a held deletion's reason names (the rest counted)", items(core_limits::MAX_REFUSALS_NAMED), ""),
        row("stored", "refused calls audited", Amount::PerSecond(u64::from(crate::audit::AUDITED_REFUSALS_PER_SECOND)), ""),
        // Calls that gather from other regions, and their deadlines.
        row("fan-out", "a call to another region (unless a caller's deadline is shorter)", Amount::Time(PEER_CALL_TIMEOUT), ""),
        row("fan-out", "a request forwarded to its owner (unless a caller's deadline is shorter)", Amount::Time(crate::api::forward::FORWARD_TIMEOUT), ""),
        row("fan-out", "a List of every region, every region together", Amount::Time(crate::api::listing::LIST_BUDGET), ""),
        row("fan-out", "regions a List of every region asks (more: refused)", items(core_limits::MAX_LIST_REGIONS), ""),
        row("fan-out", "Admin.Purge, every region together (its count, then its start)", Amount::Time(crate::api::admin::PURGE_BUDGET), ""),
        row("fan-out", "ExplainDeletion, every region together", Amount::Time(crate::explain::EXPLAIN_BUDGET), ""),
        row("fan-out", "blockers an explanation looks up", items(crate::explain::MAX_BLOCKER_LOOKUPS), ""),
        row("fan-out", "blocker lookups in flight", items(crate::explain::LOOKUP_CONCURRENCY), ""),
        row("fan-out", "GetOperation: one region's part", Amount::Time(crate::cluster::OPERATION_READ_TIMEOUT), ""),
        row("fan-out", "a dry run, every round together", Amount::Time(crate::api::resources::DRY_RUN_BUDGET), ""),
        row("fan-out", "dry run rounds", items(cascade_core::plan::MAX_PLAN_ROUNDS), ""),
        row("fan-out", "resources a dry run walks", items(policy.max_plan), ""),
        row("fan-out", "plans whose members a node keeps to name what changed", items(crate::plan_tokens::REMEMBERED_PLANS), ""),
        row("fan-out", "members a node keeps over those plans", items(crate::plan_tokens::REMEMBERED_MEMBERS), ""),
        row("fan-out", "cluster status: one region's figures", Amount::Time(crate::status::STATUS_DEADLINE), ""),
        row("fan-out", "cluster status reused", Amount::Time(crate::status::STATUS_REUSE), ""),
        row("fan-out", "closure check: one region's part", Amount::Time(crate::closure_check::CLOSURE_READ_TIMEOUT), ""),
        row("fan-out", "a bounded delete's registration, or a pause, resume or cancel, told to every other region at once", Amount::Time(crate::operation_control::CONTROL_CALL_TIMEOUT), ""),
        row("fan-out", "a budget lease from the root's region", Amount::Time(crate::operation_control::CONTROL_CALL_TIMEOUT), ""),
        row("fan-out", "a create's lookups of remote targets in flight", items(crate::cluster::CONCURRENT_LOOKUPS), ""),
        row("fan-out", "a read's lookup of a dangling remote target", Amount::Time(crate::node::DANGLING_LOOKUP_TIMEOUT), ""),
        // Streams and what they replay.
        row("stream", "outbox events kept past every peer's acknowledgement (a client Watch further behind ends with OUT_OF_RANGE)", Amount::Items(DEFAULT_OUTBOX_RETENTION), "[deletion] outbox_retention"),
        row("stream", "messages queued per Watch stream", items(crate::api::stream::PACING.queued), ""),
        row("stream", "events a stream reads from the store at once", items(crate::api::stream::PACING.page), ""),
        row("stream", "peer events applied per step", items(crate::links::EVENT_BATCH), ""),
        row("stream", "releases per Peer.Release call", items(crate::links::CALL_BATCH), ""),
        row("stream", "events whose trace context is kept", items(crate::trace_context::TRACE_MARKS_KEPT), ""),
        row("stream", "operations whose trace is kept", items(crate::trace_context::OPERATION_TRACES_KEPT), ""),
        // The deletion engine.
        row("deletion", "referrer changes per work step", items(policy.batch_budget), "[deletion] batch_budget"),
        row("deletion", "attempts before a deletion is FAILED", Amount::Items(u64::from(policy.max_attempts)), "[deletion] max_attempts"),
        row("deletion", "first retry of a held deletion (doubling)", ms(policy.backoff_base_ms), "[deletion] backoff_base_ms"),
        row("deletion", "longest retry delay", ms(policy.backoff_cap_ms), "[deletion] backoff_cap_ms"),
        row("deletion", "writer tick", Amount::Time(DEFAULT_TICK), "[deletion] tick_ms"),
        row("deletion", "re-check of remote back-references of a waiting deletion", Amount::Time(DEFAULT_CHECK_INTERVAL), "[deletion] check_interval_ms"),
        row("deletion", "resources one forced Admin.Purge may delete, every region together", items(api.max_purge_members), "[limits] max_purge_members"),
        row("deletion", "due deletions of one operation a work step takes while others are due", items(policy.items_per_operation), ""),
        row("deletion", "units of an operation's budget a region leases at once", Amount::Items(cascade_core::protocol::MAX_LEASE), ""),
        row("deletion", "next look at a member its operation's budget, rate or cancel holds, and at a paused operation's deletions", ms(cascade_core::protocol::HELD_RECHECK_MS), ""),
        row("deletion", "age under which ForcePurge needs force", ms(DEFAULT_FORCE_PURGE_AFTER_MS), "[admin] force_purge_after_ms"),
        row("deletion", "members of a cascade started without its plan token (more: PLAN_REQUIRED)", api.confirm_above.map_or(Amount::Off, items), "[limits] confirm_above"),
        row("deletion", "soft-delete window: a kind's retain, a Delete's retention_seconds", ms(policy.max_retention_ms), "[limits] max_retention"),
        // Links between regions.
        row("link", "dialling a peer (TCP and TLS together)", Amount::Time(links.dial_timeout), "[links] dial_timeout_ms"),
        row("link", "HTTP/2 ping after silence", Amount::Time(links.keepalive_interval), "[links] keepalive_interval_ms"),
        row("link", "an unanswered ping closes the connection", Amount::Time(links.keepalive_timeout), "[links] keepalive_timeout_ms"),
        row("link", "nothing heard: the link reads down and redials", Amount::Time(links.silence_timeout), "[links] silence_timeout_ms"),
        row("link", "heartbeat of an idle peer watch", Amount::Time(WATCH_HEARTBEAT), ""),
        row("link", "first reconnect delay (doubling, with jitter)", Amount::Time(crate::links::RECONNECT_BASE), ""),
        row("link", "longest reconnect delay", Amount::Time(crate::links::RECONNECT_CAP), ""),
        // Clients' TLS handshakes (`api/tls_accept.rs`), on a node and a standby.
        row("link", "a client's TLS handshake", Amount::Time(super::tls_accept::HANDSHAKE_TIMEOUT), ""),
        row("link", "TLS handshakes at once (more connections wait to be accepted)", items(super::tls_accept::MAX_HANDSHAKES_IN_FLIGHT), ""),
        row("link", "a connection with an untrusted client certificate is answered for", Amount::Time(super::tls_accept::REFUSED_CONNECTION_LIFETIME), ""),
        // A standby in front of its region's writer.
        row("link", "calls at once on one connection to a standby", Amount::Items(u64::from(super::standby::MAX_STREAMS_PER_CONNECTION)), ""),
        row("link", "a standby asks its writer's health (each ask bounded as long)", Amount::Time(super::standby::DEFAULT_WRITER_CHECK_EVERY), ""),
        // The store.
        row("store", "engine cache", Amount::Bytes(crate::store::DEFAULT_CACHE_BYTES), "[storage] cache_mb"),
        row("store", "first retry of a refused commit (doubling)", Amount::Time(crate::writer::FIRST_RETRY), ""),
        row("store", "longest retry of a refused commit", Amount::Time(crate::writer::MAX_RETRY), ""),
        row("store", "test write before an engine is reopened", bytes(crate::store::WRITE_PROBE_BYTES), ""),
        row("store", "a repeated warning, logged once per", Amount::Time(crate::log_throttle::DEFAULT_WINDOW), ""),
        row("store", "events per outbox row (a commit of more events writes more rows)", items(crate::codec::MAX_EVENTS_PER_OUTBOX_ROW), ""),
        row("store", "bytes of events per outbox row (a larger event is a row of its own)", bytes(crate::codec::MAX_OUTBOX_ROW_BYTES), ""),
        // sled's and fjall's writer (`store/pipelined.rs`): what a group stages before its flight.
        row("store", "sled, fjall: writes a writer stages before a flush (more: applied at once)", items(crate::store::MAX_PIPELINED_KEYS), ""),
        row("store", "sled, fjall: bytes a writer stages before a flush (more: applied at once)", bytes(crate::store::MAX_PIPELINED_BYTES), ""),
        // PostgreSQL's writer (`store/postgres`): what a group stages before its flush, the runs its read cache keeps beside `cache_mb`.
        row("store", "PostgreSQL: writes a writer stages before a flush (more: sent at once)", items(crate::store::MAX_STAGED_KEYS), ""),
        row("store", "PostgreSQL: bytes a writer stages before a flush (more: sent at once)", bytes(crate::store::MAX_STAGED_BYTES), ""),
        row("store", "PostgreSQL: rows a writer's walk reads ahead (back-references, due index)", items(crate::store::RUN_READ_AHEAD), ""),
        row("store", "PostgreSQL: read runs kept per table", items(crate::store::MAX_RUNS_PER_TABLE), ""),
        row("store", "PostgreSQL: bytes of one read run (a larger one is not kept)", Amount::Bytes(crate::store::MAX_RUN_BYTES), ""),
        row("store", "PostgreSQL: bytes of all read runs (beside the engine cache)", Amount::Bytes(crate::store::MAX_RUNS_BYTES), ""),
        // The schema.
        row("schema", "kinds", items(cascade_core::schema::MAX_KINDS), ""),
        row("schema", "reference fields per kind", items(cascade_core::schema::MAX_REFS_PER_KIND), ""),
        row("schema", "a schema file a reload reads", Amount::Bytes(crate::schema_reload::MAX_SCHEMA_FILE_BYTES), ""),
        row("schema", "a schema's label", bytes(cascade_core::schema::MAX_LABEL_BYTES), ""),
        row("schema", "stored rows each compatibility count of a reload reads (more: at least N)", items(crate::writer::COMPAT_SCAN_LIMIT), ""),
        row("schema", "a burst of changes to the schema file is one reload after", Amount::Time(crate::schema_reload::WATCH_DEBOUNCE), ""),
        // Authentication ([auth] mode = "required").
        row("auth", "a bearer credential (token or JWT)", bytes(crate::auth::identity::MAX_BEARER_BYTES), ""),
        row("auth", "a tokens file; a JWKS file", Amount::Bytes(crate::auth::identity::MAX_AUTH_FILE_BYTES), ""),
        row("auth", "tokens per tokens file; keys per JWKS file", items(crate::auth::identity::MAX_AUTH_FILE_ENTRIES), ""),
        row("auth", "principal id (token principal, JWT sub, certificate SAN); group name", bytes(crate::auth::identity::MAX_PRINCIPAL_ID_BYTES), ""),
        row("auth", "groups per principal", items(crate::auth::identity::MAX_GROUPS), ""),
        row("auth", "principals whose rate buckets are kept (least recently seen evicted)", items(crate::auth::rate::MAX_TRACKED_PRINCIPALS), ""),
        // The web console (`console.rs`), a client of its node's API.
        row("console", "each API call a console page makes", Amount::Time(crate::console::CALL_BUDGET), ""),
        row("console", "a live page reads the API again every", Amount::Time(crate::console::LIVE_EVERY), ""),
        row("console", "live pages followed at once per node (more: 503, the browser retries)", items(crate::console::MAX_LIVE_STREAMS), ""),
        row("console", "a token kept in the console's cookie", bytes(crate::console::MAX_TOKEN_BYTES), ""),
        row("console", "host names in `allowed_hosts`", items(crate::config::MAX_CONSOLE_ALLOWED_HOSTS), ""),
        row("console", "outcomes per page of an operation", Amount::Items(u64::from(crate::console::OUTCOMES_PAGE)), ""),
        row("console", "references per page, each way", Amount::Items(u64::from(crate::console::REFERENCES_PAGE)), ""),
        row("console", "events per page of a resource's history", Amount::Items(u64::from(crate::console::HISTORY_PAGE)), ""),
        row("console", "members of an operation's tree drawn", items(crate::console::MAX_TREE_MEMBERS), ""),
        row("console", "deletions the operations page reads per region", Amount::Items(u64::from(crate::console::DELETIONS_PER_REGION)), ""),
        row("console", "operations the operations page shows (the most members first)", items(crate::console::OPERATIONS_SHOWN), ""),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amounts_read_as_the_table_writes_them() {
        assert_eq!(Amount::Bytes(16 * 1024 * 1024).to_string(), "16 MiB");
        assert_eq!(Amount::Bytes(4096).to_string(), "4 KiB");
        assert_eq!(Amount::Bytes(1024).to_string(), "1,024 bytes");
        assert_eq!(Amount::Bytes(160).to_string(), "160 bytes");
        assert_eq!(Amount::Items(1_000_000).to_string(), "1,000,000");
        assert_eq!(Amount::Items(100).to_string(), "100");
        assert_eq!(Amount::Off.to_string(), "off");
        assert_eq!(Amount::Time(Duration::from_millis(100)).to_string(), "100 ms");
        assert_eq!(Amount::Time(Duration::from_millis(1500)).to_string(), "1500 ms");
        assert_eq!(Amount::Time(Duration::from_secs(30)).to_string(), "30 s");
        assert_eq!(Amount::Time(Duration::from_secs(3600)).to_string(), "1 h");
    }

    #[test]
    fn every_limit_is_named_once() {
        let all = limits();
        let mut seen = std::collections::BTreeSet::new();
        for l in &all {
            assert!(seen.insert((l.area, l.what)), "{} / {} twice", l.area, l.what);
            assert!(!l.what.contains('|'), "a table cell cannot hold '|': {}", l.what);
        }
    }
}
