//! When a stream's session next asks etcd whether its watches away (served by etcd for
//! now, `entries.rs`) have caught up: one stream-level `RequestProgress` on the stream's
//! etcd side (`moves.rs: ask_for_away`).

use std::time::Duration;

use tokio::time::Instant;

/// How soon etcd is asked while watches are away; doubled after each answer that
/// brings none back, up to [`AWAY_CHECK_MAX`], and again this soon once more watches
/// are away.
const AWAY_CHECK: Duration = Duration::from_secs(1);
const AWAY_CHECK_MAX: Duration = Duration::from_secs(64);

/// When etcd is next asked about the watches away.
#[derive(Debug)]
pub(super) struct AwayCheck {
    /// The next question (armed while watches are away).
    at: Option<Instant>,
    /// The wait before it.
    every: Duration,
    /// How many were away at the last question or answer.
    away: usize,
}

impl Default for AwayCheck {
    fn default() -> Self {
        AwayCheck {
            at: None,
            every: AWAY_CHECK,
            away: 0,
        }
    }
}

impl AwayCheck {
    /// The next question's time, armed if `away` watches are away and it was not (at
    /// [`AWAY_CHECK`] if more are away than at the last question).
    pub(super) fn arm(&mut self, away: usize) -> Option<Instant> {
        if self.at.is_none() && away > 0 {
            if away > self.away {
                self.every = AWAY_CHECK;
            }
            self.at = Some(Instant::now() + self.every);
        }
        self.at
    }

    /// Whether the question is due at `now` (then it is asked, with `away` watches
    /// away, and the next one is armed later).
    pub(super) fn take_due(&mut self, now: Instant, away: usize) -> bool {
        if self.at.is_some_and(|at| at <= now) {
            self.at = None;
            self.away = away;
            return true;
        }
        false
    }

    /// etcd answered: `back` if a watch came back to the cache (the next question
    /// soon), else the next waits twice as long; `away` are still away.
    pub(super) fn answered(&mut self, back: bool, away: usize) {
        self.every = if back {
            AWAY_CHECK
        } else {
            (self.every * 2).min(AWAY_CHECK_MAX)
        };
        self.away = away;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Armed while watches are away; after answers that bring none back the wait
    /// doubles up to its bound; more watches away, or one back, bring it to 1 s again.
    #[tokio::test(start_paused = true)]
    async fn the_question_backs_off_and_comes_back_soon_for_new_watches_away() {
        let mut c = AwayCheck::default();
        assert_eq!(c.arm(0), None, "nothing away");
        let t0 = Instant::now();
        assert_eq!(c.arm(2), Some(t0 + AWAY_CHECK));
        assert!(!c.take_due(t0, 2));
        tokio::time::advance(AWAY_CHECK).await;
        assert!(c.take_due(Instant::now(), 2));
        for _ in 0..10 {
            c.answered(false, 2);
        }
        let t1 = Instant::now();
        assert_eq!(c.arm(2), Some(t1 + AWAY_CHECK_MAX), "bounded");
        assert!(c.take_due(t1 + AWAY_CHECK_MAX, 2));
        assert_eq!(c.arm(3), Some(t1 + AWAY_CHECK), "one more away");
        assert!(c.take_due(t1 + AWAY_CHECK, 3));
        c.answered(false, 3);
        assert_eq!(c.arm(3), Some(t1 + 2 * AWAY_CHECK));
        c.at = None;
        c.answered(true, 2);
        assert_eq!(c.arm(2), Some(t1 + AWAY_CHECK), "one came back");
    }
}
