//! The policy every region decides with: a Cedar policy file
//! (`[auth] policy_file`), validated against the schema the node ships
//! (`deploy/auth/cascade.cedarschema`, compiled in), behind
//! [`cascade_core::auth::Authorize`].
//!
//! The Cedar model: the principal is `Cascade::User::"<id>"`, a member of
//! each of its `Cascade::Group::"<group>"`s; the action is the verb's name
//! (`Cascade::Action::"delete"`, `Cascade::Action::"admin.force_purge"`);
//! the resource is `Cascade::Resource::"<region>/<kind>/<id>"` (a member of
//! its `Cascade::Region`) with the attributes `region`, `kind` and `name`
//! (the id part, so `resource.name like "prod-*"` is a name pattern), or,
//! for a call on a region as a whole (a listing, a watch, an Admin call),
//! `Cascade::Region::"<region>"` with `kind` the kind listed (`""` for
//! every kind) and `name` `""`. A decision's rule is the determining
//! policy's `@id` annotation, else its Cedar id (`policy3`); `default deny`
//! when no policy permits.
//!
//! Deciding is off the writer's path and cheap: the parsed policy sits
//! behind an [`ArcSwap`] (a reload swaps it whole; a decision never waits
//! for one), filed at load by verb and principal (`index.rs`) so a decision
//! evaluates only the policies that can match it, not the whole file; the
//! two entities a request needs are built per call from the principal and
//! the target (no file IO; the type names and the action uids are built
//! once). A reload happens when the file changes (read and
//! compared every [`POLL_INTERVAL`]) or on SIGHUP ([`crate::reload_signal::request_reload`], which
//! the `cascade serve` binary calls on the signal). A file that does not
//! parse or does not validate is refused with its line and column (a
//! throttled WARN, the metric `cascade_policy_file_refused`), and the
//! previous policy stays in force; at start it is an error naming the line.

mod index;

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use cascade_core::auth::{Authorize, Decision, Principal, Target, Verb};
use cedar_policy::{
    Context, Entities, Entity, EntityId, EntityTypeName, EntityUid, PolicyId, PolicySet, Request, RestrictedExpression,
    Schema, ValidationMode, Validator,
};
use miette::Diagnostic;
use prometheus::{IntCounterVec, IntGauge, Opts, Registry};
use tracing::{info, warn};

use self::index::PolicyIndex;
use crate::log_throttle::Throttle;

/// The schema a policy is validated against: the file that ships beside
/// the example policy, compiled in so the two cannot drift apart.
pub const SCHEMA: &str = include_str!("../../../../deploy/auth/cascade.cedarschema");

/// The rule of a decision no policy permitted.
pub const DEFAULT_DENY: &str = "default deny";

/// How often the policy file is read and compared with the one in force.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// The largest policy file a node reads: far beyond any hand-written
/// policy (the benchmark's 1,000 rules are ~200 KB).
pub const MAX_POLICY_BYTES: u64 = 4 * 1024 * 1024;

/// The most policies (permit and forbid statements) a file may hold.
pub const MAX_POLICIES: usize = 20_000;

/// How much of Cedar's own message an error quotes.
const MESSAGE_CHARS: usize = 300;

/// Why a policy file is not (or no longer) the policy in force.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("{path}: cannot be read: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: holds {bytes} bytes, more than the {MAX_POLICY_BYTES} a policy file may")]
    TooLarge { path: String, bytes: u64 },
    #[error("{path}: line {line}, column {column}: {message}")]
    Syntax {
        path: String,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{path}: line {line}, column {column}: policy {policy} does not validate against the schema: {message}")]
    Invalid {
        path: String,
        line: usize,
        column: usize,
        policy: String,
        message: String,
    },
    #[error("{path}: holds {count} policies, more than the {MAX_POLICIES} a policy file may")]
    TooMany { path: String, count: usize },
    #[error("{path}: holds policy templates, which Cascade does not link: write each policy out")]
    Templates { path: String },
    #[error("the compiled-in policy schema does not parse: {0}")]
    Schema(String),
    #[error("{path}: the policies could not be filed by verb and principal: {message}")]
    Index { path: String, message: String },
}

/// The policy in force: parsed and validated once per reload.
struct InForce {
    /// The whole file, as Cedar would evaluate it without an index.
    policies: PolicySet,
    /// The same policies filed by verb and principal: what a decision reads.
    index: PolicyIndex,
    /// Each policy's rule name (its `@id`, else its Cedar id), looked up
    /// per decision without formatting anything.
    rules: HashMap<PolicyId, String>,
}

/// What the watcher last read of the file, whether it was taken or refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    hash: u64,
    len: usize,
}

/// The Cedar type names and action uids, built once.
struct Names {
    user: EntityTypeName,
    group: EntityTypeName,
    resource: EntityTypeName,
    region: EntityTypeName,
    /// `Cascade::Action::"<verb>"`, in the order of [`Verb::ALL`].
    actions: Vec<EntityUid>,
    /// Each action uid that is one verb and no action group (`in` a group
    /// would widen it), to its index in [`Verb::ALL`]: how the index files a
    /// policy's action scope.
    verbs: HashMap<EntityUid, usize>,
}

impl Names {
    fn new(schema: &Schema) -> Result<Names, PolicyError> {
        let type_name = |name: &str| {
            EntityTypeName::from_str(name).map_err(|e| PolicyError::Schema(format!("entity type {name}: {e}")))
        };
        let action = type_name("Cascade::Action")?;
        let actions: Vec<EntityUid> = Verb::ALL
            .iter()
            .map(|v| EntityUid::from_type_name_and_id(action.clone(), EntityId::new(v.as_str())))
            .collect();
        let groups: HashSet<&EntityUid> = schema.action_groups().collect();
        let verbs = actions
            .iter()
            .enumerate()
            .filter(|(_, uid)| !groups.contains(uid))
            .map(|(i, uid)| (uid.clone(), i))
            .collect();
        Ok(Names {
            user: type_name("Cascade::User")?,
            group: type_name("Cascade::Group")?,
            resource: type_name("Cascade::Resource")?,
            region: type_name("Cascade::Region")?,
            actions,
            verbs,
        })
    }

    /// The verb an action uid is (its index in [`Verb::ALL`]), None for an
    /// action group or an action that is no verb.
    fn verb_of(&self, action: &EntityUid) -> Option<usize> {
        self.verbs.get(action).copied()
    }

    fn action(&self, verb: Verb) -> &EntityUid {
        let index = Verb::ALL.iter().position(|v| *v == verb).unwrap_or(0);
        &self.actions[index]
    }
}

/// The policy file's metrics, in the node's registry.
struct PolicyMetrics {
    /// Reloads by outcome (`applied`, `refused`).
    reloads: IntCounterVec,
    /// Policies in force.
    rules: IntGauge,
    /// 1 while the file on disk is refused (the previous policy decides).
    refused: IntGauge,
}

/// Builds a metric from constant options (the names are literals of this
/// file; a malformed one is a bug caught by every test that loads a policy).
fn build<M>(made: prometheus::Result<M>) -> M {
    match made {
        Ok(m) => m,
        Err(e) => panic!("a metric of auth/policy.rs is malformed: {e}"),
    }
}

impl PolicyMetrics {
    fn new(registry: &Registry) -> PolicyMetrics {
        let metrics = PolicyMetrics {
            reloads: build(IntCounterVec::new(
                Opts::new(
                    "cascade_policy_reloads_total",
                    "Policy file loads since start, by outcome (applied, refused).",
                ),
                &["outcome"],
            )),
            rules: build(IntGauge::new(
                "cascade_policy_rules",
                "Policies (permit and forbid) in force.",
            )),
            refused: build(IntGauge::new(
                "cascade_policy_file_refused",
                "1 while the policy file on disk is refused (malformed or invalid) and the previous policy decides.",
            )),
        };
        let collectors: [Box<dyn prometheus::core::Collector>; 3] = [
            Box::new(metrics.reloads.clone()),
            Box::new(metrics.rules.clone()),
            Box::new(metrics.refused.clone()),
        ];
        for collector in collectors {
            // A duplicate name is the only failure, and each node has its
            // own registry: log and go on.
            if let Err(e) = registry.register(collector) {
                warn!(error = %e, "a policy metric could not be registered");
            }
        }
        metrics
    }
}

/// [`Authorize`] by a Cedar policy file, reloaded on change or SIGHUP.
pub struct PolicyAuthorizer {
    path: PathBuf,
    validator: Validator,
    names: Names,
    cedar: cedar_policy::Authorizer,
    in_force: ArcSwap<InForce>,
    /// What was last read of the file, so an unchanged file is not parsed again.
    seen: Mutex<Option<Seen>>,
    refusals_logged: Throttle,
    metrics: PolicyMetrics,
}

impl std::fmt::Debug for PolicyAuthorizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyAuthorizer")
            .field("path", &self.path)
            .field("policies", &self.policies_in_force())
            .field("filed", &self.in_force.load().index.filed())
            .finish_non_exhaustive()
    }
}

/// Line and column (from 1, in characters) of a byte offset of `source`.
fn line_column(source: &str, offset: usize) -> (usize, usize) {
    let before = source.get(..offset.min(source.len())).unwrap_or(source);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

/// Where Cedar located an error (its first label), as line and column.
fn located(source: &str, diagnostic: &dyn Diagnostic) -> (usize, usize) {
    diagnostic
        .labels()
        .and_then(|mut labels| labels.next())
        .map_or((1, 1), |label| line_column(source, label.offset()))
}

/// Cedar's message, with its help when it has one, cut to a short prefix.
fn message_of(diagnostic: &dyn Diagnostic) -> String {
    let mut message = diagnostic.to_string();
    if let Some(help) = diagnostic.help() {
        let _ = write!(message, " ({help})");
    }
    cascade_core::limits::cut_stored(&message, MESSAGE_CHARS)
}

fn content_hash(text: &str) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut hasher);
    hasher.finish()
}

/// Reads a policy file, refusing one beyond [`MAX_POLICY_BYTES`].
fn read_policy_file(path: &Path) -> Result<String, PolicyError> {
    let shown = path.display().to_string();
    let read = |source| PolicyError::Read {
        path: shown.clone(),
        source,
    };
    let bytes = std::fs::metadata(path).map_err(read)?.len();
    if bytes > MAX_POLICY_BYTES {
        return Err(PolicyError::TooLarge { path: shown, bytes });
    }
    std::fs::read_to_string(path).map_err(read)
}

impl PolicyAuthorizer {
    /// The policy of `path`, validated: an error names the file, line and
    /// column of the first problem. Its metrics go to `registry`.
    pub fn load(path: &Path, registry: &Registry) -> Result<PolicyAuthorizer, PolicyError> {
        let text = read_policy_file(path)?;
        Self::from_text(path, &text, registry)
    }

    /// The policy `text` (read from `path`, which later reloads read).
    pub fn from_text(path: &Path, text: &str, registry: &Registry) -> Result<PolicyAuthorizer, PolicyError> {
        let (schema, _warnings) =
            Schema::from_cedarschema_str(SCHEMA).map_err(|e| PolicyError::Schema(message_of(&e)))?;
        let names = Names::new(&schema)?;
        let validator = Validator::new(schema);
        let in_force = compile(&validator, &names, path, text)?;
        let metrics = PolicyMetrics::new(registry);
        metrics.reloads.with_label_values(&["applied"]).inc();
        metrics.rules.set(in_force.rules.len() as i64);
        Ok(PolicyAuthorizer {
            path: path.to_owned(),
            validator,
            names,
            cedar: cedar_policy::Authorizer::new(),
            in_force: ArcSwap::from_pointee(in_force),
            seen: Mutex::new(Some(Seen {
                hash: content_hash(text),
                len: text.len(),
            })),
            refusals_logged: Throttle::default(),
            metrics,
        })
    }

    /// How many policies are in force.
    pub fn policies_in_force(&self) -> usize {
        self.in_force.load().rules.len()
    }

    /// Reads the file again and puts it in force if it changed since it
    /// was last read (or always, with `forced`: a SIGHUP). Ok(Some(count))
    /// when a new policy is in force, Ok(None) when the file is unchanged;
    /// Err (logged, counted) when it is refused and the previous policy
    /// stays.
    pub fn reload(&self, forced: bool) -> Result<Option<usize>, PolicyError> {
        let outcome = read_policy_file(&self.path).and_then(|text| {
            let seen = Seen {
                hash: content_hash(&text),
                len: text.len(),
            };
            {
                let mut last = self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                if !forced && *last == Some(seen) {
                    return Ok(None);
                }
                *last = Some(seen);
            }
            compile(&self.validator, &self.names, &self.path, &text).map(Some)
        });
        match outcome {
            Ok(None) => Ok(None),
            Ok(Some(in_force)) => {
                let count = in_force.rules.len();
                self.in_force.store(Arc::new(in_force));
                self.metrics.reloads.with_label_values(&["applied"]).inc();
                self.metrics.rules.set(count as i64);
                self.metrics.refused.set(0);
                self.refusals_logged.reset();
                info!(path = %self.path.display(), policies = count, "policy reloaded: {count} policies in force");
                Ok(Some(count))
            }
            Err(e) => {
                self.metrics.reloads.with_label_values(&["refused"]).inc();
                self.metrics.refused.set(1);
                if let Some(more) = self.refusals_logged.admit() {
                    warn!(error = %e, policies = self.policies_in_force(), suppressed = more.count(),
                        "policy file refused; the previous policy stays in force{more}");
                }
                Err(e)
            }
        }
    }

    /// The rule of a decision Cedar took for `reasons` (the policies that
    /// determined it): the smallest name among them, so the answer does
    /// not depend on the order Cedar keeps them in.
    fn rule<'a, 'r>(in_force: &'a InForce, reasons: impl Iterator<Item = &'r PolicyId>) -> Option<&'a str> {
        reasons
            .filter_map(|id| in_force.rules.get(id).map(String::as_str))
            .min()
    }

    fn uid(kind: &EntityTypeName, id: &str) -> EntityUid {
        EntityUid::from_type_name_and_id(kind.clone(), EntityId::new(id))
    }

    /// The resource entity of a target and its uid.
    fn resource_entity(&self, target: Target<'_>) -> Result<(EntityUid, Entity), String> {
        let string = |s: &str| RestrictedExpression::new_string(s.to_owned());
        let (uid, attrs, parents) = match target {
            Target::Resource(name) => (
                Self::uid(&self.names.resource, name.as_str()),
                [
                    ("region".to_owned(), string(name.region())),
                    ("kind".to_owned(), string(name.kind())),
                    ("name".to_owned(), string(name.id())),
                ],
                HashSet::from([Self::uid(&self.names.region, name.region())]),
            ),
            Target::Region { region, kind } => (
                Self::uid(&self.names.region, region.as_str()),
                [
                    ("region".to_owned(), string(region.as_str())),
                    ("kind".to_owned(), string(kind.unwrap_or(""))),
                    ("name".to_owned(), string("")),
                ],
                HashSet::new(),
            ),
        };
        let entity = Entity::new(uid.clone(), HashMap::from(attrs), parents).map_err(|e| e.to_string())?;
        Ok((uid, entity))
    }

    /// The request of a decision and its two entities.
    fn request(&self, principal: &Principal, verb: Verb, target: Target<'_>) -> Result<(Request, Entities), String> {
        let user = Self::uid(&self.names.user, &principal.id);
        let groups = principal
            .groups
            .iter()
            .map(|g| Self::uid(&self.names.group, g))
            .collect();
        let (resource, resource_entity) = self.resource_entity(target)?;
        let entities = Entities::from_entities([Entity::new_no_attrs(user.clone(), groups), resource_entity], None)
            .map_err(|e| e.to_string())?;
        let request = Request::new(user, self.names.action(verb).clone(), resource, Context::empty(), None)
            .map_err(|e| e.to_string())?;
        Ok((request, entities))
    }

    /// Evaluates the sets of the index the request selects and combines
    /// their answers as Cedar does over one set: a forbid that holds
    /// anywhere denies, else a permit that holds anywhere allows, else
    /// nothing permits; the rule is the smallest name among the satisfied
    /// policies of the deciding effect.
    fn try_decide(&self, principal: &Principal, verb: Verb, target: Target<'_>) -> Result<Decision, String> {
        let in_force = self.in_force.load();
        let (request, entities) = self.request(principal, verb, target)?;
        let (mut permitted, mut forbidden) = (false, false);
        let (mut permit_rule, mut forbid_rule): (Option<&str>, Option<&str>) = (None, None);
        for set in in_force.index.sets(principal, verb) {
            let response = self.cedar.is_authorized(&request, set, &entities);
            let rule = Self::rule(&in_force, response.diagnostics().reason());
            match response.decision() {
                cedar_policy::Decision::Allow => {
                    permitted = true;
                    permit_rule = smallest(permit_rule, rule);
                }
                // A set denies with reasons only when a forbid holds in it.
                cedar_policy::Decision::Deny if response.diagnostics().reason().next().is_some() => {
                    forbidden = true;
                    forbid_rule = smallest(forbid_rule, rule);
                }
                cedar_policy::Decision::Deny => {}
            }
        }
        Ok(if forbidden {
            Decision::deny(forbid_rule.unwrap_or(DEFAULT_DENY))
        } else if permitted {
            Decision::allow(permit_rule.unwrap_or("permit"))
        } else {
            Decision::deny(DEFAULT_DENY)
        })
    }

    /// The decision over the whole file, every policy evaluated, as Cedar
    /// alone would take it: what [`Authorize::decide`] (which evaluates
    /// only the policies the index selects) must always agree with, and the
    /// benchmark's measure of what the index saves.
    pub fn decide_whole_set(&self, principal: &Principal, verb: Verb, target: Target<'_>) -> Decision {
        let in_force = self.in_force.load();
        let decided = self.request(principal, verb, target).map(|(request, entities)| {
            let response = self.cedar.is_authorized(&request, &in_force.policies, &entities);
            let rule = Self::rule(&in_force, response.diagnostics().reason());
            match response.decision() {
                cedar_policy::Decision::Allow => Decision::allow(rule.unwrap_or("permit")),
                cedar_policy::Decision::Deny => Decision::deny(rule.unwrap_or(DEFAULT_DENY)),
            }
        });
        decided.unwrap_or_else(engine_refused)
    }
}

/// The smaller of two rule names, either possibly absent.
fn smallest<'a>(a: Option<&'a str>, b: Option<&'a str>) -> Option<&'a str> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The decision when Cedar could not take the request: a deny naming why.
fn engine_refused(why: String) -> Decision {
    Decision::deny(format!(
        "policy engine: {}",
        cascade_core::limits::cut_stored(&why, 200)
    ))
}

impl Authorize for PolicyAuthorizer {
    fn decide(&self, principal: &Principal, verb: Verb, target: Target<'_>) -> Decision {
        // Building a request only fails on a name Cedar cannot hold, which
        // names never are (they are checked at the API): deny, naming why.
        self.try_decide(principal, verb, target).unwrap_or_else(engine_refused)
    }
}

/// Parses and validates a policy file's text, and files its policies.
fn compile(validator: &Validator, names: &Names, path: &Path, text: &str) -> Result<InForce, PolicyError> {
    let shown = || path.display().to_string();
    let policies = PolicySet::from_str(text).map_err(|e| {
        let (line, column) = located(text, &e);
        PolicyError::Syntax {
            path: shown(),
            line,
            column,
            message: message_of(&e),
        }
    })?;
    if policies.templates().next().is_some() {
        return Err(PolicyError::Templates { path: shown() });
    }
    let count = policies.num_of_policies();
    if count > MAX_POLICIES {
        return Err(PolicyError::TooMany { path: shown(), count });
    }
    let validation = validator.validate(&policies, ValidationMode::Strict);
    if let Some(error) = validation.validation_errors().next() {
        let (line, column) = located(text, error);
        let policy = policies
            .policy(error.policy_id())
            .and_then(|p| p.annotation("id"))
            .map_or_else(|| error.policy_id().to_string(), str::to_owned);
        return Err(PolicyError::Invalid {
            path: shown(),
            line,
            column,
            policy,
            message: message_of(error),
        });
    }
    let rules = policies
        .policies()
        .map(|p| {
            let rule = p.annotation("id").map_or_else(|| p.id().to_string(), str::to_owned);
            (p.id().clone(), rule)
        })
        .collect();
    let index = PolicyIndex::new(&policies, names).map_err(|e| PolicyError::Index {
        path: shown(),
        message: cascade_core::limits::cut_stored(&e, MESSAGE_CHARS),
    })?;
    Ok(InForce { policies, index, rules })
}

/// Reloads `authorizer`'s file every [`POLL_INTERVAL`] if it changed, and
/// at once on [`crate::reload_signal::request_reload`] (SIGHUP), until the authorizer is dropped (its
/// node stopped). Reading runs off the async workers.
pub(crate) fn watch_policy_file(authorizer: Weak<PolicyAuthorizer>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        warn!("no async runtime: the policy file is not watched for changes");
        return;
    };
    runtime.spawn(async move {
        let mut requests = crate::reload_signal::subscribe();
        let mut tick = tokio::time::interval(POLL_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick is immediate: the file was just read.
        tick.tick().await;
        loop {
            let forced = tokio::select! {
                _ = tick.tick() => false,
                changed = requests.changed() => changed.is_ok(),
            };
            let Some(authorizer) = authorizer.upgrade() else {
                return;
            };
            // Errors are logged and counted by reload itself.
            let _ = tokio::task::spawn_blocking(move || authorizer.reload(forced)).await;
        }
    });
}

#[cfg(test)]
mod tests;
