//! The migration guide, measured: one module written against etcd-client 0.21
//! (`migration/before.rs`) and the same module ported to etcd-cache
//! (`migration/after.rs`) are compiled here, run side by side against one real etcd on
//! one scripted workload, and must observe the same things. The number of lines the port
//! changes is computed and asserted, and `docs/MIGRATING.md` must show the module and
//! that diff as they are (so the guide cannot rot).
//!
//! `cargo test --test migration -- --nocapture` prints the diff and what both saw.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use testkit::EtcdOptions;

/// The module as written against etcd-client 0.21: a per-key watcher multiplexed on one
/// watch stream, and a get-then-watch mirror that re-lists after compaction.
#[path = "migration/before.rs"]
mod before;

/// The same module on etcd-cache: only the imports and the type holding the client differ.
#[path = "migration/after.rs"]
mod after;

/// The remaining differences that `docs/MIGRATING.md` lists, checked.
#[path = "migration/differences.rs"]
mod differences;

const BEFORE: &str = include_str!("migration/before.rs");
const AFTER: &str = include_str!("migration/after.rs");
const GUIDE: &str = include_str!("../docs/MIGRATING.md");
const README: &str = include_str!("../README.md");

/// The most lines the port may change: the two `use` lines and the three lines that
/// name the client's type (`KeyWatcher::start`'s parameter, `Mirror`'s field and
/// `Mirror::new`'s parameter).
const CHANGED_LINES: usize = 5;

// -- the line diff ------------------------------------------------------------------

/// One line of a diff.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Line<'a> {
    Same,
    Removed(usize, &'a str),
    Added(usize, &'a str),
}

/// A line diff of `a` and `b` by longest common subsequence (line numbers from 1).
fn line_diff<'a>(a: &[&'a str], b: &[&'a str]) -> Vec<Line<'a>> {
    // lcs[i][j]: the LCS length of a[i..] and b[j..].
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            out.push(Line::Same);
            (i, j) = (i + 1, j + 1);
        } else if j == b.len() || (i < a.len() && lcs[i + 1][j] >= lcs[i][j + 1]) {
            out.push(Line::Removed(i + 1, a[i]));
            i += 1;
        } else {
            out.push(Line::Added(j + 1, b[j]));
            j += 1;
        }
    }
    out
}

/// The diff as a unified diff without context lines (`@@ -3,2 +3,2 @@` hunks).
fn unified(diff: &[Line<'_>]) -> String {
    let mut out = String::new();
    let mut k = 0;
    while k < diff.len() {
        if diff[k] == Line::Same {
            k += 1;
            continue;
        }
        let hunk: Vec<Line<'_>> = diff[k..]
            .iter()
            .copied()
            .take_while(|l| *l != Line::Same)
            .collect();
        k += hunk.len();
        let removed: Vec<(usize, &str)> = hunk
            .iter()
            .filter_map(|l| match l {
                Line::Removed(n, s) => Some((*n, *s)),
                _ => None,
            })
            .collect();
        let added: Vec<(usize, &str)> = hunk
            .iter()
            .filter_map(|l| match l {
                Line::Added(n, s) => Some((*n, *s)),
                _ => None,
            })
            .collect();
        let start = |lines: &[(usize, &str)]| lines.first().map_or(0, |l| l.0);
        out += &format!(
            "@@ -{},{} +{},{} @@\n",
            start(&removed),
            removed.len(),
            start(&added),
            added.len()
        );
        for (_, s) in &removed {
            out += &format!("-{s}\n");
        }
        for (_, s) in &added {
            out += &format!("+{s}\n");
        }
    }
    out
}

/// What a line of the etcd-client version becomes in the etcd-cache version.
fn ported(line: &str) -> String {
    line.replace("etcd_client::", "etcd_cache::")
        .replace("Client", "Cache")
}

#[test]
fn the_port_changes_only_the_imports_and_the_client_type() {
    let (a, b): (Vec<&str>, Vec<&str>) = (BEFORE.lines().collect(), AFTER.lines().collect());
    let diff = line_diff(&a, &b);
    let removed: Vec<(usize, &str)> = diff
        .iter()
        .filter_map(|l| match l {
            Line::Removed(n, s) => Some((*n, *s)),
            _ => None,
        })
        .collect();
    let added: Vec<(usize, &str)> = diff
        .iter()
        .filter_map(|l| match l {
            Line::Added(n, s) => Some((*n, *s)),
            _ => None,
        })
        .collect();
    let text = unified(&diff);
    println!(
        "migration: {} of {} lines changed ({} removed, {} added):\n{text}",
        removed.len().max(added.len()),
        a.len(),
        removed.len(),
        added.len()
    );
    assert!(
        removed.len() <= CHANGED_LINES && added.len() <= CHANGED_LINES,
        "the port changes more than the imports and the client type:\n{text}"
    );
    assert_eq!(removed.len(), added.len(), "{text}");
    for ((n, old), (m, new)) in removed.iter().zip(&added) {
        assert_eq!(n, m, "a changed line moved:\n{text}");
        assert_eq!(
            ported(old),
            *new,
            "line {n} changes more than the crate and the client type"
        );
        assert!(
            old.starts_with("use etcd_client::") || old.contains("Client"),
            "line {n} is neither an import nor the client's type: {old}"
        );
    }
    // The guide shows this very module and this very diff.
    assert!(
        GUIDE.contains(BEFORE),
        "docs/MIGRATING.md must contain tests/migration/before.rs verbatim"
    );
    assert!(
        GUIDE.contains(&text),
        "docs/MIGRATING.md must contain the diff verbatim:\n{text}"
    );
    let count = format!(
        "**{} of {} lines**",
        removed.len().max(added.len()),
        a.len()
    );
    assert!(
        GUIDE.contains(&count),
        "docs/MIGRATING.md must state the count as {count}"
    );
    let claim = format!(
        "the port changes {} of its {} lines",
        removed.len().max(added.len()),
        a.len()
    );
    assert!(
        README.contains(&claim),
        "README.md must state the count as \"{claim}\""
    );
}

#[test]
fn the_line_diff_counts_changed_lines() {
    let a = ["a", "b", "c", "d"];
    let b = ["a", "x", "c", "d", "e"];
    let diff = line_diff(&a, &b);
    assert_eq!(
        unified(&diff),
        "@@ -2,1 +2,1 @@\n-b\n+x\n@@ -0,0 +5,1 @@\n+e\n"
    );
    assert!(line_diff(&a, &a).iter().all(|l| *l == Line::Same));
}

// -- running both against etcd -------------------------------------------------------

/// Every step waits at most this long for what it expects.
const STEP: Duration = Duration::from_secs(20);
/// The cache's history window: the workload's gap writes more revisions than this, so
/// the mirror's resume revision leaves the window as etcd's compaction removes it.
const WINDOW: usize = 8;
const PREFIX: &str = "/mig/";

/// One observed change, without its key.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    value: Option<String>,
    prev: Option<String>,
    revision: i64,
}

/// Per key, the changes in the order they came.
type PerKey = BTreeMap<String, Vec<Seen>>;

/// A mirror's changes: key and what it saw.
type Changes = Vec<(String, Seen)>;

/// The two versions of `KeyWatcher` behind one interface, so that the test drives both
/// the same way. Errors are failures of the test.
trait KeyWatch {
    const NAME: &'static str;
    async fn changes(&mut self) -> Vec<(String, Seen)>;
    async fn add(&mut self, key: &str);
    async fn remove(&mut self, key: &str) -> bool;
    async fn request_progress(&mut self);
    fn watching(&self) -> Vec<String>;
    fn progress(&self) -> Vec<i64>;
}

/// The two versions of `Mirror`.
trait Mirrors {
    async fn sync(&mut self, until: i64);
    fn kvs(&self) -> BTreeMap<String, String>;
    fn revision(&self) -> i64;
    fn changes(&self) -> Changes;
    fn relists(&self) -> Vec<(i64, String)>;
}

macro_rules! drive {
    ($m:ident) => {
        impl KeyWatch for $m::KeyWatcher {
            const NAME: &'static str = stringify!($m);
            async fn changes(&mut self) -> Vec<(String, Seen)> {
                let next = tokio::time::timeout(STEP, self.next())
                    .await
                    .unwrap_or_else(|_| panic!("{}: no response within {STEP:?}", Self::NAME));
                let changes = next
                    .unwrap_or_else(|e| panic!("{}: watch failed: {e}", Self::NAME))
                    .unwrap_or_else(|| panic!("{}: the watch stream ended", Self::NAME));
                changes
                    .into_iter()
                    .map(|c| {
                        let seen = Seen {
                            value: c.value,
                            prev: c.prev,
                            revision: c.revision,
                        };
                        (c.key, seen)
                    })
                    .collect()
            }
            async fn add(&mut self, key: &str) {
                $m::KeyWatcher::add(self, key)
                    .await
                    .unwrap_or_else(|e| panic!("{}: add {key}: {e}", Self::NAME))
            }
            async fn remove(&mut self, key: &str) -> bool {
                $m::KeyWatcher::remove(self, key)
                    .await
                    .unwrap_or_else(|e| panic!("{}: remove {key}: {e}", Self::NAME))
            }
            async fn request_progress(&mut self) {
                $m::KeyWatcher::request_progress(self)
                    .await
                    .unwrap_or_else(|e| panic!("{}: request_progress: {e}", Self::NAME))
            }
            fn watching(&self) -> Vec<String> {
                $m::KeyWatcher::watching(self)
            }
            fn progress(&self) -> Vec<i64> {
                self.progress.clone()
            }
        }

        impl Mirrors for $m::Mirror {
            async fn sync(&mut self, until: i64) {
                tokio::time::timeout(STEP, $m::Mirror::sync(self, until))
                    .await
                    .unwrap_or_else(|_| {
                        panic!("{}: sync({until}) took over {STEP:?}", stringify!($m))
                    })
                    .unwrap_or_else(|e| panic!("{}: sync({until}): {e}", stringify!($m)))
            }
            fn kvs(&self) -> BTreeMap<String, String> {
                self.kvs.clone()
            }
            fn revision(&self) -> i64 {
                self.revision
            }
            fn changes(&self) -> Changes {
                self.changes
                    .iter()
                    .map(|c| {
                        let seen = Seen {
                            value: c.value.clone(),
                            prev: c.prev.clone(),
                            revision: c.revision,
                        };
                        (c.key.clone(), seen)
                    })
                    .collect()
            }
            fn relists(&self) -> Vec<(i64, String)> {
                self.relists.clone()
            }
        }
    };
}

drive!(before);
drive!(after);

/// A key watcher and what it has seen so far.
struct Watched<W> {
    watcher: W,
    seen: PerKey,
}

impl<W: KeyWatch> Watched<W> {
    async fn add(&mut self, key: &str) {
        KeyWatch::add(&mut self.watcher, key).await;
    }

    async fn remove(&mut self, key: &str) -> bool {
        KeyWatch::remove(&mut self.watcher, key).await
    }

    async fn take_one(&mut self) {
        for (key, seen) in self.watcher.changes().await {
            self.seen.entry(key).or_default().push(seen);
        }
    }

    /// Handles responses until the watcher watches `watching` and has seen `want`.
    async fn until(&mut self, watching: &BTreeSet<String>, want: &PerKey) {
        let watching: Vec<String> = watching.iter().cloned().collect();
        while KeyWatch::watching(&self.watcher) != watching || self.seen != *want {
            let more = want
                .iter()
                .any(|(k, v)| self.seen.get(k).map_or(0, Vec::len) > v.len())
                || self.seen.keys().any(|k| !want.contains_key(k));
            assert!(
                !more,
                "{} saw changes that it should not have:\n  saw  {:?}\n  want {want:?}",
                W::NAME,
                self.seen
            );
            self.take_one().await;
        }
    }

    /// Asks for progress and handles responses until the answer came.
    async fn progress(&mut self) -> i64 {
        let before = self.watcher.progress().len();
        KeyWatch::request_progress(&mut self.watcher).await;
        while self.watcher.progress().len() == before {
            self.take_one().await;
        }
        self.watcher.progress()[before]
    }
}

/// The scripted writes, through a plain client, and what each module should observe.
struct Workload {
    client: etcd_client::Client,
    /// etcd's contents under the prefix.
    values: BTreeMap<String, String>,
    /// The keys the key watchers watch now.
    watched: BTreeSet<String>,
    keys_want: PerKey,
    /// The mirror follows (false before its first list and during the gap).
    following: bool,
    mirror_want: Changes,
    last: i64,
}

impl Workload {
    fn record(&mut self, key: &str, value: Option<String>, revision: i64) {
        let prev = match &value {
            Some(v) => self.values.insert(key.to_owned(), v.clone()),
            None => self.values.remove(key),
        };
        let seen = Seen {
            value,
            prev,
            revision,
        };
        if self.watched.contains(key) {
            self.keys_want
                .entry(key.to_owned())
                .or_default()
                .push(seen.clone());
        }
        if self.following {
            self.mirror_want.push((key.to_owned(), seen));
        }
        self.last = revision;
    }

    async fn put(&mut self, key: &str, value: &str) {
        let resp = self.client.put(key, value, None).await.expect("put");
        let revision = resp.header().expect("header").revision();
        self.record(key, Some(value.to_owned()), revision);
    }

    async fn delete(&mut self, key: &str) {
        let resp = self.client.delete(key, None).await.expect("delete");
        assert_eq!(resp.deleted(), 1, "the workload deletes existing keys");
        let revision = resp.header().expect("header").revision();
        self.record(key, None, revision);
    }
}

fn key(name: &str) -> String {
    format!("{PREFIX}keys/{name}")
}

fn mirror_key(name: &str) -> String {
    format!("{PREFIX}m/{name}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn before_and_after_observe_the_same_on_etcd() {
    testkit::init_tracing();
    testkit::bounded(Duration::from_secs(120), async {
        let (_etcd, client) = testkit::etcd_with_client(EtcdOptions::default()).await;
        let cache = testkit::ready_cache(client.clone(), |b| {
            b.prefix(PREFIX).history_window(WINDOW)
        })
        .await;
        let mut w = Workload {
            client: client.clone(),
            values: BTreeMap::new(),
            watched: BTreeSet::new(),
            keys_want: PerKey::new(),
            following: false,
            mirror_want: Vec::new(),
            last: 0,
        };

        // -- the key watcher: three keys on one stream ------------------------------
        let (a, b, c, d) = (key("a"), key("b"), key("c"), key("d"));
        let mut kb = Watched {
            watcher: before::KeyWatcher::start(&mut client.clone(), &a)
                .await
                .expect("before: start"),
            seen: PerKey::new(),
        };
        let mut ka = Watched {
            watcher: after::KeyWatcher::start(&mut cache.clone(), &a)
                .await
                .expect("after: start"),
            seen: PerKey::new(),
        };
        // Added back to back: the `created` responses must come in request order.
        for k in [&b, &c] {
            kb.add(k).await;
            ka.add(k).await;
        }
        w.watched.extend([a.clone(), b.clone(), c.clone()]);
        kb.until(&w.watched, &w.keys_want).await;
        ka.until(&w.watched, &w.keys_want).await;

        w.put(&a, "a1").await;
        w.put(&b, "b1").await;
        w.put(&c, "c1").await;
        w.put(&a, "a2").await;
        w.delete(&b).await;
        w.put(&key("unwatched"), "z").await;
        w.put(&c, "c2").await;
        kb.until(&w.watched, &w.keys_want).await;
        ka.until(&w.watched, &w.keys_want).await;

        // A progress response for the whole stream, at the newest revision.
        let (pb, pa) = (kb.progress().await, ka.progress().await);
        println!("progress: etcd-client {pb}, etcd-cache {pa}, last write {}", w.last);
        assert_eq!((pb, pa), (w.last, w.last), "progress revisions");

        // Cancel one watch by its id; a key that is not watched is not cancelled.
        assert!(kb.remove(&b).await && ka.remove(&b).await);
        assert!(!kb.remove(&d).await && !ka.remove(&d).await);
        w.watched.remove(&b);
        kb.until(&w.watched, &w.keys_want).await;
        ka.until(&w.watched, &w.keys_want).await;

        // Watch b again and d, back to back, then write to all of them.
        for k in [&b, &d] {
            kb.add(k).await;
            ka.add(k).await;
        }
        w.watched.extend([b.clone(), d.clone()]);
        kb.until(&w.watched, &w.keys_want).await;
        ka.until(&w.watched, &w.keys_want).await;
        w.put(&d, "d1").await;
        w.put(&b, "b3").await;
        w.delete(&a).await;
        w.put(&c, "c3").await;
        kb.until(&w.watched, &w.keys_want).await;
        ka.until(&w.watched, &w.keys_want).await;

        // Cancel d: if the ids were mapped to the wrong keys, b would go instead.
        assert!(kb.remove(&d).await && ka.remove(&d).await);
        w.watched.remove(&d);
        kb.until(&w.watched, &w.keys_want).await;
        ka.until(&w.watched, &w.keys_want).await;
        w.put(&d, "d2").await;
        w.put(&b, "b4").await;
        kb.until(&w.watched, &w.keys_want).await;
        ka.until(&w.watched, &w.keys_want).await;

        // -- the mirror: list, then follow ----------------------------------------------
        let mut mb = before::Mirror::new(client.clone(), PREFIX);
        let mut ma = after::Mirror::new(cache.clone(), PREFIX);
        Mirrors::sync(&mut mb, w.last).await;
        Mirrors::sync(&mut ma, w.last).await;
        for m in [&mb as &dyn MirrorView, &ma] {
            assert_eq!(m.view().0, w.values, "{}: the first list", m.name());
            assert_eq!(m.view().1, w.last, "{}: the list's revision", m.name());
        }
        w.following = true;
        w.put(&mirror_key("x"), "x1").await;
        w.put(&mirror_key("y"), "y1").await;
        w.delete(&mirror_key("x")).await;
        w.put(&mirror_key("k0"), "k0").await;
        Mirrors::sync(&mut mb, w.last).await;
        Mirrors::sync(&mut ma, w.last).await;
        assert_eq!(Mirrors::changes(&mb), w.mirror_want, "before: changes");
        assert_eq!(Mirrors::changes(&ma), w.mirror_want, "after: changes");

        // -- the gap: the resume revision is compacted ------------------------------------
        w.following = false;
        let resume = w.last + 1;
        for i in 0..(WINDOW + 4) {
            w.put(&mirror_key(&format!("k{}", i % 3)), &format!("gap{i}"))
                .await;
        }
        // etcd-client's mirror resumes below etcd's compaction; etcd-cache's below the
        // cache's history window (which the gap has outgrown once the cache applied it).
        w.client.compact(w.last, None).await.expect("compact");
        tokio::time::timeout(STEP, cache.wait_for_revision(w.last))
            .await
            .expect("the cache applies the gap")
            .expect("wait_for_revision");
        let floor = cache.history_span().0;
        println!("gap: resume at {resume}, etcd compacted at {}, cache window from {floor}", w.last);
        assert!(resume < floor, "the gap must outgrow the window");
        Mirrors::sync(&mut mb, w.last).await;
        Mirrors::sync(&mut ma, w.last).await;
        let (rb, ra) = (mb.relists(), ma.relists());
        println!("re-lists: etcd-client {rb:?}, etcd-cache {ra:?}");
        assert_eq!(rb.len(), 1, "etcd-client: one re-list");
        assert_eq!(ra.len(), 1, "etcd-cache: one re-list");
        assert_eq!(rb[0].0, w.last, "etcd's compact_revision is its compaction");
        // The resume is below both the window (floor) and etcd's compaction: the cache
        // reports the higher, etcd's (it follows etcd's compaction).
        assert!(floor < w.last, "the compaction is above the window's floor");
        assert_eq!(ra[0].0, w.last, "the cache's compact_revision is etcd's compaction");
        assert_eq!(
            ra[0].1, "mvcc: required revision has been compacted",
            "etcd-cache's cancel reason"
        );
        for m in [&mb as &dyn MirrorView, &ma] {
            assert_eq!(m.view().0, w.values, "{}: after the re-list", m.name());
            assert_eq!(m.view().1, w.last, "{}: the re-list's revision", m.name());
        }

        // -- after the re-list, following again ----------------------------------------
        w.following = true;
        w.put(&mirror_key("z"), "z1").await;
        w.delete(&mirror_key("k0")).await;
        Mirrors::sync(&mut mb, w.last).await;
        Mirrors::sync(&mut ma, w.last).await;
        assert_eq!(Mirrors::changes(&mb), w.mirror_want, "before: changes");
        assert_eq!(Mirrors::changes(&ma), w.mirror_want, "after: changes");
        for m in [&mb as &dyn MirrorView, &ma] {
            assert_eq!(m.view().0, w.values, "{}: the end", m.name());
        }

        // -- the same observations -----------------------------------------------------
        kb.until(&w.watched, &w.keys_want).await;
        ka.until(&w.watched, &w.keys_want).await;
        assert_eq!(kb.seen, ka.seen);
        assert_eq!(Mirrors::changes(&mb), Mirrors::changes(&ma));
        println!(
            "both saw: {} key changes over {} keys, {} mirror changes, {} re-list(s), up to revision {}",
            kb.seen.values().map(Vec::len).sum::<usize>(),
            kb.seen.len(),
            w.mirror_want.len(),
            rb.len(),
            w.last
        );
        cache.close().await;
    })
    .await;
}

/// A mirror's state, for checks that loop over both.
trait MirrorView {
    fn name(&self) -> &'static str;
    fn view(&self) -> (BTreeMap<String, String>, i64);
}

impl MirrorView for before::Mirror {
    fn name(&self) -> &'static str {
        "before"
    }
    fn view(&self) -> (BTreeMap<String, String>, i64) {
        (self.kvs(), self.revision())
    }
}

impl MirrorView for after::Mirror {
    fn name(&self) -> &'static str {
        "after"
    }
    fn view(&self) -> (BTreeMap<String, String>, i64) {
        (self.kvs(), self.revision())
    }
}
