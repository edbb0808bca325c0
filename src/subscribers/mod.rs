//! The subscriber registry: registration, unsubscription, ending, culling after a
//! compaction gap, watch slots and scopes. It owns the subscriber index, the watch
//! counters and the lag count.
//!
//! - [`index`]: which subscribers a batch goes to, and the index as the follower locks it;
//! - [`mailbox`]: one subscriber's bounded queue, its lagging state and catch-up;
//! - [`filter`]: what one subscriber receives.
//!
//! ## Lifecycle
//! A watch takes a [`Slot`] (cache-wide and, through a scope, per scope) before it is
//! registered, so a limit is enforced before any work. Registration puts its mailbox
//! into the index under the index lock, at a position decided under the same lock, so
//! the follower (which dispatches under that lock) either delivers a revision to it or
//! the revision is already behind its position. Unsubscription (a drop, a cancel, a
//! scope dropped) removes it from the index and ends its mailbox; the slot is freed when
//! the stream lets go of it. After a compaction gap the follower culls the subscribers
//! whose position the new snapshot cannot serve. On close, every mailbox ends and no
//! subscriber can be added any more.

pub(crate) mod filter;
pub(crate) mod index;
pub(crate) mod mailbox;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::history::SharedHistory;
use filter::Filter;
use index::Index;
pub(crate) use index::{LockedIndex, SubId};
use mailbox::{End, LagCount, Mailbox, CATCH_UP_SCAN};

/// The registry. Lock order: the index, then the history, then a mailbox.
pub(crate) struct Subscribers {
    index: Mutex<Index>,
    lag: LagCount,
    /// The cache-wide count of slots held (what `max_watchers` and `watchers()` count):
    /// the scope every slot counts in, and the parent of every tenant's scope.
    root: Arc<Scope>,
    buffer: usize,
    next_id: AtomicU64,
}

/// The outcome of a registration.
#[derive(Debug)]
pub(crate) enum Registered {
    /// Live (or catching up from the history): deliveries arrive in `mailbox`, every
    /// matching revision after `position` (for a watch from now: the revision it
    /// starts after, which its `created` response must report).
    Live {
        id: SubId,
        mailbox: Arc<Mailbox>,
        position: i64,
    },
    /// The start revision is below the window: the watch gets the compaction signal.
    Compacted { floor: i64 },
}

impl Subscribers {
    pub(crate) fn new(max_watchers: usize, buffer: usize) -> Self {
        Subscribers {
            index: Mutex::new(Index::default()),
            lag: LagCount::default(),
            root: Arc::new(Scope {
                limit: max_watchers,
                count: AtomicUsize::new(0),
                ids: None,
                parent: None,
            }),
            buffer,
            next_id: AtomicU64::new(1),
        }
    }

    /// Open watches: a watch counts until its stream has returned its last response
    /// (or was dropped), so a count never includes a watch whose end was read.
    pub(crate) fn watchers(&self) -> usize {
        self.root.open()
    }

    /// Lagging watches.
    pub(crate) fn lagging(&self) -> usize {
        self.lag.get()
    }

    /// The lag count, for consumers polling their mailbox.
    pub(crate) fn lag(&self) -> &LagCount {
        &self.lag
    }

    /// Takes a watch slot, cache-wide and in `scope`.
    ///
    /// # Errors
    /// [`Error::WatchLimit`] naming the limit that was reached.
    pub(crate) fn acquire(&self, scope: Option<&Arc<Scope>>) -> Result<Slot> {
        let root = &self.root;
        root.take()?;
        let Some(scope) = scope else {
            return Ok(Slot(root.clone()));
        };
        debug_assert!(scope.parent.as_ref().is_some_and(|p| Arc::ptr_eq(p, root)));
        scope.take().inspect_err(|_| root.give_back())?;
        Ok(Slot(scope.clone()))
    }

    /// A tenant's scope: at most `limit` slots, which count in the cache's limit too.
    pub(crate) fn scope(&self, limit: usize) -> Arc<Scope> {
        Arc::new(Scope {
            limit,
            count: AtomicUsize::new(0),
            ids: Some(Mutex::new(HashMap::new())),
            parent: Some(self.root.clone()),
        })
    }

    /// A registry id for a subscriber registered later with
    /// [`register_as`](Self::register_as) (a cancel can name a watch by it while it
    /// learns where it starts).
    pub(crate) fn reserve_id(&self) -> SubId {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Registers a subscriber under `id` (from [`reserve_id`](Self::reserve_id)) with
    /// `filter`, starting at `start_revision` (0: after `now` or the cache's revision,
    /// whichever is newer). `revision` reads the cache's revision; it is read under the
    /// index lock, where the follower publishes it.
    ///
    /// # Errors
    /// [`Error::Closed`] if the cache closed.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn register_as(
        &self,
        id: SubId,
        filter: Filter,
        start_revision: i64,
        now: i64,
        history: &SharedHistory,
        revision: impl Fn() -> i64,
        slot: &Slot,
    ) -> Result<Registered> {
        let mut index = self.index.lock();
        if index.closed {
            return Err(Error::Closed);
        }
        let (last_rev, lagging) = match start_revision {
            // A revision the cache has not reached makes a future-start subscriber:
            // events up to it are skipped, the first one after it is delivered.
            0 => (revision().max(now), false),
            start => {
                let history = history.read();
                if start < history.floor() {
                    return Ok(Registered::Compacted {
                        floor: history.floor(),
                    });
                }
                (start - 1, start - 1 < history.head())
            }
        };
        let mailbox = Mailbox::new(filter, self.buffer, last_rev, lagging, &self.lag);
        if let Some(ids) = &slot.0.ids {
            ids.lock().insert(id, mailbox.clone());
        }
        // A replay catches up now, not at the consumer's first poll: the producer skips
        // a lagging subscriber, so a consumer that reads late would find its start
        // evicted although everything it is owed may still be in the window. The first
        // scan runs under the index lock (the writer cannot move the window meanwhile),
        // the rest, if any, after it.
        let more = lagging && mailbox.catch_up(&history.read(), &self.lag, CATCH_UP_SCAN);
        index.insert(id, mailbox.clone());
        drop(index);
        if more {
            mailbox.replay(history, &self.lag);
        }
        Ok(Registered::Live {
            id,
            mailbox,
            position: last_rev,
        })
    }

    /// Removes the subscriber `id` (with `mailbox`) from the index and ends its mailbox
    /// (idempotent).
    pub(crate) fn unsubscribe(&self, id: SubId, mailbox: &Mailbox, why: End) {
        let removed = self.index.lock().remove(id, mailbox.filter());
        if let Some(mailbox) = removed {
            mailbox.end(why, &self.lag);
        }
    }

    /// Ends every subscription and refuses new ones (close, or the follower's exit).
    pub(crate) fn end_all(&self, why: End) {
        let mut index = self.index.lock();
        index.closed = true;
        for (_, _, mailbox) in index.all() {
            mailbox.end(why.clone(), &self.lag);
        }
    }

    /// The index, locked for the follower's flush of one burst of upstream messages.
    pub(crate) fn lock(&self) -> LockedIndex<'_> {
        LockedIndex::new(self.index.lock(), &self.lag)
    }
}

/// The bookkeeping of one watch scope: its limit, how many are open, which. The cache's
/// own count is a scope too (the root, which does not list its watches); a tenant's
/// scope (from [`Subscribers::scope`]) has the root as its parent.
#[derive(Debug)]
pub(crate) struct Scope {
    limit: usize,
    count: AtomicUsize,
    /// The watches open through a tenant's scope, with their mailboxes (`None` for the
    /// root).
    ids: Option<Mutex<HashMap<SubId, Arc<Mailbox>>>>,
    /// The cache's count, which a tenant's slots take too (`None` for the root).
    parent: Option<Arc<Scope>>,
}

impl Scope {
    /// Takes one of the scope's slots.
    ///
    /// # Errors
    /// [`Error::WatchLimit`] naming the scope's limit, if all are taken.
    fn take(&self) -> Result<()> {
        if self.count.fetch_add(1, Ordering::AcqRel) >= self.limit {
            self.give_back();
            return Err(Error::WatchLimit { limit: self.limit });
        }
        Ok(())
    }

    /// Gives a slot back.
    fn give_back(&self) {
        self.count.fetch_sub(1, Ordering::AcqRel);
    }

    /// Watches open through the scope.
    pub(crate) fn open(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    /// The scope's limit.
    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    /// Ends every watch opened through the scope (their streams end after what was
    /// delivered, as on close).
    pub(crate) fn cancel_all(&self, subscribers: &Subscribers) {
        let Some(ids) = &self.ids else { return };
        let ids: Vec<_> = ids.lock().drain().collect();
        for (id, mailbox) in ids {
            subscribers.unsubscribe(id, &mailbox, End::Closed);
        }
    }
}

/// A counted watch slot (cache-wide and, for scoped watches, per scope), in the scope it
/// was taken in (one pointer: every open watch holds one). Freed on drop.
#[derive(Debug)]
pub(crate) struct Slot(Arc<Scope>);

impl Slot {
    /// Forgets `id` in the scope (the subscriber is gone).
    pub(crate) fn forget(&self, id: SubId) {
        if let Some(ids) = &self.0.ids {
            ids.lock().remove(&id);
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.give_back();
        if let Some(parent) = &self.0.parent {
            parent.give_back();
        }
    }
}
