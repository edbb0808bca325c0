//! The clients' actions: watches on new and open streams, reads of responses,
//! cancels, progress requests, dropped streams, `get`, time passing.

use super::*;

impl Model {
    pub(super) fn live_watches(&self) -> usize {
        let streams = self.streams.iter();
        streams.map(|s| s.watches.len() + s.canceling.len()).sum()
    }

    /// Live watches whose cancel was not asked: a canceled watch's slot is freed when
    /// its stream takes the cancel (at its next poll), before its `canceled` is read.
    pub(super) fn uncanceled_watches(&self) -> usize {
        self.streams.iter().map(|s| s.watches.len()).sum()
    }

    pub(super) fn pick_range(&mut self) -> Range {
        let all = self.truth.prefix.is_empty();
        let mut bounds: Vec<&str> = BOUNDS_APP.to_vec();
        if all {
            bounds.extend(BOUNDS_ALL);
            bounds.sort_unstable();
        }
        fn pick<'a>(rng: &mut StdRng, from: &[&'a str]) -> &'a str {
            from[rng.random_range(0..from.len())]
        }
        match self.rng.random_range(0..10) {
            0..=3 => {
                let mut keys: Vec<&str> = INSIDE.to_vec();
                keys.push("/app/z");
                if all {
                    keys.extend(OUTSIDE);
                }
                Range::Single(pick(&mut self.rng, &keys).to_owned())
            }
            4..=5 => {
                let mut prefixes = vec!["/app/a", "/app/a/", "/app/b", "/app/c", "/app/"];
                if all {
                    prefixes.extend(["", "/ap", "/zz"]);
                }
                Range::Prefix(pick(&mut self.rng, &prefixes).to_owned())
            }
            6..=7 => {
                let i = self.rng.random_range(0..bounds.len() - 1);
                let j = self.rng.random_range(i + 1..bounds.len());
                Range::Between(bounds[i].to_owned(), bounds[j].to_owned())
            }
            8 if all => Range::FromKey(pick(&mut self.rng, &bounds).to_owned()),
            9 if all => Range::All,
            _ => Range::Prefix("/app/".into()),
        }
    }

    pub(super) async fn open(&mut self) -> Check {
        if self.live_watches() >= 14 {
            return Ok(());
        }
        let range = self.pick_range();
        let (key, mut opts) = range.watch_options();
        let t = &self.truth;
        let connected = self.conn.is_some();
        // The start: from now, inside the window, below it, in the future.
        let start_opt = match self.rng.random_range(0..20) {
            0..=5 => 0,
            6..=12 => self.rng.random_range(t.floor..=t.applied + 1),
            13..=15 if t.floor > 1 => self.rng.random_range((t.floor - 5).max(1)..t.floor),
            _ => self.rng.random_range(t.applied + 2..=t.etcd_rev + 6),
        };
        opts = opts.with_start_revision(start_opt);
        let prev_kv = self.rng.random_bool(0.4);
        if prev_kv {
            opts = opts.with_prev_key();
        }
        let (no_put, no_delete) = match self.rng.random_range(0..10) {
            0 => (true, false),
            1 => (false, true),
            _ => (false, false),
        };
        let mut filters = Vec::new();
        if no_put {
            filters.push(WatchFilterType::NoPut);
        }
        if no_delete {
            filters.push(WatchFilterType::NoDelete);
        }
        if !filters.is_empty() {
            opts = opts.with_filters(filters);
        }
        let progress_notify = self.rng.random_bool(0.3);
        if progress_notify {
            opts = opts.with_progress_notify();
        }
        // Where: a new stream, or one that is open.
        let existing = (!self.streams.is_empty() && self.rng.random_bool(0.5))
            .then(|| self.rng.random_range(0..self.streams.len()));
        let chosen = match self.rng.random_range(0..10) {
            0 => self.rng.random_range(1..=12),
            1 => existing
                .and_then(|si| self.streams[si].watches.keys().next().copied())
                .unwrap_or(0),
            _ => 0,
        };
        if chosen != 0 {
            opts = opts.with_watch_id(chosen);
        }
        // What the model expects.
        let position = match start_opt {
            // From now: after the cluster's revision while connected (one barrier read), else
            // after the cache's.
            0 if connected => t.applied.max(t.etcd_rev),
            0 => t.applied,
            s => s - 1,
        };
        let compacted_at_creation = (start_opt != 0 && start_opt < t.floor).then_some(t.floor);
        let created_rev = if start_opt == 0 { position } else { t.applied };
        let template = Watch {
            label: String::new(),
            range: range.clone(),
            prev_kv,
            no_put,
            no_delete,
            progress_notify,
            created_rev,
            start: start_opt,
            compacted_at_creation,
            created: false,
            covered: position,
            cancel_requested: false,
            opening: false,
            skippable: 0,
        };
        let desc = format!(
            "{range:?} start {start_opt} (owed from {}){}{}{}{} id {chosen}{}",
            position + 1,
            if prev_kv { " prev_kv" } else { "" },
            if no_put { " no_put" } else { "" },
            if no_delete { " no_delete" } else { "" },
            if progress_notify { " progress" } else { "" },
            if compacted_at_creation.is_some() {
                " (below the window)"
            } else {
                ""
            }
        );
        match existing {
            None => self.open_stream(key, opts, template, chosen, &desc).await?,
            Some(si) => {
                let template = Watch {
                    opening: start_opt == 0 && connected,
                    ..template
                };
                if !self
                    .add_to_stream(si, key, opts, template, chosen, &desc)
                    .await?
                {
                    return Ok(());
                }
            }
        }
        self.stats.watches += 1;
        if self.cache.revision() != self.truth.applied {
            return Err("the cache moved while a watch was registered".into());
        }
        Ok(())
    }

    /// Opens a new stream with its first watch, `template` (given its label here).
    async fn open_stream(
        &mut self,
        key: String,
        opts: WatchOptions,
        template: Watch,
        chosen: i64,
        desc: &str,
    ) -> Check {
        let stream = bounded("watch", self.cache.watch(key, Some(opts)))
            .await?
            .map_err(|e| format!("watch {desc} refused: {e}"))?;
        let name = self.next_stream;
        self.next_stream += 1;
        let id = chosen;
        let slow = self.rng.random_bool(0.4);
        let mut s = Stream {
            name,
            stream,
            watches: BTreeMap::new(),
            canceling: Vec::new(),
            // The first auto id (0) was given to this watch.
            next_id: if chosen == 0 { 1 } else { 0 },
            reported: 0,
            progress_pending: 0,
            slow,
        };
        let label = format!("s{name}/w{id}");
        s.watches.insert(id, Watch { label, ..template });
        self.note(format!(
            "open stream s{name}{} with watch {id}: {desc}",
            if slow { " (slow)" } else { "" }
        ));
        self.streams.push(s);
        Ok(())
    }

    /// Adds watch `template` to open stream `si` under `chosen` (0: the stream's next
    /// automatic id, as etcd gives it); `Ok(false)`: refused, as it must be, for an id
    /// in use.
    async fn add_to_stream(
        &mut self,
        si: usize,
        key: String,
        opts: WatchOptions,
        template: Watch,
        chosen: i64,
        desc: &str,
    ) -> Result<bool, String> {
        let s = &mut self.streams[si];
        // As etcd: an auto id is the lowest above every id given on the stream
        // so far (never one reused), skipping ids in use.
        let id = if chosen != 0 {
            chosen
        } else {
            while s.watches.contains_key(&s.next_id) {
                s.next_id += 1;
            }
            s.next_id += 1;
            s.next_id - 1
        };
        let in_use = s.watches.contains_key(&id);
        let name = s.name;
        let result = bounded("watch", s.stream.watch(key, Some(opts))).await?;
        match (result, in_use) {
            (Err(Error::WatchIdInUse { watch_id }), true) if watch_id == id => {
                self.note(format!("add to s{name}: id {id} in use, refused: {desc}"));
                return Ok(false);
            }
            (Ok(()), false) => {}
            (r, _) => {
                return Err(format!(
                    "adding watch {id} to s{name} (in use: {in_use}): {desc}: {r:?}"
                ))
            }
        }
        let label = format!("s{name}/w{id}");
        self.streams[si]
            .watches
            .insert(id, Watch { label, ..template });
        self.note(format!("add to s{name} watch {id}: {desc}"));
        Ok(true)
    }

    /// The next response of stream `si` if one is ready. Polled three times: a stream
    /// may wake itself and answer on the next poll (a progress request that waited for
    /// a new revision, a watch woken while the stream was being polled).
    pub(super) async fn ready_response(
        &mut self,
        si: usize,
    ) -> Option<Result<Option<WatchResponse>>> {
        for _ in 0..3 {
            if let Some(r) = now(&mut self.streams[si].stream) {
                return Some(r);
            }
            tokio::task::yield_now().await;
        }
        None
    }

    pub(super) async fn read(&mut self) -> Check {
        if self.streams.is_empty() {
            return Ok(());
        }
        let si = self.rng.random_range(0..self.streams.len());
        if self.streams[si].slow && !self.rng.random_bool(0.15) {
            return Ok(());
        }
        let k = self.rng.random_range(1..=6);
        self.read_from(si, k).await
    }

    /// Every stream that is not slow reads a little.
    pub(super) async fn read_fast_streams(&mut self) -> Check {
        for si in 0..self.streams.len() {
            if !self.streams[si].slow {
                let k = self.rng.random_range(1..=3);
                self.read_from(si, k).await?;
            }
        }
        Ok(())
    }

    /// Reads up to `k` responses of stream `si` that are ready.
    pub(super) async fn read_from(&mut self, si: usize, k: usize) -> Check {
        for _ in 0..k {
            match self.ready_response(si).await {
                Some(Ok(None)) => {
                    self.check_end(si)?;
                    break;
                }
                Some(r) => self.check_response(si, r)?,
                None => break,
            }
        }
        Ok(())
    }

    pub(super) async fn cancel(&mut self) -> Check {
        if self.streams.is_empty() {
            return Ok(());
        }
        let si = self.rng.random_range(0..self.streams.len());
        let s = &mut self.streams[si];
        let mut ids: Vec<i64> = s
            .watches
            .iter()
            .filter(|(_, w)| !w.cancel_requested)
            .map(|(id, _)| *id)
            .collect();
        ids.sort_unstable();
        let id = if ids.is_empty() || self.rng.random_bool(0.1) {
            // An id not in use: ignored, as etcd ignores it.
            99
        } else {
            ids[self.rng.random_range(0..ids.len())]
        };
        bounded("cancel", s.stream.cancel(id))
            .await?
            .map_err(|e| format!("cancel: {e}"))?;
        if let Some(mut w) = s.watches.remove(&id) {
            w.cancel_requested = true;
            s.canceling.push((id, w));
        }
        self.stats.cancels += 1;
        let name = s.name;
        self.note(format!("cancel s{name}/w{id}"));
        Ok(())
    }

    pub(super) async fn request_progress(&mut self) -> Check {
        if self.streams.is_empty() {
            return Ok(());
        }
        let si = self.rng.random_range(0..self.streams.len());
        let s = &mut self.streams[si];
        bounded("request_progress", s.stream.request_progress())
            .await?
            .map_err(|e| format!("request_progress: {e}"))?;
        s.progress_pending += 1;
        let name = s.name;
        self.note(format!("s{name} requests progress"));
        Ok(())
    }

    pub(super) fn drop_stream(&mut self) -> Check {
        if self.streams.is_empty() {
            return Ok(());
        }
        let si = self.rng.random_range(0..self.streams.len());
        let s = self.streams.swap_remove(si);
        self.note(format!("drop s{} ({} watches)", s.name, s.watches.len()));
        Ok(())
    }

    pub(super) async fn pass_time(&mut self) -> Check {
        let d = Duration::from_millis(self.rng.random_range(10..=2000));
        self.note(format!("{d:?} pass"));
        tokio::time::advance(d).await;
        Ok(())
    }

    // ----- reads -----

    pub(super) async fn get(&mut self) -> Check {
        self.stats.reads += 1;
        let range = self.pick_range();
        let (key, mut opts) = range.get_options();
        let t = &self.truth;
        let current = self.conn.is_some() && t.applied == t.etcd_rev;
        let (revision, consistent) = match self.rng.random_range(0..20) {
            0..=6 => (0, false),
            7..=12 => (
                self.rng.random_range((t.floor - 1).max(1)..=t.applied),
                false,
            ),
            13..=14 if t.floor > 2 => (
                self.rng.random_range((t.floor - 5).max(1)..t.floor - 1),
                false,
            ),
            15..=16 => (
                self.rng.random_range(t.etcd_rev + 1..=t.etcd_rev + 3),
                false,
            ),
            _ if current => (0, true),
            _ => (0, false),
        };
        if !consistent {
            opts = opts.with_serializable();
        }
        if revision > 0 {
            opts = opts.with_revision(revision);
        }
        let limit = if self.rng.random_bool(0.3) {
            self.rng.random_range(1..=3)
        } else {
            0
        };
        if limit > 0 {
            opts = opts.with_limit(limit);
        }
        let got = bounded("get", self.cache.get(key, Some(opts))).await?;
        let t = &self.truth;
        let what = format!(
            "get {range:?} at {revision}{} limit {limit}",
            if consistent { " (consistent)" } else { "" }
        );
        if revision > t.etcd_rev {
            return match got {
                Err(Error::FutureRevision { .. }) => Ok(()),
                other => Err(format!("{what}: beyond etcd's {}: {other:?}", t.etcd_rev)),
            };
        }
        if revision > 0 && revision + 1 < t.floor {
            return match got {
                Err(Error::Compacted { compact_revision }) if compact_revision == t.floor => Ok(()),
                other => Err(format!(
                    "{what}: below the window (floor {}) must be Compacted: {other:?}",
                    t.floor
                )),
            };
        }
        let at = if revision == 0 { t.applied } else { revision };
        let all: Vec<KeyValue> = t
            .state_at(at)
            .iter()
            .filter(|(k, _)| t.in_cache(k) && range.contains(k))
            .map(|(_, kv)| kv.clone())
            .collect();
        let count = all.len() as i64;
        let more = limit > 0 && all.len() > limit as usize;
        let want: Vec<KeyValue> = all
            .into_iter()
            .take(if limit > 0 {
                limit as usize
            } else {
                usize::MAX
            })
            .collect();
        let r = got.map_err(|e| format!("{what}: {e}"))?;
        if r.revision() != at || r.kvs() != &want[..] || r.count() != count || r.more() != more {
            return Err(format!(
                "{what}: got revision {} {:?} count {} more {}, want revision {at} {want:?} count {count} more {more}",
                r.revision(),
                r.kvs(),
                r.count(),
                r.more()
            ));
        }
        self.note(format!("{what}: {} keys, as the truth at {at}", want.len()));
        Ok(())
    }
}
