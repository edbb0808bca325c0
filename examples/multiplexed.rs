//! A per-key watcher multiplexed on one watch stream, as with etcd-client's
//! `WatchStream`: `watch` adds a key, each watch's `created` response carries its id,
//! every response names its watch, `cancel(id)` ends one watch, and `request_progress`
//! asks for a response that says "every watch is current up to this revision".
//!
//! ```text
//! cargo run --example multiplexed                             # starts a throwaway etcd
//! ETCD_ENDPOINTS=127.0.0.1:2379 cargo run --example multiplexed
//! ```
//!
//! The stream is split into its request half (`WatchRequestSender`: add, cancel, ask for
//! progress; it could live in another task) and its response half
//! (`WatchResponseStream`), whose responses are dispatched by their `watch_id`. The
//! scenario watches three feature flags, writes them, cancels one, writes again, and asks
//! for progress until the answer covers the last write. It checks that the ids came back
//! in the order the watches were added, and that when that progress answer came each
//! flag's watch had seen exactly its own writes (none after its cancel); else it exits
//! with 1.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::process::ExitCode;
use std::time::Duration;

use etcd_cache::{Cache, WatchResponseStream};

const FLAGS: [&str; 3] = ["dark-mode", "new-checkout", "beta-search"];

/// What the reader learned from the responses.
#[derive(Default)]
struct Dispatch {
    /// Flags whose watch was requested but whose `created` response has not come.
    pending: VecDeque<String>,
    /// watch id -> flag.
    ids: HashMap<i64, String>,
    /// flag -> the values its watch delivered, in order.
    values: BTreeMap<String, Vec<String>>,
    canceled: Vec<String>,
}

impl Dispatch {
    /// Handles one response.
    fn handle(&mut self, resp: &etcd_cache::WatchResponse) -> Result<(), String> {
        if resp.created() {
            let flag = self
                .pending
                .pop_front()
                .ok_or("a created response nobody asked for")?;
            println!("  watch {} created for {flag}", resp.watch_id());
            self.ids.insert(resp.watch_id(), flag);
        } else if resp.canceled() {
            let flag = self
                .ids
                .remove(&resp.watch_id())
                .ok_or("cancel of an unknown id")?;
            println!("  watch {} for {flag} canceled", resp.watch_id());
            self.canceled.push(flag);
        }
        for ev in resp.events() {
            let flag = self
                .ids
                .get(&resp.watch_id())
                .ok_or("events for an unknown id")?;
            let kv = ev.kv().ok_or("an event without a key-value")?;
            let value = String::from_utf8_lossy(kv.value()).into_owned();
            println!(
                "  {flag} = {value} (watch {}, revision {})",
                resp.watch_id(),
                kv.mod_revision()
            );
            self.values.entry(flag.clone()).or_default().push(value);
        }
        Ok(())
    }

    fn id_of(&self, flag: &str) -> Option<i64> {
        self.ids.iter().find(|(_, f)| *f == flag).map(|(id, _)| *id)
    }
}

/// Reads responses until `done` holds; returns the progress revision if one came.
async fn read_until(
    responses: &mut WatchResponseStream,
    d: &mut Dispatch,
    done: impl Fn(&Dispatch, Option<i64>) -> bool,
) -> Result<Option<i64>, String> {
    let mut progress = None;
    while !done(d, progress) {
        let resp = responses
            .message()
            .await
            .map_err(|e| e.to_string())?
            .ok_or("the stream ended")?;
        if resp.is_progress_notify() && resp.watch_id() == -1 {
            progress = Some(resp.revision());
        }
        d.handle(&resp)?;
    }
    Ok(progress)
}

async fn run(endpoints: Vec<String>) -> Result<(), String> {
    let mut client = testkit::Connect::new().try_client(&endpoints).await?;
    let prefix = testkit::unique_prefix("multiplexed");
    let cache = Cache::builder(client.clone())
        .prefix(prefix.clone())
        .build()
        .await
        .map_err(|e| e.to_string())?;
    cache
        .wait_ready_timeout(Duration::from_secs(10))
        .await
        .map_err(|e| e.to_string())?;
    let key = |flag: &str| format!("{prefix}flags/{flag}");

    // One stream, one watch per flag, added back to back.
    let mut d = Dispatch::default();
    let mut stream = cache
        .watch(key(FLAGS[0]), None)
        .await
        .map_err(|e| e.to_string())?;
    d.pending.push_back(FLAGS[0].to_owned());
    for flag in &FLAGS[1..] {
        stream
            .watch(key(flag), None)
            .await
            .map_err(|e| e.to_string())?;
        d.pending.push_back(flag.to_string());
    }
    let (mut sender, mut responses) = stream.split();
    read_until(&mut responses, &mut d, |d, _| d.ids.len() == FLAGS.len()).await?;
    // The ids, in increasing order, name the flags in the order they were added.
    let mut ids: Vec<(&i64, &String)> = d.ids.iter().collect();
    ids.sort();
    let order: Vec<&str> = ids.iter().map(|(_, f)| f.as_str()).collect();
    if order != FLAGS {
        return Err(format!(
            "watch ids not in the order the watches were added: {ids:?}"
        ));
    }

    // Every flag twice.
    for round in 1..=2 {
        for flag in FLAGS {
            client
                .put(key(flag), format!("{flag}-{round}"), None)
                .await
                .map_err(|e| e.to_string())?;
        }
    }
    read_until(&mut responses, &mut d, |d, _| {
        d.values.values().map(Vec::len).sum::<usize>() == 2 * FLAGS.len()
    })
    .await?;

    // Cancel one flag's watch by its id; only the others see the next write.
    let gone = FLAGS[1];
    let id = d.id_of(gone).ok_or("no id for the flag")?;
    sender.cancel(id).await.map_err(|e| e.to_string())?;
    read_until(&mut responses, &mut d, |d, _| d.canceled.len() == 1).await?;
    let mut last = 0;
    for flag in FLAGS {
        let put = client
            .put(key(flag), format!("{flag}-3"), None)
            .await
            .map_err(|e| e.to_string())?;
        last = put.header().map_or(0, |h| h.revision());
    }

    // A progress answer for the whole stream: once it comes, every watch has been
    // delivered every event up to its revision. The cache answers at the revision it
    // has applied, which can be just behind a write etcd has acknowledged: to wait for
    // the last write, ask again until the answer covers it.
    let mut early = 0;
    let progress = loop {
        sender.request_progress().await.map_err(|e| e.to_string())?;
        let progress = read_until(&mut responses, &mut d, |_, p| p.is_some())
            .await?
            .unwrap_or_default();
        if progress >= last {
            break progress;
        }
        early += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    if early > 0 {
        println!("progress answered {early} time(s) before the cache had applied revision {last}");
    }
    println!("progress: every watch is current at revision {progress}");

    let mut failures = Vec::new();
    if progress < last {
        failures.push(format!(
            "progress {progress} is behind the last write {last}"
        ));
    }
    for flag in FLAGS {
        let rounds: &[u32] = if flag == gone { &[1, 2] } else { &[1, 2, 3] };
        let want: Vec<String> = rounds.iter().map(|r| format!("{flag}-{r}")).collect();
        let got = d.values.get(flag).cloned().unwrap_or_default();
        if got != want {
            failures.push(format!("{flag}: got {got:?}, want {want:?}"));
        }
    }
    if d.canceled != [gone] {
        failures.push(format!("canceled {:?}, want [{gone}]", d.canceled));
    }
    drop((sender, responses));
    cache.close().await;
    if failures.is_empty() {
        println!("OK: each flag saw its own writes, in order, and none after its cancel");
        Ok(())
    } else {
        Err(failures.join("; "))
    }
}

fn main() -> ExitCode {
    testkit::example_main("multiplexed", Duration::from_secs(30), run)
}
