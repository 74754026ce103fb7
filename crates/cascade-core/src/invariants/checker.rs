//! The checks themselves: one pass over every region's view, collecting
//! violations (see the parent module for what each kind means).
//!
//! Size: about 950 lines, one file on purpose: one pass whose checks all
//! read the indexes the first pass builds (resources by uid, owner and
//! mirror rows), private to this one `Checker`; split, they would be passed
//! around whole. What each kind means is in the parent module.

use super::*;

pub(super) struct Checker<'v> {
    views: &'v [RegionView<'v>],
    schema: Option<&'v Schema>,
    moment: Moment,
    viewed: BTreeSet<&'v str>,
    /// uid → (region, resource): the first holder.
    by_uid: HashMap<Uid, (&'v str, &'v Resource)>,
    owner_rows: BTreeMap<RowKey<'v>, Held<'v>>,
    mirror_rows: BTreeMap<RowKey<'v>, Held<'v>>,
    /// (referrer kind, field) → on_delete, learned from rows.
    kind_field: BTreeMap<(&'v str, &'v str), OnDelete>,
    /// (referrer kind, field) seen with a reference marked dangling.
    dangling_fields: BTreeSet<(&'v str, &'v str)>,
    report: Report,
    found: BTreeSet<Violation>,
}

impl<'v> Checker<'v> {
    pub(super) fn new(views: &'v [RegionView<'v>], schema: Option<&'v Schema>, moment: Moment) -> Self {
        Checker {
            views,
            schema,
            moment,
            viewed: views.iter().map(|v| v.region.as_str()).collect(),
            by_uid: HashMap::new(),
            owner_rows: BTreeMap::new(),
            mirror_rows: BTreeMap::new(),
            kind_field: BTreeMap::new(),
            dangling_fields: BTreeSet::new(),
            report: Report {
                regions: views.iter().map(|v| v.region.to_string()).collect(),
                ..Report::default()
            },
            found: BTreeSet::new(),
        }
    }

    fn quiescent(&self) -> bool {
        self.moment == Moment::Quiescent
    }

    fn push(&mut self, kind: ViolationKind, region: &str, message: String) {
        self.found.insert(Violation {
            kind,
            region: region.to_owned(),
            message,
        });
    }

    /// The resource of exactly this incarnation, in any viewed region.
    fn find(&self, t: &RefTarget) -> Option<&'v Resource> {
        self.by_uid.get(&t.uid).map(|(_, r)| *r).filter(|r| r.name == t.name)
    }

    pub(super) fn run(mut self) -> Report {
        self.index();
        let explained_ops = self.explained_operations();
        for view in self.views {
            self.check_resources(view, &explained_ops);
            self.check_remote_deletions(view);
            self.check_attached_after_deleting(view);
            if let Some(store) = &view.store {
                self.check_store(view, store);
            }
        }
        if self.quiescent() {
            self.check_rows();
        }
        if let Some(schema) = self.schema {
            self.check_schema(schema);
        }
        self.report.violations = std::mem::take(&mut self.found).into_iter().collect();
        self.report
    }

    /// Counts, the uid and row indexes, and what they find on the way.
    fn index(&mut self) {
        for view in self.views {
            let region = view.region.as_str();
            if self.quiescent() && (view.pending_releases > 0 || view.pending_attach > 0) {
                self.push(
                    ViolationKind::NotQuiescent,
                    region,
                    format!(
                        "region {region} is not quiescent: pending_releases={} pending_attach={} \
                         (findings may be transient)",
                        view.pending_releases, view.pending_attach
                    ),
                );
            }
            self.report.resources += view.resources.len();
            self.report.backrefs += view.backrefs.len();
            for (name, r) in view.resources.iter() {
                if *name != r.name {
                    self.push(
                        ViolationKind::InconsistentIndex,
                        region,
                        format!(
                            "{} is stored in region {region} under the name {name}",
                            describe_resource(r)
                        ),
                    );
                }
                if r.name.region() != region {
                    self.push(
                        ViolationKind::RegionMismatch,
                        region,
                        format!(
                            "region {region} holds {}, a resource of another region",
                            describe_resource(r)
                        ),
                    );
                }
                if let Some((other_region, other)) = self.by_uid.get(&r.uid).copied() {
                    self.push(
                        ViolationKind::Resurrection,
                        region,
                        format!(
                            "uid {} is held twice: {} in region {other_region} and {} in region {region}",
                            r.uid, other.name, r.name
                        ),
                    );
                } else {
                    self.by_uid.insert(r.uid, (region, r));
                }
                if let Some(marks) = &view.dangling {
                    for (field, targets) in &r.refs {
                        let marked = targets.iter().any(|t| {
                            marks.contains(&BackRefKey {
                                target: t.uid,
                                referrer: r.uid,
                                field: field.clone(),
                            })
                        });
                        if marked {
                            self.dangling_fields.insert((r.kind(), field.as_str()));
                        }
                    }
                }
            }
            for (key, b) in view.backrefs.iter() {
                if *key != b.key() {
                    self.push(
                        ViolationKind::InconsistentIndex,
                        region,
                        format!(
                            "the row {} → {} (field {}) is stored in region {region} under another key ({key:?})",
                            describe(&b.referrer),
                            describe(&b.target),
                            b.field
                        ),
                    );
                }
                self.kind_field
                    .entry((b.referrer.name.kind(), b.field.as_str()))
                    .or_insert(b.on_delete);
                let owner = b.target.name.region() == region;
                let rows = if owner {
                    self.report.owner_rows += 1;
                    &mut self.owner_rows
                } else {
                    self.report.mirror_rows += 1;
                    &mut self.mirror_rows
                };
                if let Some((other, _)) = rows.insert(row_key(b), (region, b)) {
                    let message = format!(
                        "regions {other} and {region} both hold the {} row {} → {} (field {})",
                        if owner { "owner" } else { "mirror" },
                        describe(&b.referrer),
                        describe(&b.target),
                        b.field
                    );
                    self.push(ViolationKind::LeakedBackref, region, message);
                }
            }
        }
    }

    /// A deletion explained on its own: FAILED with an error, or BLOCKED
    /// with a reason by blockers (or finalizers, or liens) that still hold it.
    fn explained_alone(&self, resource: &Resource, record: &DeletionRecord) -> bool {
        match &record.status {
            DeletionStatus::Failed { error } => !error.is_empty(),
            // A change its principal may not make holds it until a person
            // acts (the policy, or an administrator): explained by itself.
            DeletionStatus::Blocked { reason, .. } if crate::explain::policy_refusals(reason).next().is_some() => true,
            // Held by its operation's budget, rate or cancel: a person set
            // the bound, and raises it or leaves it (issue 29).
            DeletionStatus::Blocked { reason, .. } if crate::protocol::held_by_operation(reason) => true,
            DeletionStatus::Blocked { blockers, reason } => {
                !reason.is_empty()
                    && (!blockers.is_empty() || !resource.finalizers.is_empty() || !resource.liens.is_empty())
                    && blockers.iter().all(|b| {
                        let Some(view) = self.views.iter().find(|v| v.region.as_str() == b.referrer.region()) else {
                            return true; // not viewed: cannot tell
                        };
                        view.resources
                            .get(&b.referrer)
                            .is_some_and(|x| holds(x, &b.field, resource.uid))
                    })
            }
            DeletionStatus::Pending | DeletionStatus::Waiting { .. } => false,
        }
    }

    /// Whether `target`'s deletion is held by its operation's controls
    /// (issue 29): its record says so, or a region's part of its operation
    /// is paused, cancelled or out of budget. Its cascade referrers keep
    /// their reference on purpose, not as a resurrection.
    fn held_by_controls_of(&self, target: &Resource) -> bool {
        let record = self
            .views
            .iter()
            .filter(|v| v.region.as_str() == target.name.region())
            .find_map(|v| v.deletions.get(&target.uid));
        let Some(record) = record else {
            return false;
        };
        if let DeletionStatus::Blocked { reason, .. } = &record.status {
            if crate::protocol::held_by_operation(reason) {
                return true;
            }
        }
        self.views.iter().any(|v| held_by_its_operation(v, record.operation))
    }

    /// Whether `target`'s deletion is held because its principal may not
    /// update `referrer` (see `protocol::process_work`): the referrer keeps
    /// its reference, and its row, on purpose.
    fn held_by_refusal_of(&self, target: &Resource, referrer: &ResourceName) -> bool {
        let needle = format!(" may not update {referrer} ");
        self.views
            .iter()
            .filter(|v| v.region.as_str() == target.name.region())
            .filter_map(|v| v.deletions.get(&target.uid))
            .any(|d| match &d.status {
                DeletionStatus::Blocked { reason, .. } => {
                    crate::explain::policy_refusals(reason).any(|p| p.contains(&needle))
                }
                _ => false,
            })
    }

    /// Operations with a member that explains why they cannot finish.
    fn explained_operations(&self) -> BTreeSet<OperationId> {
        let mut out = BTreeSet::new();
        for view in self.views {
            for r in view.resources.values().filter(|r| r.state == ResourceState::Deleting) {
                if let Some(d) = view.deletions.get(&r.uid) {
                    if self.explained_alone(r, d) {
                        out.insert(d.operation);
                    }
                }
            }
        }
        out
    }

    fn check_resources(&mut self, view: &'v RegionView<'v>, explained_ops: &BTreeSet<OperationId>) {
        let region = view.region.as_str();
        for r in view.resources.values() {
            let here = || format!("{} in region {region}", describe_resource(r));
            match r.state {
                ResourceState::Creating if self.quiescent() => {
                    self.push(
                        ViolationKind::UnsettledCreate,
                        region,
                        format!("{} is still CREATING", here()),
                    );
                }
                ResourceState::Deleting => {
                    self.report.deleting += 1;
                    if self.quiescent() {
                        self.check_deletion(view, r, explained_ops);
                    }
                }
                // Soft-deleted: not live (its references are not checked,
                // it holds no row) and no leak while its window lasts.
                ResourceState::Deleted if r.soft_deleted.is_none() => self.push(
                    ViolationKind::InconsistentIndex,
                    region,
                    format!("{} is DELETED without its deletion time and expiry", here()),
                ),
                _ => {}
            }
            let live = match self.moment {
                Moment::Quiescent => is_live(r),
                Moment::InFlight => r.state == ResourceState::Active,
            };
            if live {
                self.check_references(view, r);
            }
        }
        for (uid, d) in view.deletions.iter() {
            if *uid != d.target.uid {
                self.push(
                    ViolationKind::InconsistentIndex,
                    region,
                    format!(
                        "the deletion record of {} is stored under uid {uid}",
                        describe(&d.target)
                    ),
                );
            }
            let resource = self.by_uid.get(uid).filter(|(at, _)| *at == region).map(|(_, r)| *r);
            match resource {
                Some(r) if r.state == ResourceState::Deleting && r.name == d.target.name => {}
                Some(r) => self.push(
                    ViolationKind::InconsistentIndex,
                    region,
                    format!(
                        "region {region} keeps a deletion record of {}, but holds {} {}",
                        describe(&d.target),
                        state_name(r.state),
                        describe_resource(r)
                    ),
                ),
                None => self.push(
                    ViolationKind::InconsistentIndex,
                    region,
                    format!(
                        "region {region} keeps a deletion record of {} without the resource",
                        describe(&d.target)
                    ),
                ),
            }
        }
    }

    fn check_deletion(&mut self, view: &RegionView<'_>, r: &Resource, explained_ops: &BTreeSet<OperationId>) {
        let region = view.region.as_str();
        let here = format!("{} in region {region}", describe_resource(r));
        let Some(d) = view.deletions.get(&r.uid) else {
            self.push(
                ViolationKind::UnexplainedDeletion,
                region,
                format!("{here} is DELETING without a deletion record"),
            );
            return;
        };
        let explained = self.explained_alone(r, d)
            || (matches!(d.status, DeletionStatus::Pending | DeletionStatus::Waiting { .. })
                && d.reason == DeletionReason::Requested
                && explained_ops.contains(&d.operation))
            || self.views.iter().any(|v| held_by_its_operation(v, d.operation));
        if !explained {
            self.push(
                ViolationKind::UnexplainedDeletion,
                region,
                format!(
                    "{here} is DELETING with status {} and message {:?} at quiescence (operation {})",
                    d.status.name(),
                    status_message(&d.status),
                    d.operation
                ),
            );
        }
    }

    /// The references of a live resource: dangling, tracked-ness, and
    /// their rows.
    fn check_references(&mut self, view: &'v RegionView<'v>, r: &'v Resource) {
        let region = view.region.as_str();
        let here = || format!("{} in region {region}", describe_resource(r));
        let attaching: Option<&PendingAttach> = view.store.as_ref().and_then(|s| s.pending_attach.get(&r.uid));
        for (field, targets) in &r.refs {
            for t in targets {
                let key: RowKey<'_> = (t.uid, r.uid, field.as_str());
                let full_key = || BackRefKey {
                    target: t.uid,
                    referrer: r.uid,
                    field: field.clone(),
                };
                let target_region = t.name.region();
                let target = self.find(t);
                let marked = view.dangling.as_ref().map(|m| m.contains(&full_key()));
                // Tracked-ness (module doc).
                let exact = self.owner_rows.get(&key).or_else(|| self.mirror_rows.get(&key));
                let by_kind = (r.kind(), field.as_str());
                let on_delete = if marked == Some(true) {
                    Some(OnDelete::AllowDangling)
                } else if let Some((_, b)) = exact {
                    Some(b.on_delete)
                } else if let Some(s) = self.schema.and_then(|s| s.reference(r.kind(), field)) {
                    Some(s.on_delete)
                } else if let Some(o) = self.kind_field.get(&by_kind) {
                    Some(*o)
                } else if self.dangling_fields.contains(&by_kind) {
                    Some(OnDelete::AllowDangling)
                } else {
                    None
                };
                let gone = target.is_none() && self.viewed.contains(target_region);
                let dangles = match marked {
                    Some(marked) => !marked,
                    None => on_delete.is_some_and(OnDelete::tracked),
                };
                if gone && dangles {
                    self.push(
                        ViolationKind::Dangling,
                        region,
                        format!(
                            "{} references {} through field {field}, which no region holds, \
                             and the reference is not marked dangling",
                            here(),
                            describe(t)
                        ),
                    );
                }
                let Some(on_delete) = on_delete else {
                    self.report.unclassified_refs += 1;
                    continue;
                };
                if !on_delete.tracked() {
                    continue;
                }
                // A soft-deleted target holds no row and is no target: its
                // deletion finished only after every referrer let go, and
                // nothing attaches to it since. Checked at quiescence, or
                // on full states (one consistent cut): dumps read one
                // region after another may see a referrer before its
                // unset and its target after the bury.
                let consistent = self.quiescent() || view.store.is_some();
                if target.is_some_and(|t| consistent && t.state == ResourceState::Deleted) {
                    self.push(
                        ViolationKind::Resurrection,
                        region,
                        format!(
                            "{} references soft-deleted (DELETED) {} through field {field} (on_delete {on_delete})",
                            here(),
                            describe(t)
                        ),
                    );
                    continue;
                }
                if self.quiescent() {
                    if let Some(target) = target {
                        if target.state == ResourceState::Deleting
                            && on_delete != OnDelete::Block
                            && !self.held_by_refusal_of(target, &r.name)
                            && !self.held_by_controls_of(target)
                        {
                            self.push(
                                ViolationKind::Resurrection,
                                region,
                                format!(
                                    "{} still references DELETING {} through field {field} (on_delete {on_delete})",
                                    here(),
                                    describe(t)
                                ),
                            );
                        }
                    }
                }
                if self.moment == Moment::InFlight && attaching.is_some_and(|p| p.keys.contains(&full_key())) {
                    continue; // committed before its attach (ARCHITECTURE "Commit before attach")
                }
                // A gone target is `dangling` (or untracked): its rows are not missing.
                if target.is_some() && !self.owner_rows.contains_key(&key) {
                    self.push(
                        ViolationKind::MissingBackref,
                        target_region,
                        format!(
                            "{} references {} through field {field}, but region {target_region} has no \
                             owner back-reference for it",
                            here(),
                            describe(t)
                        ),
                    );
                }
                if !gone && target_region != region && self.mirror_rows.get(&key).is_none_or(|(at, _)| *at != region) {
                    self.push(
                        ViolationKind::MissingBackref,
                        region,
                        format!(
                            "{} references {} in region {target_region} through field {field}, but region \
                             {region} has no importer mirror row for it",
                            here(),
                            describe(t)
                        ),
                    );
                }
            }
        }
    }

    /// Tombstones of a uid its owner has live again, or no longer holds.
    fn check_remote_deletions(&mut self, view: &RegionView<'_>) {
        let region = view.region.as_str();
        for t in &view.remote_deletions {
            let owner = t.name.region();
            if !self.viewed.contains(owner) {
                continue;
            }
            match self.find(t) {
                Some(target) if is_live(target) => self.push(
                    ViolationKind::Resurrection,
                    region,
                    format!(
                        "region {region} saw {} enter DELETING, but region {owner} has it {} again",
                        describe(t),
                        state_name(target.state)
                    ),
                ),
                Some(_) => {}
                None if self.quiescent() => self.push(
                    ViolationKind::StaleRemoteDeletion,
                    region,
                    format!(
                        "region {region} still keeps the remote deletion of {}, which region {owner} no longer holds",
                        describe(t)
                    ),
                ),
                None => {}
            }
        }
    }

    /// An owner row attached after its target entered DELETING (a dump's
    /// rows carry no attach time: never for them).
    fn check_attached_after_deleting(&mut self, view: &RegionView<'_>) {
        let region = view.region.as_str();
        for b in view.backrefs.values() {
            if let Some(d) = view.deletions.get(&b.target.uid) {
                if b.attached_at > d.deleted_at {
                    self.push(
                        ViolationKind::Resurrection,
                        region,
                        format!(
                            "region {region} attached {} → {} (field {}) at {}, {} after the target entered \
                             DELETING at {}",
                            describe(&b.referrer),
                            describe(&b.target),
                            b.field,
                            crate::time_text::rfc3339(b.attached_at),
                            crate::time_text::duration(b.attached_at.0 - d.deleted_at.0),
                            crate::time_text::rfc3339(d.deleted_at)
                        ),
                    );
                }
            }
        }
    }

    /// Why a row is leaked, if it is.
    fn leak(&self, b: &BackRef, at: &str, owner: bool) -> Option<String> {
        let what = format!(
            "{} row in region {at}: {} → {} (field {}, on_delete {})",
            if owner { "owner" } else { "mirror" },
            describe(&b.referrer),
            describe(&b.target),
            b.field,
            b.on_delete
        );
        if !owner && b.referrer.name.region() != at {
            return Some(format!("{what}: the referrer is not local to the importer"));
        }
        if (owner || self.viewed.contains(b.target.name.region())) && self.find(&b.target).is_none() {
            return Some(format!("{what}: the target incarnation no longer exists"));
        }
        if self.viewed.contains(b.referrer.name.region()) {
            match self.find(&b.referrer) {
                None => return Some(format!("{what}: the referrer no longer exists")),
                Some(r) if !is_live(r) => {
                    return Some(format!(
                        "{what}: the referrer is {}, and released its references",
                        state_name(r.state)
                    ))
                }
                Some(r) if !holds(r, &b.field, b.target.uid) => {
                    return Some(format!("{what}: the referrer does not hold the target in that field"))
                }
                Some(_) => {}
            }
        }
        None
    }

    /// Leaked rows, and owner rows of remote referrers without their mirror.
    fn check_rows(&mut self) {
        let mut found = Vec::new();
        for (key, (at, b)) in &self.owner_rows {
            if let Some(m) = self.leak(b, at, true) {
                found.push((ViolationKind::LeakedBackref, at.to_string(), m));
                continue;
            }
            let referrer_region = b.referrer.name.region();
            if referrer_region != *at
                && self.viewed.contains(referrer_region)
                && self.mirror_rows.get(key).is_none_or(|(m, _)| *m != referrer_region)
            {
                found.push((
                    ViolationKind::MissingBackref,
                    referrer_region.to_owned(),
                    format!(
                        "region {at} has an owner row {} → {} (field {}), but region {referrer_region} has no \
                         importer mirror row for it",
                        describe(&b.referrer),
                        describe(&b.target),
                        b.field
                    ),
                ));
            }
        }
        for (key, (at, b)) in &self.mirror_rows {
            if let Some(m) = self.leak(b, at, false) {
                found.push((ViolationKind::LeakedBackref, at.to_string(), m));
                continue;
            }
            let owner = b.target.name.region();
            if self.viewed.contains(owner) && self.owner_rows.get(key).is_none_or(|(o, _)| *o != owner) {
                found.push((
                    ViolationKind::LeakedBackref,
                    at.to_string(),
                    format!(
                        "mirror row in region {at}: {} → {} (field {}) has no owner row in region {owner}",
                        describe(&b.referrer),
                        describe(&b.target),
                        b.field
                    ),
                ));
            }
        }
        for (kind, region, message) in found {
            self.push(kind, &region, message);
        }
    }

    /// Resources and rows against the schema.
    fn check_schema(&mut self, schema: &Schema) {
        let mut found = Vec::new();
        for view in self.views {
            let region = view.region.as_str();
            for r in view.resources.values().filter(|r| r.state == ResourceState::Active) {
                let Some(kind) = schema.kind(r.kind()) else {
                    found.push((
                        region,
                        format!("{} is of a kind the schema does not know", describe_resource(r)),
                    ));
                    continue;
                };
                for (field, targets) in &r.refs {
                    let Some(spec) = kind.refs.get(field) else {
                        found.push((
                            region,
                            format!(
                                "{} holds field {field}, which the schema does not know",
                                describe_resource(r)
                            ),
                        ));
                        continue;
                    };
                    if targets.is_empty() {
                        found.push((region, format!("{} keeps field {field} empty", describe_resource(r))));
                    }
                    if !spec.many && targets.len() > 1 {
                        found.push((
                            region,
                            format!(
                                "{} holds {} targets in the single reference {field}",
                                describe_resource(r),
                                targets.len()
                            ),
                        ));
                    }
                }
            }
            for b in view.backrefs.values() {
                let spec = schema.reference(b.referrer.name.kind(), &b.field);
                let why = match spec {
                    None => Some("a field the schema does not know".to_owned()),
                    Some(s) if !s.on_delete.tracked() => Some(format!("an untracked ({}) field", s.on_delete)),
                    Some(s) if s.on_delete != b.on_delete => Some(format!(
                        "on_delete {} where the schema says {}",
                        b.on_delete, s.on_delete
                    )),
                    Some(_) => None,
                };
                if let Some(why) = why {
                    found.push((
                        region,
                        format!(
                            "the row {} → {} (field {}) in region {region} is for {why}",
                            describe(&b.referrer),
                            describe(&b.target),
                            b.field
                        ),
                    ));
                }
            }
        }
        for (region, message) in found {
            self.push(ViolationKind::SchemaMismatch, region, message);
        }
    }

    /// What only a full state can show: the uid index, the retry queue,
    /// operation parts, the outbox.
    fn check_store(&mut self, view: &RegionView<'_>, store: &StoreView<'_>) {
        let region = view.region.as_str();
        for r in view.resources.values() {
            if store.uid_index.get(&r.uid) != Some(&r.name) {
                self.push(
                    ViolationKind::InconsistentIndex,
                    region,
                    format!(
                        "the uid index of region {region} does not point {} at its name",
                        describe_resource(r)
                    ),
                );
            }
        }
        for (uid, name) in store.uid_index.iter() {
            if view.resources.get(name).is_none_or(|r| r.uid != *uid) {
                self.push(
                    ViolationKind::InconsistentIndex,
                    region,
                    format!(
                        "the uid index of region {region} points {uid} at {name}, which is another incarnation or none"
                    ),
                );
            }
        }
        if !self.quiescent() {
            return;
        }
        // The retry queue.
        for (uid, d) in view.deletions.iter() {
            let queued = store.work.contains_key(uid);
            let wrong = match &d.status {
                DeletionStatus::Failed { .. } if queued => Some("FAILED but still queued"),
                DeletionStatus::Blocked { .. } if !queued => Some("BLOCKED but not queued for a retry"),
                _ => None,
            };
            if let Some(wrong) = wrong {
                self.push(
                    ViolationKind::QueueMismatch,
                    region,
                    format!("the deletion of {} in region {region} is {wrong}", describe(&d.target)),
                );
            }
            if !store.operations.contains_key(&d.operation) {
                self.push(
                    ViolationKind::OperationMismatch,
                    region,
                    format!(
                        "the deletion record of {} names operation {}, which region {region} does not have",
                        describe(&d.target),
                        d.operation
                    ),
                );
            }
        }
        // A soft-deleted resource's expiry is its queue entry, due when
        // its window ends: without it, it would never be purged.
        for r in view.resources.values() {
            if let (ResourceState::Deleted, Some(soft)) = (r.state, r.soft_deleted) {
                if store
                    .work
                    .get(&r.uid)
                    .is_none_or(|w| w.next_attempt_at > soft.expire_time)
                {
                    self.push(
                        ViolationKind::QueueMismatch,
                        region,
                        format!(
                            "{} is DELETED until {}, but its expiry is not queued by then",
                            describe_resource(r),
                            crate::time_text::rfc3339(soft.expire_time)
                        ),
                    );
                }
            }
        }
        // An operation that its controls hold (paused, cancelled, its
        // budget spent here) keeps its items queued on purpose (issue 29).
        let held_ops: BTreeSet<OperationId> = store
            .operations
            .values()
            .filter(|op| {
                op.controls
                    .as_ref()
                    .is_some_and(|c| c.paused || c.cancelled || c.left() == 0)
            })
            .map(|op| op.id)
            .collect();
        for (uid, w) in store.work.iter() {
            let status = view.deletions.get(uid).map(|d| &d.status);
            let buried = self
                .by_uid
                .get(uid)
                .is_some_and(|(at, r)| *at == region && r.state == ResourceState::Deleted);
            let held = match view.deletions.get(uid) {
                Some(d) => held_ops.contains(&d.operation),
                // An importer's item: its tombstone's operation is not in
                // the view; a held operation's part here says enough.
                None => !held_ops.is_empty() && view.remote_deletions.iter().any(|t| t.uid == *uid),
            };
            let ok = *uid == w.target.uid
                && (buried
                    || held
                    || matches!(
                        status,
                        Some(DeletionStatus::Blocked { .. } | DeletionStatus::Waiting { .. })
                    ));
            if !ok {
                self.push(
                    ViolationKind::QueueMismatch,
                    region,
                    format!(
                        "region {region} queues work for {} at quiescence, whose deletion is {}",
                        describe(&w.target),
                        status.map_or("missing", DeletionStatus::name)
                    ),
                );
            }
        }
        // Operation parts against their records and outcomes.
        for op in store.operations.values() {
            if let Some(u) = op.undelete.as_deref() {
                // An undelete (issue 29) has no deletions of its own: its
                // counters are its outcomes, and it ends SUCCEEDED only
                // when everything came back.
                let count = |f: fn(&OutcomeAction) -> bool| {
                    let ours = store
                        .outcomes
                        .iter()
                        .filter(|((id, _), o)| *id == op.id && f(&o.action));
                    ours.count() as u64
                };
                let restored = count(|a| *a == OutcomeAction::Restored);
                let lost = count(|a| matches!(a, OutcomeAction::NotRestored { .. }));
                let wrong = if (u.restored, u.not_restored) != (restored, lost) {
                    Some(format!(
                        "counts restored={} not_restored={}, its outcomes say {restored}, {lost}",
                        u.restored, u.not_restored
                    ))
                } else if op.state == OperationState::Succeeded && lost > 0 {
                    Some("SUCCEEDED with members not restored".to_owned())
                } else if op.state != OperationState::Running && op.end_time.is_none() {
                    Some("done without an end time".to_owned())
                } else {
                    None
                };
                if let Some(wrong) = wrong {
                    let label = format!("the part of undelete {} (of {}) in region {region}", op.id, u.of);
                    self.push(ViolationKind::OperationMismatch, region, format!("{label} {wrong}"));
                }
                continue;
            }
            let records: Vec<&DeletionRecord> = view.deletions.values().filter(|d| d.operation == op.id).collect();
            let count = |f: fn(&DeletionStatus) -> bool| records.iter().filter(|d| f(&d.status)).count() as u64;
            let failed = count(|s| matches!(s, DeletionStatus::Failed { .. }));
            let blocked = count(|s| matches!(s, DeletionStatus::Blocked { .. }));
            let pending = records.len() as u64 - failed;
            let deleted = store
                .outcomes
                .iter()
                .filter(|((id, _), o)| *id == op.id && o.action == OutcomeAction::Deleted)
                .count() as u64;
            let p = op.progress;
            let label = format!(
                "the part of operation {} (root {}) in region {region}",
                op.id, op.root.name
            );
            if (p.pending, p.blocked, p.failed, p.deleted) != (pending, blocked, failed, deleted) {
                self.push(
                    ViolationKind::OperationMismatch,
                    region,
                    format!(
                        "{label} counts pending={} blocked={} failed={} deleted={}, its records and outcomes \
                         say {pending}, {blocked}, {failed}, {deleted}",
                        p.pending, p.blocked, p.failed, p.deleted
                    ),
                );
            }
            let wrong = match op.state {
                OperationState::Running if p.pending == 0 => Some("RUNNING with nothing pending"),
                OperationState::Running if op.end_time.is_some() => Some("RUNNING with an end time"),
                // A purge's root is synthetic (`protocol::purge_root`): no
                // resource, so nothing to be DELETING.
                OperationState::Running
                    if op.root.name.region() == region
                        && !op.is_purge()
                        && !self.find(&op.root).is_some_and(|r| r.state == ResourceState::Deleting) =>
                {
                    Some("RUNNING, but its root is not DELETING")
                }
                OperationState::Succeeded if (p.pending, p.failed) != (0, 0) => {
                    Some("SUCCEEDED with deletions pending or failed")
                }
                OperationState::Failed if p.pending != 0 || p.failed == 0 => {
                    Some("FAILED with deletions pending or none failed")
                }
                OperationState::Succeeded | OperationState::Failed if op.end_time.is_none() => {
                    Some("done without an end time")
                }
                _ => None,
            };
            if let Some(wrong) = wrong {
                self.push(ViolationKind::OperationMismatch, region, format!("{label} is {wrong}"));
            }
        }
        // The outbox.
        if let Some(w) = store.event_revisions.windows(2).find(|w| w[0] >= w[1]) {
            self.push(
                ViolationKind::EventOrder,
                region,
                format!("the outbox of region {region} holds revision {} before {}", w[0], w[1]),
            );
        }
        if let Some(last) = store.event_revisions.last().filter(|l| **l >= store.next_revision) {
            self.push(
                ViolationKind::EventOrder,
                region,
                format!(
                    "the outbox of region {region} holds revision {last}, but its next revision is {}",
                    store.next_revision
                ),
            );
        }
    }
}

/// Whether `view`'s region's part of operation `id` is held by its
/// controls (paused, cancelled, or its budget spent there; issue 29): the
/// operation's members, in every region, may wait on it on purpose, and a
/// person resumes, extends or leaves it.
fn held_by_its_operation(view: &RegionView<'_>, id: OperationId) -> bool {
    view.store
        .as_ref()
        .and_then(|store| store.operations.get(&id))
        .and_then(|op| op.controls.as_ref())
        .is_some_and(|c| c.paused || c.cancelled || c.left() == 0)
}
