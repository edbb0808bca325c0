//! Every read path of the crate against etcd's own scan, after each of many acknowledged
//! writes, on the run's etcd (`ETCD_VERSION`: 3.4.23, where stream-wide progress is not
//! trusted, and 3.7, where it is; `cargo xtask test` runs it on both).
//!
//! A cache on `/i/`, a typed view of `/i/v/` with two indexes (an owner and a list of
//! tags), seeded random puts, deletes, range deletes and transactions inside and outside
//! the view, and a background writer putting a key outside the cache every few
//! milliseconds, so that etcd's revision moves where the cache sees nothing. After each
//! write (acknowledged at revision `w`) every read path answers: the cache's `get` (the
//! cache's prefix and one key), the view's `get`, `list`, `range` (a part of the view)
//! and `by_index` (both indexes), and the first `InitDone` of a fresh `list_watch`
//! (typed and untyped). Each answer must report a revision `>= w` (a consistent read
//! sees every write acknowledged before it), and its items must be exactly etcd's Range
//! at that revision, filtered the same way: one revision, and its data. (The view's
//! `get` reports no revision: it must hold the key as one of the revisions it may have
//! read.)
//!
//! The reads of a round run all at once, or one after the other, or (every other round)
//! all at once beside the next write, a big transaction, while probes read each cache
//! again and again until it has applied that write: the rounds where the view changes
//! under a read. Two caches run side by side: one with the default
//! `ProgressTrust::Auto` (on a fixed etcd: reads wait for trusted progress answers, or
//! the revision probe finds the cache current) and one with `ProgressTrust::Never`
//! (reads the cache cannot show current fall back to etcd), so each version runs every
//! read strategy it has.
//!
//! The run is bounded by writes, not by time: 1,000 by default. The long form, with
//! `ETCD_CACHE_DIFF_WRITES` writes (default 20,000); `ETCD_CACHE_SEED` replays a seed:
//! `cargo test --release --test read_differential -- --ignored --nocapture`.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_cache::{
    decode_with, Cache, GetOptions, KeyValue, ListItem, ListWatch, ListWatchEvent, ProgressTrust,
    TypedKv, TypedView,
};
use etcd_client::{Client, DeleteOptions, GetOptions as EtcdGet, Txn, TxnOp};
use testkit::EtcdOptions;

/// The cache's prefix.
const CACHE: &str = "/i/";
/// The typed view's prefix (inside the cache's).
const VIEW: &str = "/i/v/";
/// Inside the cache, outside the view.
const OTHER: &str = "/i/other/";
/// Outside the cache: moves etcd's revision where the cache sees nothing.
const NOISE: &str = "/elsewhere/noise";
/// How often the background writer puts [`NOISE`].
const NOISE_EVERY: Duration = Duration::from_millis(3);
/// Keys of the view the writes pick from.
const KEYS: u64 = 24;
const OWNERS: [&str; 3] = ["ann", "bob", "cy"];
const TAGS: [&str; 4] = ["gold", "blue", "red", "new"];
/// Writes of the default run.
const WRITES: usize = 1_000;
/// Keys a big transaction changes (`/i/v/b00` ...).
const BIG: usize = 48;
/// Probes of each cache in a racing round.
const PROBES: usize = 4;
/// Reads of a probe after the racing write is acknowledged, at most.
const AFTER_ACK: usize = 8;
/// How long one read may take before the test calls it hung.
const READ_LIMIT: Duration = Duration::from_secs(20);

#[derive(Debug, serde::Deserialize)]
struct Obj {
    owner: String,
    tags: Vec<String>,
}

/// The owner index's keys of an object.
fn owner_keys(o: &Obj) -> Vec<String> {
    vec![o.owner.clone()]
}

/// The tag index's keys of an object.
fn tag_keys(o: &Obj) -> Vec<String> {
    o.tags.clone()
}

fn decode(value: &[u8]) -> Option<Obj> {
    serde_json::from_slice(value).ok()
}

/// The typed view of `/i/v/` with its two indexes.
fn view_of(cache: &Cache) -> TypedView<Obj> {
    cache
        .typed(decode_with(|kv: &KeyValue| {
            Ok(serde_json::from_slice::<Obj>(kv.value())?)
        }))
        .prefix(VIEW)
        .index("owner", owner_keys)
        .index("tag", tag_keys)
        .build()
        .expect("the typed view")
}

/// A small seeded generator (no dependency; the same sequence on every platform).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<'a>(&mut self, of: &[&'a str]) -> &'a str {
        of[self.below(of.len() as u64) as usize]
    }

    fn view_key(&mut self) -> String {
        format!("{VIEW}k{:02}", self.below(KEYS))
    }

    /// A value: mostly an object, sometimes one that does not decode.
    fn value(&mut self, i: usize) -> String {
        if self.below(20) == 0 {
            return format!("not json {i}");
        }
        let owner = self.pick(&OWNERS);
        let tags: Vec<String> = TAGS
            .iter()
            .filter(|_| self.below(3) == 0)
            .map(|t| format!("{t:?}"))
            .collect();
        format!(
            r#"{{"owner":"{owner}","tags":[{}],"i":{i}}}"#,
            tags.join(",")
        )
    }
}

/// The seed: `ETCD_CACHE_SEED` to replay one, otherwise from the clock.
fn seed() -> u64 {
    match std::env::var("ETCD_CACHE_SEED") {
        Ok(s) if !s.trim().is_empty() => s.trim().parse().expect("ETCD_CACHE_SEED is a u64"),
        _ => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64),
    }
}

/// A big transaction, acknowledged: many keys of the view (`/i/v/b00` ...) put or
/// deleted in one revision, a watch response that takes the cache a while to apply.
async fn write_big(client: &mut Client, rng: &mut Rng, i: usize) -> i64 {
    let ops: Vec<TxnOp> = (0..BIG)
        .map(|b| {
            let key = format!("{VIEW}b{b:02}");
            if rng.below(4) == 0 {
                TxnOp::delete(key, None)
            } else {
                TxnOp::put(key, rng.value(i), None)
            }
        })
        .collect();
    let resp = client.txn(Txn::new().and_then(ops)).await.expect("big txn");
    resp.header().expect("a header").revision()
}

/// One seeded write (a put, a delete, a range delete or a transaction in the view, or a
/// put in the cache outside it), acknowledged; returns the revision etcd acknowledged
/// it at.
async fn write(client: &mut Client, rng: &mut Rng, i: usize) -> i64 {
    let header = match rng.below(100) {
        0..=44 => {
            let key = rng.view_key();
            let value = rng.value(i);
            client
                .put(key, value, None)
                .await
                .expect("put")
                .header()
                .cloned()
        }
        45..=64 => {
            let key = rng.view_key();
            client
                .delete(key, None)
                .await
                .expect("delete")
                .header()
                .cloned()
        }
        65..=69 => {
            // A range delete: several keys in one revision.
            let key = format!("{VIEW}k{}", rng.below(3));
            let options = DeleteOptions::new().with_prefix();
            client
                .delete(key, Some(options))
                .await
                .expect("range delete")
                .header()
                .cloned()
        }
        70..=89 => {
            // A transaction: several changes, in and out of the view, in one revision.
            let mut ops = Vec::new();
            let mut keys = std::collections::BTreeSet::new();
            for _ in 0..2 + rng.below(3) {
                let key = if rng.below(4) == 0 {
                    format!("{OTHER}x{}", rng.below(4))
                } else {
                    rng.view_key()
                };
                // etcd refuses a transaction that writes one key twice.
                if !keys.insert(key.clone()) {
                    continue;
                }
                if rng.below(3) == 0 {
                    ops.push(TxnOp::delete(key, None));
                } else {
                    let value = rng.value(i);
                    ops.push(TxnOp::put(key, value, None));
                }
            }
            client
                .txn(Txn::new().and_then(ops))
                .await
                .expect("txn")
                .header()
                .cloned()
        }
        _ => {
            // In the cache, outside the view.
            let key = format!("{OTHER}x{}", rng.below(4));
            client
                .put(key, format!("{i}"), None)
                .await
                .expect("put outside the view")
                .header()
                .cloned()
        }
    };
    header.expect("a header").revision()
}

/// Which keys of etcd's scan an answer must hold.
#[derive(Debug, Clone)]
enum Filter {
    /// Every key under the prefix.
    All,
    /// The keys in `[start, end)`.
    Range(String, String),
    /// One key.
    Key(String),
    /// The objects whose owner index holds the key.
    Owner(String),
    /// The objects whose tag index holds the key.
    Tag(String),
}

impl Filter {
    fn keeps(&self, kv: &etcd_client::KeyValue) -> bool {
        let key = kv.key();
        match self {
            Filter::All => true,
            Filter::Range(start, end) => key >= start.as_bytes() && key < end.as_bytes(),
            Filter::Key(k) => key == k.as_bytes(),
            Filter::Owner(o) => decode(kv.value()).is_some_and(|obj| owner_keys(&obj).contains(o)),
            Filter::Tag(t) => decode(kv.value()).is_some_and(|obj| tag_keys(&obj).contains(t)),
        }
    }
}

/// One read's answer: the revision it reports (`None`: it reports none, as the view's
/// `get`) and its items, as (key, mod revision, value).
struct Answer {
    /// The cache that answered.
    subject: &'static str,
    path: String,
    /// The prefix etcd's scan reads.
    prefix: &'static str,
    filter: Filter,
    revision: Option<i64>,
    items: Items,
}

/// Items as compared: (key, mod revision, value), in key order.
type Items = Vec<(Vec<u8>, i64, Vec<u8>)>;

fn item(kv: &KeyValue) -> (Vec<u8>, i64, Vec<u8>) {
    (kv.key().to_vec(), kv.mod_revision(), kv.value().to_vec())
}

/// The first state of a fresh list-watch: its items and its `InitDone` revision.
async fn first_state<I: ListItem>(mut lw: ListWatch<I>) -> (i64, Items) {
    let mut items = Vec::new();
    loop {
        match lw.next().await.expect("the list-watch ended") {
            Ok(ListWatchEvent::Init { .. }) => items.clear(),
            Ok(ListWatchEvent::InitApply(i)) => items.push(item(i.key_value())),
            Ok(ListWatchEvent::InitDone { revision }) => return (revision, items),
            Ok(other) => panic!("a list-watch gave {other:?} before its first InitDone"),
            Err(e) => panic!("list-watch error before its first InitDone: {e}"),
        }
    }
}

/// `f`, within [`READ_LIMIT`], its error a panic naming `what`.
async fn within<T, E: std::fmt::Display>(what: &str, f: impl Future<Output = Result<T, E>>) -> T {
    match tokio::time::timeout(READ_LIMIT, f).await {
        Ok(Ok(x)) => x,
        Ok(Err(e)) => panic!("{what} failed: {e}"),
        Err(_) => panic!("{what} took longer than {READ_LIMIT:?}"),
    }
}

/// How the reads of one round run.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    /// All at once (one cache's, the caches in turn).
    Together,
    /// One after the other, in a seeded order (one cache's, the caches in turn).
    InTurn,
    /// All at once (every cache's), beside the next write (a big transaction), and
    /// probes of each cache until it has applied that write: the view changes while
    /// they read.
    Racing,
}

impl Mode {
    /// Half the rounds race a write: the rounds where a read can see the view change.
    fn of_round(i: usize) -> Mode {
        [Mode::Racing, Mode::Together, Mode::Racing, Mode::InTurn][i % 4]
    }
}

type Read<'a> = Pin<Box<dyn Future<Output = Answer> + Send + 'a>>;

fn typed_items(items: &[TypedKv<Obj>]) -> Items {
    items.iter().map(|o| item(o.kv())).collect()
}

/// Every read path of `s`'s cache and view, not started yet (`key`: a key of the view
/// to read alone).
fn reads<'a>(s: &'a Subject, key: &str, rng: &mut Rng) -> Vec<Read<'a>> {
    let (subject, cache, view) = (s.name, &s.cache, &s.view);
    let owner = rng.pick(&OWNERS).to_string();
    let tag = rng.pick(&TAGS).to_string();
    let (lo, hi) = (rng.below(KEYS), rng.below(KEYS));
    let (start, end) = (
        format!("{VIEW}k{:02}", lo.min(hi)),
        format!("{VIEW}k{:02}", lo.max(hi) + 1),
    );
    let answer = move |path: String, prefix, filter, revision, items| Answer {
        subject,
        path,
        prefix,
        filter,
        revision,
        items,
    };
    let key = key.to_string();
    vec![
        Box::pin(async move {
            let options = GetOptions::new().with_prefix();
            let r = within("cache.get(prefix)", cache.get(CACHE, Some(options))).await;
            let items = r.kvs().iter().map(item).collect();
            answer(
                format!("cache.get({CACHE}, prefix)"),
                CACHE,
                Filter::All,
                Some(r.revision()),
                items,
            )
        }),
        Box::pin({
            let key = key.clone();
            async move {
                let r = within("cache.get(key)", cache.get(key.clone(), None)).await;
                let items = r.kvs().iter().map(item).collect();
                answer(
                    format!("cache.get({key})"),
                    VIEW,
                    Filter::Key(key),
                    Some(r.revision()),
                    items,
                )
            }
        }),
        Box::pin({
            let key = key.clone();
            async move {
                let r = within("view.get(key)", view.get(key.clone())).await;
                let items = r.iter().map(|o| item(o.kv())).collect();
                answer(
                    format!("view.get({key})"),
                    VIEW,
                    Filter::Key(key),
                    None,
                    items,
                )
            }
        }),
        Box::pin(async move {
            let r = within("view.list()", view.list()).await;
            answer(
                "view.list()".into(),
                VIEW,
                Filter::All,
                Some(r.revision()),
                typed_items(r.items()),
            )
        }),
        Box::pin(async move {
            let options = GetOptions::new().with_range(end.clone());
            let r = within("view.range(part)", view.range(start.clone(), Some(options))).await;
            let path = format!("view.range({start}..{end})");
            answer(
                path,
                VIEW,
                Filter::Range(start, end),
                Some(r.revision()),
                typed_items(r.items()),
            )
        }),
        Box::pin(async move {
            let r = within("view.by_index(owner)", view.by_index("owner", &owner)).await;
            let path = format!("view.by_index(owner, {owner})");
            answer(
                path,
                VIEW,
                Filter::Owner(owner),
                Some(r.revision()),
                typed_items(r.items()),
            )
        }),
        Box::pin(async move {
            let r = within("view.by_index(tag)", view.by_index("tag", &tag)).await;
            let path = format!("view.by_index(tag, {tag})");
            answer(
                path,
                VIEW,
                Filter::Tag(tag),
                Some(r.revision()),
                typed_items(r.items()),
            )
        }),
        Box::pin(async move {
            let (revision, items) = within("view.list_watch()", async {
                Ok::<_, etcd_cache::Error>(first_state(view.list_watch()).await)
            })
            .await;
            answer(
                "view.list_watch() InitDone".into(),
                VIEW,
                Filter::All,
                Some(revision),
                items,
            )
        }),
        Box::pin(async move {
            let (revision, items) = within("cache.list_watch(view)", async {
                Ok::<_, etcd_cache::Error>(first_state(cache.list_watch(VIEW)?).await)
            })
            .await;
            let path = format!("cache.list_watch({VIEW}) InitDone");
            answer(path, VIEW, Filter::All, Some(revision), items)
        }),
    ]
}

/// etcd's own answers, by (prefix, revision): one Range each.
type Scans = BTreeMap<(&'static str, i64), Result<Vec<etcd_client::KeyValue>, String>>;

/// The revisions an answer is compared at: the one it reports; for an answer that
/// reports none (the view's `get`), `written` and `racing` (the write made beside the
/// reads, if any): only the test writes in the view, so it held one of those two.
fn revisions_of(answer: &Answer, written: i64, racing: Option<i64>) -> Vec<i64> {
    match answer.revision {
        Some(at) => vec![at],
        None => [Some(written), racing].into_iter().flatten().collect(),
    }
}

/// etcd's scans that `answers` are compared with, read concurrently.
async fn scan(client: &Client, answers: &[Answer], written: i64, racing: Option<i64>) -> Scans {
    let wanted: std::collections::BTreeSet<(&'static str, i64)> = answers
        .iter()
        .flat_map(|a| {
            revisions_of(a, written, racing)
                .into_iter()
                .map(move |at| (a.prefix, at))
        })
        .collect();
    let reads = wanted.into_iter().map(|(prefix, at)| {
        let mut client = client.clone();
        async move {
            let options = EtcdGet::new().with_prefix().with_revision(at);
            let resp = client.get(prefix, Some(options)).await;
            let kvs = resp.map(|r| r.kvs().to_vec()).map_err(|e| e.to_string());
            ((prefix, at), kvs)
        }
    });
    futures::future::join_all(reads).await.into_iter().collect()
}

fn show(items: &[(Vec<u8>, i64, Vec<u8>)]) -> String {
    let shown: Vec<String> = items
        .iter()
        .map(|(k, m, _)| format!("{}@{m}", String::from_utf8_lossy(k)))
        .collect();
    format!("[{}]", shown.join(", "))
}

/// Compares one answer with etcd's scan at the revision it reports (see
/// [`revisions_of`]). `Some(violation)` if they differ, or if the answer is older than
/// the write acknowledged before the call (`written`).
fn check(scans: &Scans, answer: &Answer, written: i64, racing: Option<i64>) -> Option<String> {
    let path = &answer.path;
    if let Some(at) = answer.revision.filter(|&at| at < written) {
        return Some(format!(
            "{path} at revision {at}, older than the write acknowledged at {written} before the call"
        ));
    }
    let mut expected = Vec::new();
    for at in revisions_of(answer, written, racing) {
        let scan = match &scans[&(answer.prefix, at)] {
            Ok(scan) => scan,
            Err(e) => return Some(format!("{path} at revision {at}: etcd cannot scan it: {e}")),
        };
        let want: Items = scan
            .iter()
            .filter(|kv| answer.filter.keeps(kv))
            .map(|kv| (kv.key().to_vec(), kv.mod_revision(), kv.value().to_vec()))
            .collect();
        if answer.items == want {
            return None;
        }
        expected.push(format!("at {at} {}", show(&want)));
    }
    Some(format!(
        "{path} at revision {} (after the write at {written}): answered {}, etcd's scan holds {}",
        answer
            .revision
            .map_or_else(|| "(none reported)".to_string(), |r| r.to_string()),
        show(&answer.items),
        expected.join(", or ")
    ))
}

/// `s` read again and again, a read path picked at random each time, until `acked` is
/// set (the racing write is acknowledged) and the cache has applied it, or
/// [`AFTER_ACK`] reads after that (a write that changed nothing in the cache leaves its
/// revision where it is).
async fn probe(s: &Subject, key: &str, acked: &AtomicI64, mut rng: Rng) -> Vec<Answer> {
    let mut out = Vec::new();
    let mut after_ack = 0;
    loop {
        let at = acked.load(Ordering::Acquire);
        if at > 0 {
            if s.cache.revision() >= at || after_ack == AFTER_ACK {
                return out;
            }
            after_ack += 1;
        }
        let mut one = reads(s, key, &mut rng);
        let pick = rng.below(one.len() as u64) as usize;
        out.push(one.swap_remove(pick).await);
    }
}

/// One cache under test and its view.
struct Subject {
    name: &'static str,
    cache: Cache,
    view: TypedView<Obj>,
}

/// The differential run: `writes` seeded writes, every read path of every subject
/// checked against etcd after each.
async fn differential(writes: usize) {
    let seed = seed();
    println!(
        "read_differential: seed {seed} (replay with ETCD_CACHE_SEED={seed}), {writes} writes"
    );
    let started = Instant::now();
    let (_etcd, client) = testkit::etcd_with_client(EtcdOptions::default()).await;
    let auto = testkit::ready_cache(client.clone(), |b| b.prefix(CACHE)).await;
    let never = testkit::ready_cache(client.clone(), |b| {
        b.prefix(CACHE).progress_trust(ProgressTrust::Never)
    })
    .await;
    let trusted = testkit::wait_for_version_verdict(&auto).await;
    println!("read_differential: progress trusted by the Auto cache: {trusted}");
    let subjects: Vec<Subject> = [("auto", auto), ("never", never)]
        .into_iter()
        .map(|(name, cache)| Subject {
            name,
            view: view_of(&cache),
            cache,
        })
        .collect();

    // The writer outside the cache: etcd's revision moves, the cache sees nothing.
    let stop = Arc::new(AtomicBool::new(false));
    let noise_puts = Arc::new(AtomicU64::new(0));
    let noise = {
        let (stop, puts) = (stop.clone(), noise_puts.clone());
        let mut client = client.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(NOISE_EVERY);
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                if client.put(NOISE, "n", None).await.is_ok() {
                    puts.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };

    let mut writer = client.clone();
    let mut wrng = Rng(seed);
    let mut rrng = Rng(seed ^ 0x5EED_F00D_2EAD);
    // (the cache that answered, what differed)
    let mut violations: Vec<(&str, String)> = Vec::new();
    let mut checked = 0u64;
    let mut written = write(&mut writer, &mut wrng, 0).await;
    for i in 0..writes {
        let more = i + 1 < writes;
        let mode = Mode::of_round(i);
        let key = rrng.view_key();
        let before: Vec<i64> = subjects.iter().map(|s| s.cache.revision()).collect();
        let mut all: Vec<Read<'_>> = Vec::new();
        for (at, s) in subjects.iter().enumerate() {
            // A round that does not race reads one cache (the caches in turn).
            if mode == Mode::Racing || at == (i / 4) % subjects.len() {
                all.extend(reads(s, &key, &mut rrng));
            }
        }
        let (answers, racing) = match mode {
            Mode::Together => (futures::future::join_all(all).await, None),
            Mode::InTurn => {
                let mut out = Vec::with_capacity(all.len());
                while !all.is_empty() {
                    let next = rrng.below(all.len() as u64) as usize;
                    out.push(all.swap_remove(next).await);
                }
                (out, None)
            }
            Mode::Racing if more => {
                // Besides the reads, each cache is read again and again (a read path
                // picked at random each time) until the write is acknowledged and the
                // cache has applied it: while the cache lags etcd on the view.
                let acked = AtomicI64::new(0);
                let probes: Vec<_> = subjects
                    .iter()
                    .flat_map(|s| std::iter::repeat_n(s, PROBES))
                    .map(|s| probe(s, &key, &acked, Rng(rrng.next())))
                    .collect();
                let racing = async {
                    let next = write_big(&mut writer, &mut wrng, i + 1).await;
                    acked.store(next, Ordering::Release);
                    next
                };
                let (mut answers, probed, next) = tokio::join!(
                    futures::future::join_all(all),
                    futures::future::join_all(probes),
                    racing
                );
                answers.extend(probed.into_iter().flatten());
                (answers, Some(next))
            }
            Mode::Racing => (futures::future::join_all(all).await, None),
        };
        let after: Vec<i64> = subjects.iter().map(|s| s.cache.revision()).collect();
        let scans = scan(&client, &answers, written, racing).await;
        for answer in &answers {
            checked += 1;
            if let Some(v) = check(&scans, answer, written, racing) {
                let at = subjects.iter().position(|s| s.name == answer.subject);
                let (b, a) = at.map_or((0, 0), |at| (before[at], after[at]));
                violations.push((
                    answer.subject,
                    format!(
                        "round {i} ({mode:?}), {} cache (revision {b} before the reads, {a} after): {v}",
                        answer.subject
                    ),
                ));
            }
        }
        written = match racing {
            Some(next) => next,
            None if more => write(&mut writer, &mut wrng, i + 1).await,
            None => written,
        };
    }
    stop.store(true, Ordering::Relaxed);
    noise.await.expect("the noise writer");

    for s in &subjects {
        let stats = s.cache.stats();
        println!(
            "read_differential: {} cache: revision {}, fallback reads {}, progress requests {}, violations {}",
            s.name,
            stats.revision,
            stats.fallback_reads,
            stats.progress_requests,
            violations.iter().filter(|(by, _)| *by == s.name).count()
        );
    }
    for (_, v) in violations.iter().take(12) {
        println!("  {v}");
    }
    println!(
        "read_differential: {writes} writes, {checked} answers checked, {} violations, {} noise puts, {:.1} s",
        violations.len(),
        noise_puts.load(Ordering::Relaxed),
        started.elapsed().as_secs_f64()
    );
    assert!(
        violations.is_empty(),
        "{} reads differ from etcd's scan at the revision they report (seed {seed}); see above",
        violations.len()
    );
    for s in subjects {
        s.cache.close().await;
    }
}

/// 1,000 writes: every read path equals etcd's scan at the revision it reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_read_path_equals_etcds_scan_at_the_revision_it_reports() {
    testkit::init_tracing();
    testkit::bounded(Duration::from_secs(300), differential(WRITES)).await;
}

/// The long form: `ETCD_CACHE_DIFF_WRITES` writes (default 20,000).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: ETCD_CACHE_DIFF_WRITES writes (default 20,000)"]
async fn every_read_path_equals_etcds_scan_long() {
    testkit::init_tracing();
    let writes: usize = std::env::var("ETCD_CACHE_DIFF_WRITES")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(20_000);
    testkit::bounded(Duration::from_secs(3 * 3600), differential(writes)).await;
}
