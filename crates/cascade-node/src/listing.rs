//! Listing this region's resources under selectors, and a resource's
//! references, as `Node` methods (above the node, like `explain.rs`).
//!
//! A page is by name: it examines stored rows after the caller's position
//! in name order, keeps those that match, and stops at `page_size` items or
//! after [`MAX_LIST_SCANNED`] rows, whichever comes first. A page can
//! therefore hold fewer items than asked, even none, with a position to
//! continue from (the last row it examined): a selective listing of a big
//! region costs each call a bounded read, and the client pages until there
//! is no next position. Since positions only move forward in name order, a
//! resource present for the whole walk is listed exactly once, and one
//! created or deleted meanwhile at most once.
//!
//! A listing of every region is driven at the wire edge (`api/listing.rs`),
//! which asks each region's node for a page of this and merges the answers
//! with the core's `listing::merge_pages`.

use std::collections::BTreeMap;

use cascade_core::limits::quote;
use cascade_core::model::{Resource, ResourceState};
use cascade_core::selector::Selector;
use cascade_core::state::StateRead;
use cascade_core::{BackRefKey, CoreError, OnDelete, ResourceName, Uid};

use crate::error::Fault;
use crate::node::{Node, ResourceView};
use crate::store::Table;

/// Stored rows one page of a listing examines at most (README, "Limits").
pub(crate) const MAX_LIST_SCANNED: usize = 10_000;

/// What a listing keeps: every field is a filter, all must hold.
#[derive(Debug, Clone, Default)]
pub(crate) struct ListQuery {
    /// One kind (`None`: every kind).
    pub(crate) kind: Option<String>,
    /// One state (`None`: ACTIVE and DELETING).
    pub(crate) state: Option<ResourceState>,
    /// A prefix of the id (the part after `{region}/{kind}/`).
    pub(crate) name_prefix: String,
    /// The attribute selector.
    pub(crate) selector: Selector,
    /// List soft-deleted (DELETED) resources too (asking for the state
    /// DELETED implies it).
    pub(crate) show_deleted: bool,
}

impl ListQuery {
    fn keeps(&self, r: &Resource) -> bool {
        r.state != ResourceState::Creating
            && (r.state != ResourceState::Deleted || self.show_deleted || self.state == Some(ResourceState::Deleted))
            && self.state.is_none_or(|s| s == r.state)
            && r.name.id().starts_with(&self.name_prefix)
            && self.selector.matches(&r.attributes)
    }
}

/// One page of a listing: the items, and the name to continue after when
/// there may be more.
pub(crate) struct ListPage {
    pub(crate) items: Vec<ResourceView>,
    pub(crate) next: Option<ResourceName>,
}

/// Which references of a resource, and from where.
#[derive(Debug, Clone)]
pub(crate) enum ReferencesFrom {
    /// Who points at it, after the back-reference `(referrer uid, field)`.
    Referrers { after: Option<(Uid, String)> },
    /// What it points at, after this many rows.
    Targets { offset: usize },
}

/// One reference: `referrer`'s `field` points at `target`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReferenceRow {
    pub(crate) referrer: ResourceName,
    pub(crate) target: ResourceName,
    pub(crate) field: String,
    /// `None`: the schema no longer has the field.
    pub(crate) on_delete: Option<OnDelete>,
}

/// A page of references, and where the next starts.
pub(crate) struct ReferencesPage {
    pub(crate) rows: Vec<ReferenceRow>,
    pub(crate) next: Option<ReferencesFrom>,
}

impl Node {
    /// The page size a request asks for, within the node's limits.
    fn page_size(&self, asked: usize) -> usize {
        match asked {
            0 => self.limits.default_page_size,
            n => n.min(self.limits.max_page_size),
        }
    }

    /// A page of this region's resources in name order that `query`
    /// keeps, after `after` (module doc: at most [`MAX_LIST_SCANNED`] rows
    /// examined; the page may be short, even empty, with a next name).
    /// Owners of remote `allow_dangling` targets are asked within what is
    /// left of the client's `deadline` (`Node::mark_remote_dangling`).
    pub(crate) async fn list(
        &self,
        query: &ListQuery,
        page_size: usize,
        after: Option<&ResourceName>,
        deadline: &crate::peers::Deadline,
    ) -> Result<ListPage, Fault> {
        let mut prefix = format!("{}/", self.region);
        if let Some(kind) = &query.kind {
            self.known_kind(kind, "kind", format_args!("unknown kind {}", quote(kind)))?;
            // With a kind, the id prefix narrows the scan itself.
            prefix.push_str(kind);
            prefix.push('/');
            prefix.push_str(&query.name_prefix);
        }
        let page_size = self.page_size(page_size);
        let mut cursor = after.map(|a| a.as_str().as_bytes().to_vec());
        let mut items: Vec<ResourceView> = Vec::new();
        let mut owners = BTreeMap::new();
        let mut scanned = 0usize;
        loop {
            let budget = (MAX_LIST_SCANNED - scanned).min(1024);
            let rows: Vec<Resource> =
                self.state()
                    .scan(Table::Resources, prefix.as_bytes(), cursor.as_deref(), budget)?;
            let Some(last) = rows.last() else {
                return Ok(ListPage { items, next: None });
            };
            let last_examined = last.name.clone();
            cursor = Some(last.name.as_str().as_bytes().to_vec());
            scanned += rows.len();
            let complete = rows.len() < budget;
            for r in rows {
                if !query.keeps(&r) {
                    continue;
                }
                if items.len() == page_size {
                    let next = items.last().map(|v| v.resource.name.clone());
                    return Ok(ListPage { items, next });
                }
                let mut view = self.view(r)?;
                self.mark_remote_dangling(&mut view, &mut owners, deadline).await;
                items.push(view);
            }
            if complete {
                return Ok(ListPage { items, next: None });
            }
            if scanned >= MAX_LIST_SCANNED {
                // Out of budget: continue after the last row examined.
                return Ok(ListPage {
                    items,
                    next: Some(last_examined),
                });
            }
        }
    }

    /// A page of the references into (`Referrers`, from the back-references
    /// this owner keeps, every region's referrers) or out of (`Targets`) a
    /// resource of this region. NOT_FOUND for a resource that is not there
    /// (or still CREATING).
    pub(crate) fn references(
        &self,
        name: &ResourceName,
        from: ReferencesFrom,
        page_size: usize,
    ) -> Result<ReferencesPage, Fault> {
        self.known_kind(
            name.kind(),
            "name",
            format_args!("unknown kind {} in {name}", quote(name.kind())),
        )?;
        let page_size = self.page_size(page_size);
        let state = self.state();
        let resource = match state.get_resource(name)? {
            Some(r) if r.state != ResourceState::Creating => r,
            _ => return Err(CoreError::NotFound(name.clone()).into()),
        };
        match from {
            ReferencesFrom::Referrers { after } => {
                let after = after.map(|(referrer, field)| BackRefKey {
                    target: resource.uid,
                    referrer,
                    field,
                });
                // One more than the page, to know whether there is a next.
                let mut backrefs = state.backrefs(resource.uid, after.as_ref(), page_size + 1)?;
                let more = backrefs.len() > page_size;
                backrefs.truncate(page_size);
                let next = match backrefs.last() {
                    Some(b) if more => Some(ReferencesFrom::Referrers {
                        after: Some((b.referrer.uid, b.field.clone())),
                    }),
                    _ => None,
                };
                let rows = backrefs
                    .into_iter()
                    .map(|b| ReferenceRow {
                        referrer: b.referrer.name,
                        target: name.clone(),
                        field: b.field,
                        on_delete: Some(b.on_delete),
                    })
                    .collect();
                Ok(ReferencesPage { rows, next })
            }
            ReferencesFrom::Targets { offset } => {
                // A resource's own references are bounded (fields per kind
                // times targets per field): flattened and cut to the page.
                let all: Vec<ReferenceRow> = resource
                    .refs
                    .iter()
                    .flat_map(|(field, targets)| {
                        let on_delete = self.schema().reference(name.kind(), field).map(|r| r.on_delete);
                        targets.iter().map(move |t| ReferenceRow {
                            referrer: name.clone(),
                            target: t.name.clone(),
                            field: field.clone(),
                            on_delete,
                        })
                    })
                    .collect();
                let end = offset.saturating_add(page_size).min(all.len());
                let rows = all.get(offset.min(end)..end).map(<[_]>::to_vec).unwrap_or_default();
                let next = (end < all.len()).then_some(ReferencesFrom::Targets { offset: end });
                Ok(ReferencesPage { rows, next })
            }
        }
    }
}
