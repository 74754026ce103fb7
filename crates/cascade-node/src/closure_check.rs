//! The root region's check that a cross-region cascade is finished in
//! every region it touched, run by the reconciler (`links.rs`) for each
//! operation whose root waits only for other regions' parts: the core's
//! [`ClosureCheck`] driven over the port, then the core's
//! `confirm_remote_closure` through the writer. Why reading only the
//! touched regions is enough is argued in `cascade_core::closure`.

use std::time::Duration;

use cascade_core::closure::{ClosureCheck, Phase, Verdict};
use cascade_core::OperationId;
use tracing::{debug, info, info_span, warn, Instrument};

use crate::error::Fault;
use crate::log_throttle::Throttle;
use crate::node::Node;

/// For every operation whose root waits only for other regions' parts
/// (reported by the writer): the core's [`ClosureCheck`] over the regions
/// the cascade touched (each round's regions asked at once, each under
/// [`CLOSURE_READ_TIMEOUT`]); if it finds them all finished, confirm, and
/// the root is purged. A region the cascade never reached is never asked;
/// one it reached that cannot be asked, or any pending or changing part,
/// leaves the root waiting: the writer reports it again after
/// `Policy::closure_check_ms`.
///
/// A confirmation that fails (the store refuses commits) fails again at
/// every check: `failed` lets one line a window through, with the count.
pub(crate) async fn confirm_closures(node: &Node, failed: &Throttle) {
    let ids: Vec<OperationId> = match node.closure_checks.lock() {
        Ok(mut checks) => std::mem::take(&mut *checks).into_iter().collect(),
        Err(_) => return,
    };
    for id in ids {
        let span = info_span!("closure_check", region = %node.region, operation = %id);
        async {
            let Some(local_changes) = remote_closure_finished(node, id).await else {
                return;
            };
            match node
                .writer
                .apply(move |s, c, _| cascade_core::protocol::confirm_remote_closure(s, c, id, local_changes))
                .await
            {
                Ok(true) => {
                    failed.reset();
                    info!("every region's part of the operation is finished; the root goes")
                }
                Ok(false) => debug!("the operation changed meanwhile; will look again"),
                Err(e @ Fault::Writer(_)) => debug!(error = %e, "writer unavailable; will look again"),
                Err(e) => {
                    if let Some(more) = failed.admit() {
                        warn!(error = %e, suppressed = more.count(), "confirming the closure failed{more}");
                    }
                }
            }
        }
        .instrument(span)
        .await;
    }
}

/// One read of a region's part by the closure check: long enough for a
/// loaded peer, short enough that a frozen one costs a check little (the
/// check is repeated every `closure_check_ms` anyway).
pub(crate) const CLOSURE_READ_TIMEOUT: Duration = Duration::from_secs(2);

/// The double collect of [`confirm_closures`], driven by the core's
/// [`ClosureCheck`]: Some(the local part's change count, read before the
/// first collect) when every region the cascade touched had nothing
/// pending and did not change between the two collects.
async fn remote_closure_finished(node: &Node, id: OperationId) -> Option<u64> {
    let local = node.state().get_operation(id).ok()??;
    let mut check = ClosureCheck::start(node.region.as_str(), node.peers.regions(), &local);
    while check.phase() != Phase::Done {
        let round = check.next_round();
        if round.is_empty() {
            // Looked at again on every tick while it lasts: one line a window.
            static STALLED: crate::log_throttle::Throttle =
                crate::log_throttle::Throttle::new(crate::log_throttle::DEFAULT_WINDOW);
            if let Some(more) = STALLED.admit() {
                warn!(
                    suppressed = more.count(),
                    "closure check stalled with nothing to ask; will look again{more}"
                );
            }
            return None;
        }
        let answers = futures::future::join_all(
            round
                .iter()
                .map(|region| node.peers.closure_part(region, id, CLOSURE_READ_TIMEOUT)),
        )
        .await;
        for (region, answer) in round.iter().zip(answers) {
            check.answer(region, answer);
        }
    }
    match check.verdict()? {
        Verdict::Finished { local_changes, touched } => {
            debug!(regions = ?touched, "every region the cascade touched is finished");
            Some(local_changes)
        }
        Verdict::NotYet(holdups) => {
            let why: Vec<String> = holdups.iter().map(ToString::to_string).collect();
            debug!(holdups = ?why, "the cascade is not finished everywhere yet");
            None
        }
    }
}
