//! The sizes a request may carry and a node stores, written down once, and
//! the one way an error message quotes what a client sent.
//!
//! Every string a request carries has a limit here, checked before anything
//! is stored or forwarded (the proto crate's `bounds` checks each request
//! field against these; the core's own validation uses the same numbers).
//! An error quotes client input with [`quote`]: a short prefix and the
//! input's length, so a refusal stays small however large the input (a
//! status travels in gRPC metadata, where clients accept about 16 KB).
//! What is stored from a caller without being refused (the audit log) is
//! cut with [`cut_stored`].

/// Characters of client input an error message quotes, at most.
pub const QUOTED_CHARS: usize = 64;

/// A resource name: a region (32), a kind (63) and an id (63), two slashes.
pub const MAX_NAME_BYTES: usize = 32 + 1 + 63 + 1 + 63;
/// A region id (`[a-z][a-z0-9-]{0,31}`).
pub const MAX_REGION_BYTES: usize = 32;
/// A kind, or a reference field name (the schema's rule for both).
pub const MAX_KIND_BYTES: usize = 63;
/// A uid or an operation id: a UUID in any of the forms `uuid` parses
/// (the longest is the 45-byte URN).
pub const MAX_UID_BYTES: usize = 45;
/// An etag (a revision in decimal).
pub const MAX_ETAG_BYTES: usize = 32;
/// `requested_by` (kept in deletion records, operations and liens).
pub const MAX_REQUESTED_BY_BYTES: usize = 256;
/// A page token (every token a node issues is far shorter).
pub const MAX_PAGE_TOKEN_BYTES: usize = 1024;
/// A plan token a delete expects (`DeleteRequest.expect_plan`): a node's
/// tokens are 74 bytes (`p1-` and a SHA-256 in hex, 8 groups of 8).
pub const MAX_PLAN_TOKEN_BYTES: usize = 128;
/// A reason given with a lien, a finalizer failure or an admin action.
pub const MAX_REASON_BYTES: usize = 1024;
/// Refusals a held deletion's reason names (the rest are counted): a walk
/// refused for every referrer a step passed would otherwise store one
/// message per referrer (`error::name_refusals`).
pub const MAX_REFUSALS_NAMED: usize = 4;
/// A lien id.
pub const MAX_LIEN_ID_BYTES: usize = 128;
/// A finalizer name.
pub const MAX_FINALIZER_BYTES: usize = 128;
/// Finalizers one resource may list.
pub const MAX_FINALIZERS: usize = 32;
/// Attributes one resource may hold.
pub const MAX_ATTRIBUTES: usize = 256;
/// An attribute key.
pub const MAX_ATTRIBUTE_KEY_BYTES: usize = 128;
/// An attribute value.
pub const MAX_ATTRIBUTE_VALUE_BYTES: usize = 4096;
/// Reference fields one request may name (the schema's most per kind).
pub const MAX_REF_FIELDS: usize = crate::schema::MAX_REFS_PER_KIND;
/// Targets of one reference field.
pub const MAX_TARGETS_PER_FIELD: usize = 1024;
/// A back-reference's `on_delete` as peers send it (`allow_dangling` is
/// the longest).
pub const MAX_ON_DELETE_BYTES: usize = 16;
/// Seeds of one `Peer.Plan` call.
pub const MAX_PLAN_SEEDS: usize = 100_000;
/// An undelete's dry run: the members one region would restore, as it
/// tells the root's region and the root's region tells the others (the
/// targets they may count live), and the decisions it lists. A larger
/// part is reported with what fits (`planned_more` counts the rest).
pub const MAX_UNDELETE_LISTED: usize = 10_000;
/// A listing's page token across every region (each region's position:
/// a region and a name, for at most `MAX_LIST_REGIONS` regions, in
/// base64).
pub const MAX_LIST_PAGE_TOKEN_BYTES: usize = 4096;
/// Regions a listing of every region asks (a cluster with more refuses
/// `all_regions`: the page token holds each one's position).
pub const MAX_LIST_REGIONS: usize = 12;
/// A listing's name prefix (a prefix of an id, the part of a name after
/// `{region}/{kind}/`).
pub const MAX_NAME_PREFIX_BYTES: usize = 63;
/// A listing's attribute selector.
pub const MAX_SELECTOR_BYTES: usize = 1024;

/// Audit entry fields, stored cut to these with [`cut_stored`]: who, the
/// action, the target and the outcome (the reason is [`MAX_REASON_BYTES`]).
pub const MAX_AUDIT_WHO_BYTES: usize = 256;
/// See [`MAX_AUDIT_WHO_BYTES`].
pub const MAX_AUDIT_ACTION_BYTES: usize = 64;
/// See [`MAX_AUDIT_WHO_BYTES`].
pub const MAX_AUDIT_TARGET_BYTES: usize = 256;
/// See [`MAX_AUDIT_WHO_BYTES`].
pub const MAX_AUDIT_OUTCOME_BYTES: usize = 1024;

/// Client input as an error message quotes it: the whole input, escaped,
/// when short; else its first [`QUOTED_CHARS`] characters (cut on a
/// character boundary) and its length, e.g.
/// `"eu-west/project/aaaaaaaa…" (102400 bytes)`. Control and quote
/// characters are escaped, and the escaped prefix is bounded too, so the
/// quote is at most about 80 bytes for any input.
pub fn quote(input: &str) -> String {
    let mut out = String::with_capacity(QUOTED_CHARS + 24);
    out.push('"');
    let mut chars = input.chars();
    let mut written = 0;
    for c in chars.by_ref() {
        if written >= QUOTED_CHARS {
            out.push('…');
            out.push('"');
            out.push_str(&format!(" ({} bytes)", input.len()));
            return out;
        }
        for e in c.escape_debug() {
            out.push(e);
            written += 1;
        }
    }
    out.push('"');
    out
}

/// `value` as stored when a field may hold at most `max` bytes: unchanged
/// when it fits, else a prefix (cut on a character boundary) and a marker
/// with the original length, `…[truncated, 1048576 bytes]`, the whole at
/// most `max` bytes.
pub fn cut_stored(value: &str, max: usize) -> String {
    if value.len() <= max {
        return value.to_owned();
    }
    let marker = format!("…[truncated, {} bytes]", value.len());
    let mut end = max.saturating_sub(marker.len());
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = String::with_capacity(end + marker.len());
    out.push_str(&value[..end]);
    out.push_str(&marker);
    out
}

/// The longest retention a node allows by default (`[limits]
/// max_retention`): a schema's `retain` or a Delete's retention above the
/// node's maximum is refused, at load or in the request.
pub const DEFAULT_MAX_RETENTION_MS: u64 = 30 * 86_400_000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_input_is_quoted_whole_and_a_long_one_by_a_prefix_and_its_length() {
        assert_eq!(quote("eu-west/port/p1"), "\"eu-west/port/p1\"");
        let long = format!("eu-west/project/{}", "a".repeat(102_400 - 16));
        let q = quote(&long);
        assert!(q.starts_with("\"eu-west/project/aaaa"), "{q}");
        assert!(q.ends_with("…\" (102400 bytes)"), "{q}");
        assert!(q.len() < 100, "{q}");
    }

    #[test]
    fn a_quote_is_cut_on_a_char_boundary_and_bounded_after_escaping() {
        let q = quote(&"é".repeat(1000));
        assert!(q.ends_with("(2000 bytes)"), "{q}");
        let q = quote(&"\u{0}".repeat(10_000));
        assert!(q.len() < 100, "{} bytes: {q}", q.len());
    }

    #[test]
    fn a_stored_value_is_cut_to_its_limit_with_a_marker() {
        assert_eq!(cut_stored("short", 10), "short");
        let cut = cut_stored(&"é".repeat(600_000), 1024);
        assert!(cut.len() <= 1024, "{}", cut.len());
        assert!(cut.ends_with("…[truncated, 1200000 bytes]"), "{cut}");
        assert!(cut.starts_with('é'));
    }
}
