//! The writer's account of a store that refuses commits or reads: since
//! when, how often, whether its engine must be reopened, and when to try
//! again.
//!
//! Why: a full disk that was freed left a node NOT_SERVING until it was
//! restarted (sled keeps a failed write's error for good; fjall poisons
//! its database), and the tick probed the store every 100 ms meanwhile. A
//! failing store is now retried with a capped exponential backoff, its
//! engine reopened once an error that may clear was seen, and the
//! episode logged as one error line, a rate-limited warning while it
//! lasts, and one info line with its figures when a commit succeeds.
//!
//! While an episode lasts no work step runs: the engine's handles may
//! show what a failed commit left half applied (sled applies a batch's
//! writes one after the other and keeps, in memory, those it applied
//! before the error, until a reopen) and refuse some reads (sled's read that must split a
//! leaf writes its log), so a step would be computed from them and fail
//! again, or worse. The tick retries the store, and kicks the work once a
//! commit succeeds. Work steps did run: the `Work` a step's own commit
//! queued before its flush failed, and the first of a writer restarted
//! mid-episode, before its first retry. On sled one of them panicked a
//! debug build's writer on such a read, and so did each incarnation's
//! first, before it ever retried the store: the node never healed
//! (`faults::disk_full::a_cascade_cut_by_a_full_disk_on_a_store_that_also_refuses_reads_finishes_once_the_disk_is_freed`).
//!
//! A read the engine refuses is the store in trouble as much as a commit
//! it refuses: on sled, once a write failed, a read that must split a
//! page fails too, and health read SERVING while every work step failed
//! on such a read (only a failed commit started an episode). A refused
//! read (the engine's error, not a record that does not decode:
//! `store::WatchedReads` tells them apart) starts an episode like a failed
//! commit. Its retry must read as well as commit: after the probe commit,
//! the retry runs one work step and one step of the audit log's retention
//! (the writer's other reader, on every tick), and the episode ends once
//! both ran without a refused read; a client's commit meanwhile does not
//! end it.
//!
//! A failure a reopen is known to mend (`StoreError::may_clear`) reopens
//! the engine before the next retry. Any other was retried on the same
//! handles for good, though a reopen is only what a restart does and sled
//! keeps any failed write's error (an EIO too) until one: it now reopens
//! after [`REOPEN_AFTER_FAILED_RETRIES`] failed retries, then after twice
//! as many each time, up to [`MOST_FAILED_RETRIES_PER_REOPEN`].
//!
//! Pure bookkeeping: the writer (`writer.rs`) does the commits, the
//! reopen and the logging; time comes in as an argument.

use std::time::Duration;

use tokio::time::Instant;

use crate::log_throttle::{Suppressed, Throttle};
use crate::store::StoreError;

/// The first retry after a failure.
pub(crate) const FIRST_RETRY: Duration = Duration::from_millis(100);

/// The longest wait between two retries: a node is back within two
/// seconds of its disk, and a store that keeps failing costs a small
/// write and an fsync (and a 1 MiB probe file) every two seconds.
pub(crate) const MAX_RETRY: Duration = Duration::from_secs(2);

/// Failed retries of an episode, since its start or its last reopen,
/// after which a failure a reopen is not known to mend reopens the engine
/// all the same.
pub(crate) const REOPEN_AFTER_FAILED_RETRIES: u32 = 3;

/// The most failed retries between two such reopens: one a minute at the
/// 2 s cap, for a store whose files keep failing the open (sled replays
/// its log at each, and readers are refused meanwhile).
pub(crate) const MOST_FAILED_RETRIES_PER_REOPEN: u32 = 30;

/// What the store refused: a write (a commit, a flush, a retry's probe, a
/// reopen) or a step's read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    Write,
    Read,
}

/// A capped exponential backoff: [`FIRST_RETRY`], doubled by each wait
/// up to [`MAX_RETRY`]. The store's retries use it, and so do the
/// supervisor's restarts of a writer that failed (`writer/supervisor.rs`):
/// one policy for "try again" in the writer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self { next: FIRST_RETRY }
    }
}

impl Backoff {
    /// The wait before the next try; the one after it waits twice as
    /// long, up to [`MAX_RETRY`].
    pub(crate) fn next_wait(&mut self) -> Duration {
        let wait = self.next;
        self.next = (self.next * 2).min(MAX_RETRY);
        wait
    }

    /// Things went well: the next wait is the first again.
    pub(crate) fn reset(&mut self) {
        *self = Self::default();
    }
}

/// What a failure was, for the log: the first of an episode (one error
/// line) or a later one (a warning at most once a window).
pub(crate) enum Noted {
    First,
    Again(Option<Suppressed>),
}

/// What an episode came to, for the line that says it is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Healed {
    /// Failed commits and retries, the first included.
    pub failures: u64,
    /// Times the store's engine was reopened.
    pub reopens: u64,
    /// From the first failure to the commit that succeeded.
    pub lasted: Duration,
    /// The episode was a restarted writer's (`Healing::resumed`) and its
    /// first retry succeeded: the store never failed it.
    pub restart_only: bool,
}

/// The writer's state of health; no episode while commits succeed.
#[derive(Debug, Default)]
pub(crate) struct Healing {
    episode: Option<Episode>,
}

#[derive(Debug)]
struct Episode {
    since: Instant,
    failures: u64,
    reopens: u64,
    /// Started by a restart (`Healing::resumed`), not by a failure.
    resumed: bool,
    /// A failure that may clear was seen since the last reopen: the
    /// engine's handles may refuse for good, so reopen before retrying.
    reopen_wanted: bool,
    /// Retries that failed since the episode started or the engine was
    /// last reopened (or its reopen failed).
    failed_retries: u32,
    /// Failed retries that reopen the engine whatever the failure:
    /// [`REOPEN_AFTER_FAILED_RETRIES`], doubled by each such reopen.
    reopen_after: u32,
    /// A read was refused: a retry must read through (a work step), not
    /// only commit, before the episode ends.
    read_refused: bool,
    /// The waits between retries, doubled by each failed one up to [`MAX_RETRY`].
    backoff: Backoff,
    retry_at: Instant,
    still_failing: Throttle,
}

impl Healing {
    /// A writer that starts while health says NOT_SERVING (the actor was
    /// restarted mid-episode, or after it failed): the cause is unknown,
    /// so the first retry reopens (a reopen of a healthy store is what a
    /// restart does), and it is due at once: a writer that fails at each
    /// start still retries the store each time (`writer/supervisor.rs`).
    pub(crate) fn resumed(now: Instant) -> Self {
        let mut healing = Self::default();
        healing.start(now, true, Refused::Write);
        if let Some(e) = &mut healing.episode {
            e.retry_at = now;
            e.resumed = true;
        }
        healing
    }

    fn start(&mut self, now: Instant, reopen_wanted: bool, refused: Refused) {
        // The first failure is the episode's error line: the warnings
        // that it still fails start a window after it.
        let still_failing = Throttle::default();
        let _ = still_failing.admit();
        let mut backoff = Backoff::default();
        self.episode = Some(Episode {
            since: now,
            failures: 1,
            reopens: 0,
            resumed: false,
            reopen_wanted,
            failed_retries: 0,
            reopen_after: REOPEN_AFTER_FAILED_RETRIES,
            read_refused: refused == Refused::Read,
            retry_at: now + backoff.next_wait(),
            backoff,
            still_failing,
        });
    }

    /// Whether commits are failing (an episode is under way).
    pub(crate) fn failing(&self) -> bool {
        self.episode.is_some()
    }

    /// The store refused `refused` (a commit, a retry, a step's read) with `e`.
    pub(crate) fn failed(&mut self, e: &StoreError, refused: Refused, now: Instant) -> Noted {
        match &mut self.episode {
            None => {
                self.start(now, e.may_clear(), refused);
                Noted::First
            }
            Some(episode) => {
                episode.failures += 1;
                episode.reopen_wanted |= e.may_clear();
                episode.read_refused |= refused == Refused::Read;
                Noted::Again(episode.still_failing.admit())
            }
        }
    }

    /// Failures of the episode under way (0: none), the first included.
    pub(crate) fn failures(&self) -> u64 {
        self.episode.as_ref().map_or(0, |e| e.failures)
    }

    /// Whether the episode ends only once a step has read through: a read
    /// was refused since it started (or since the last such step).
    pub(crate) fn awaits_a_read(&self) -> bool {
        self.episode.as_ref().is_some_and(|e| e.read_refused)
    }

    /// A retry's step read without a refusal: the next commit that
    /// succeeds ends the episode.
    pub(crate) fn read_through(&mut self) {
        if let Some(e) = &mut self.episode {
            e.read_refused = false;
        }
    }

    /// Whether the next retry is due.
    pub(crate) fn due(&self, now: Instant) -> bool {
        self.episode.as_ref().is_some_and(|e| now >= e.retry_at)
    }

    /// Whether the retry must reopen the engine first: a failure that may
    /// clear was seen since the last reopen, or retries on the same
    /// handles failed as often as the episode waits for (3, then twice as
    /// many after each reopen they asked for, up to 30).
    pub(crate) fn reopen_wanted(&self) -> bool {
        self.episode
            .as_ref()
            .is_some_and(|e| e.reopen_wanted || e.failed_retries >= e.reopen_after)
    }

    /// The engine was reopened.
    pub(crate) fn reopened(&mut self) {
        if let Some(e) = &mut self.episode {
            e.reopens += 1;
            e.reopen_wanted = false;
            e.reopen_without_cause();
        }
    }

    /// A reopen failed with an error that does not clear (corruption, an
    /// engine bug): reopening again at once would only read the same files
    /// again, so the next reopen waits for failed retries as if the error
    /// were any other that does not clear.
    pub(crate) fn stop_reopening(&mut self) {
        if let Some(e) = &mut self.episode {
            e.reopen_wanted = false;
            e.reopen_without_cause();
        }
    }

    /// A retry failed: the next waits twice as long, up to [`MAX_RETRY`].
    pub(crate) fn retry_failed(&mut self, now: Instant) {
        if let Some(e) = &mut self.episode {
            e.failed_retries = e.failed_retries.saturating_add(1);
            e.retry_at = now + e.backoff.next_wait();
        }
    }

    /// A commit succeeded: the episode, if there was one, is over.
    pub(crate) fn healed(&mut self, now: Instant) -> Option<Healed> {
        self.episode.take().map(|e| Healed {
            failures: e.failures,
            reopens: e.reopens,
            lasted: now.saturating_duration_since(e.since),
            restart_only: e.resumed && e.failures == 1,
        })
    }
}

impl Episode {
    /// A reopen was tried: the next one that no failure asks for waits for
    /// twice as many failed retries, up to [`MOST_FAILED_RETRIES_PER_REOPEN`].
    fn reopen_without_cause(&mut self) {
        if self.failed_retries >= self.reopen_after {
            self.reopen_after = (self.reopen_after * 2).min(MOST_FAILED_RETRIES_PER_REOPEN);
        }
        self.failed_retries = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::DiskCondition;

    fn full() -> StoreError {
        StoreError::Unavailable {
            condition: DiskCondition::Full,
            message: "No space left on device".into(),
        }
    }

    #[test]
    fn retries_back_off_from_100_ms_to_2_s_and_reopen_once_per_clearing_failure() {
        let mut h = Healing::default();
        let start = crate::clock::monotonic_now();
        assert!(matches!(h.failed(&full(), Refused::Write, start), Noted::First));
        assert!(h.reopen_wanted(), "a full disk wants a fresh engine");
        assert!(!h.due(start + Duration::from_millis(99)));
        // Retries every time one is due, failing each: the waits double to the cap.
        let mut now = start;
        let mut waits = Vec::new();
        for _ in 0..8 {
            let mut wait = Duration::ZERO;
            while !h.due(now) {
                now += Duration::from_millis(10);
                wait += Duration::from_millis(10);
            }
            waits.push(wait.as_millis());
            h.reopened();
            assert!(!h.reopen_wanted());
            h.failed(&full(), Refused::Write, now);
            h.retry_failed(now);
        }
        assert_eq!(waits, [100, 200, 400, 800, 1600, 2000, 2000, 2000]);
        let healed = h.healed(now).expect("an episode was under way");
        assert_eq!((healed.failures, healed.reopens), (9, 8));
        assert_eq!(healed.lasted, now - start);
        assert!(!h.failing());
        assert_eq!(h.healed(now), None, "a second success reports nothing");
    }

    #[test]
    fn a_writer_restarted_mid_episode_retries_at_once_and_reopens_first() {
        let now = crate::clock::monotonic_now();
        let mut h = Healing::resumed(now);
        assert!(h.failing());
        assert!(h.due(now), "a writer that dies at each start must still retry");
        assert!(h.reopen_wanted());
        h.reopened();
        let healed = h.healed(now).expect("the restart's episode");
        assert!(healed.restart_only, "not news: the supervisor logged the restart");
        let mut h = Healing::resumed(now);
        h.failed(&full(), Refused::Write, now);
        assert!(
            !h.healed(now).expect("an episode").restart_only,
            "the store failed it: news"
        );
    }

    #[test]
    fn a_backoff_doubles_to_the_cap_and_starts_over_when_reset() {
        let mut b = Backoff::default();
        let waits: Vec<u128> = (0..7).map(|_| b.next_wait().as_millis()).collect();
        assert_eq!(waits, [100, 200, 400, 800, 1600, 2000, 2000]);
        b.reset();
        assert_eq!(b.next_wait(), FIRST_RETRY);
    }

    #[test]
    fn an_error_that_does_not_clear_reopens_after_three_failed_retries_then_after_twice_as_many() {
        let mut h = Healing::default();
        let now = crate::clock::monotonic_now();
        h.failed(&StoreError::Engine("EIO".into()), Refused::Write, now);
        // The failed retries a reopen waits for, counted until it is asked for.
        let mut asked_after = Vec::new();
        for _ in 0..4 {
            let mut retries = 0;
            while !h.reopen_wanted() {
                h.failed(&StoreError::Engine("EIO".into()), Refused::Write, now);
                h.retry_failed(now);
                retries += 1;
            }
            asked_after.push(retries);
            h.reopened();
        }
        assert_eq!(asked_after, [3, 6, 12, 24]);
        // A full disk asks at once; a reopen that failed for good (its
        // files do not open) is not tried again at once.
        h.failed(&full(), Refused::Write, now);
        assert!(h.reopen_wanted());
        h.stop_reopening();
        assert!(!h.reopen_wanted());
    }

    #[test]
    fn a_refused_read_is_an_episode_that_a_commit_alone_does_not_end() {
        let mut h = Healing::default();
        let now = crate::clock::monotonic_now();
        assert!(matches!(h.failed(&full(), Refused::Read, now), Noted::First));
        assert!(h.failing() && h.awaits_a_read() && h.reopen_wanted());
        h.read_through();
        assert!(!h.awaits_a_read());
        h.failed(&full(), Refused::Write, now);
        assert!(!h.awaits_a_read(), "a refused commit is mended by a commit");
        assert_eq!(h.failures(), 2);
    }
}
