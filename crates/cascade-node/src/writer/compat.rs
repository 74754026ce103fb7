//! The compatibility check of a schema change against what the region
//! stores (issue 31), shared by a reload (in this writer,
//! `schema_swap.rs`), the start (`schema_reload::check_at_start`) and
//! `Admin.CheckSchema` (`schema_reload::check_text`).

use cascade_core::schema::{CompatItem, SchemaDiff, Tally};

use crate::codec::StoreState;
use crate::store::StoreError;

/// One change a compatibility check counted, and its refusal (None: the
/// stored data allows it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Judged {
    pub item: CompatItem,
    pub tally: Tally,
    pub refusal: Option<String>,
}

/// The compatibility check of a schema change against what the region
/// stores: each change the core says stored data may forbid, counted
/// (bounded: [`super::COMPAT_SCAN_LIMIT`] rows a count) and
/// judged. The one check a reload (in the writer), the start
/// (`schema_in_force::check_at_start`) and `Admin.CheckSchema` run.
pub(crate) fn compat_check(store: &StoreState<'_>, region: &str, diff: &SchemaDiff) -> Result<Vec<Judged>, StoreError> {
    diff.compat_items()
        .into_iter()
        .map(|item| {
            let tally = super::schema_swap::count(store, region, &item.question)?;
            let refusal = item.judge(tally);
            Ok(Judged { item, tally, refusal })
        })
        .collect()
}
