//! etcd's actions: writes, progress answers, failures, reconnects and compactions.

use super::*;

impl Model {
    /// One etcd transaction at the next revision: 1-3 distinct keys, puts and deletes.
    pub(super) fn etcd_txn(&mut self) -> i64 {
        let t = &mut self.truth;
        t.etcd_rev += 1;
        let r = t.etcd_rev;
        let mut state = t.state_at(r - 1).clone();
        let n = match self.rng.random_range(0..10) {
            0..=5 => 1,
            6..=8 => 2,
            _ => 3,
        };
        let mut keys: Vec<&str> = Vec::new();
        while keys.len() < n {
            let key = if self.rng.random_bool(0.2) {
                OUTSIDE[self.rng.random_range(0..OUTSIDE.len())]
            } else {
                INSIDE[self.rng.random_range(0..INSIDE.len())]
            };
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
        let mut events = Vec::new();
        for (i, key) in keys.into_iter().enumerate() {
            let k = Bytes::from(key.to_string());
            let old = state.get(&k).cloned();
            if old.is_some() && self.rng.random_bool(0.35) {
                let kv = KeyValue::new(key.to_string(), "", 0, r, 0, 0);
                events.push(Event::new(EventType::Delete, kv, old));
                state.remove(&k);
            } else {
                let (create, version) = old
                    .as_ref()
                    .map_or((r, 1), |o| (o.create_revision(), o.version() + 1));
                let value = format!("v{r}.{i}{}", "x".repeat(self.rng.random_range(0..4)));
                let kv = KeyValue::new(key.to_string(), value, create, r, version, 0);
                events.push(Event::new(EventType::Put, kv.clone(), old));
                state.insert(k, kv);
            }
        }
        t.events.insert(r, events);
        t.states.insert(r, state);
        r
    }

    /// etcd writes 1-3 revisions; a connected cache gets them in one message.
    pub(super) fn write(&mut self) -> Check {
        let before = self.truth.etcd_rev;
        let n = self.rng.random_range(1..=3);
        for _ in 0..n {
            self.etcd_txn();
        }
        let upto = self.truth.etcd_rev;
        self.up.set_current_revision(upto);
        let revs = self.truth.cache_revisions(before, upto);
        self.note(format!(
            "etcd writes ({before}, {upto}], for the cache {revs:?}{}",
            if self.conn.is_some() {
                ""
            } else {
                " (disconnected)"
            }
        ));
        if self.conn.is_some() {
            self.send(&revs, Vec::new());
        }
        Ok(())
    }

    /// Sends these revisions' events in one message, after `old` (repeated) events.
    pub(super) fn send(&mut self, revs: &[i64], old: Vec<(EventType, KeyValue)>) {
        let mut msg = old;
        for &r in revs {
            msg.extend(self.truth.cache_events(r));
        }
        if msg.is_empty() {
            return;
        }
        self.conn.as_ref().expect("connected").events(msg);
        for &r in revs {
            self.truth.cache_applies(r);
        }
    }

    pub(super) fn etcd_progress(&mut self, requested: bool) -> Check {
        let t = &self.truth;
        let revision = if self.rng.random_bool(0.8) {
            t.etcd_rev
        } else {
            self.rng
                .random_range((t.applied - 2).max(1)..=t.etcd_rev.max(1))
        };
        let trusted = self.cache.stats().progress_trusted;
        self.note(format!(
            "etcd progress at {revision} ({}, trusted {trusted})",
            if requested { "requested" } else { "periodic" }
        ));
        self.conn
            .as_ref()
            .expect("connected")
            .progress(revision, requested);
        if !requested || trusted {
            self.truth.cache_progress(revision);
        }
        Ok(())
    }

    pub(super) fn fail(&mut self) -> Check {
        let w = self.conn.take().expect("connected");
        if self.rng.random_bool(0.5) {
            self.note("upstream fails (transport error)".into());
            w.fail();
        } else {
            self.note("upstream stream ends".into());
        }
        drop(w);
        Ok(())
    }

    /// The next watch the cache opens: it backs off at most `backoff_max` first.
    pub(super) async fn next_opened(&mut self) -> std::result::Result<OpenedWatch, String> {
        for _ in 0..4 {
            tokio::time::advance(self.backoff_max + Duration::from_millis(1)).await;
            settle().await;
            if let Ok(w) = self.opened.try_recv() {
                return Ok(w);
            }
        }
        Err("the cache did not watch again after its backoff".into())
    }

    pub(super) async fn reconnect(&mut self, may_compact: bool) -> Check {
        self.stats.reconnects += 1;
        let mut w = self.next_opened().await?;
        let t = &self.truth;
        if w.start != t.applied + 1 {
            return Err(format!(
                "the cache watched again from {}, not from its applied revision {} + 1",
                w.start, t.applied
            ));
        }
        if may_compact && t.etcd_rev >= t.applied + 2 && self.rng.random_bool(0.35) {
            let compact = self.rng.random_range(t.applied + 2..=t.etcd_rev);
            let at = t.etcd_rev;
            self.note(format!(
                "reconnect from {}: etcd compacted at {compact}; the cache must re-list at {at}",
                w.start
            ));
            self.up.set_kvs(Self::cache_kvs(&self.truth, at), at);
            if self.rng.random_bool(0.5) {
                w.created();
            }
            w.compacted(compact);
            drop(w);
            settle().await;
            self.stats.relists += 1;
            w = self.next_opened().await?;
            if w.start != at + 1 {
                return Err(format!(
                    "after a re-list at {at} the cache watched from {}",
                    w.start
                ));
            }
            self.truth.cache_relists(at);
        } else {
            self.note(format!("reconnect from {}", w.start));
        }
        w.created();
        self.conn = Some(w);
        settle().await;
        // etcd#20221: the new watch may first repeat events the cache already has.
        let t = &self.truth;
        let old_revs: Vec<i64> = t
            .cache_revisions(0, t.applied)
            .into_iter()
            .rev()
            .take(self.rng.random_range(0..=3))
            .rev()
            .collect();
        let old: Vec<(EventType, KeyValue)> =
            old_revs.iter().flat_map(|&r| t.cache_events(r)).collect();
        let missed = t.cache_revisions(t.applied, t.etcd_rev);
        self.note(format!(
            "the new watch repeats {old_revs:?}, then sends {missed:?}"
        ));
        if missed.is_empty() {
            self.send(&[], old);
        } else {
            let split = self.rng.random_range(1..=missed.len());
            self.send(&missed[..split], old);
            for chunk in missed[split..].chunks(2) {
                self.send(chunk, Vec::new());
            }
        }
        Ok(())
    }
}
