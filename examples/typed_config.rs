//! Typed config objects: a JSON view with an index by owner, and the list-then-watch
//! loop that replaces the hand-written get-then-watch-then-re-list one.
//!
//! ```text
//! cargo run --example typed_config                           # starts a throwaway etcd
//! ETCD_ENDPOINTS=127.0.0.1:2379 cargo run --example typed_config
//! ```
//!
//! A service keeps `Service` records (JSON) under a prefix. It builds one typed view with
//! an index by owner, hands the view's list-watch to 100 "subscribers" (each keeps its own
//! map of objects), writes a few changes (one of them a bad value) and checks:
//! - every subscriber's map equals etcd's content, decoded;
//! - each value was decoded once, not once per subscriber;
//! - the bad value is reported for its key while the others flow, and recovers;
//! - `by_index("owner", ...)` equals a scan of the view at the same revision.
//!
//! Exits with 1 on any difference.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use etcd_cache::{Cache, JsonCodec, ListWatch, ListWatchEvent, TypedKv, TypedView};

#[derive(Debug, PartialEq, serde::Deserialize)]
struct Service {
    owner: String,
    port: u16,
}

/// One subscriber's state: key -> object (None: the value did not decode).
type State = BTreeMap<String, Option<Arc<Service>>>;

/// Applies list-watch events until the state is at `until`.
async fn follow(
    lw: &mut ListWatch<TypedKv<Service>>,
    state: &mut State,
    at: &mut i64,
    until: i64,
) -> Result<(), String> {
    let mut next: Option<State> = None;
    while *at < until || next.is_some() {
        let event = tokio::time::timeout(Duration::from_secs(10), lw.next())
            .await
            .map_err(|_| "no event within 10 s".to_string())?
            .ok_or("the list-watch ended")?
            .map_err(|e| e.to_string())?;
        match event {
            ListWatchEvent::Init { .. } => next = Some(State::new()),
            ListWatchEvent::InitApply(o) => {
                let key = String::from_utf8_lossy(o.key()).into_owned();
                next.get_or_insert_with(State::new)
                    .insert(key, o.object().cloned());
            }
            ListWatchEvent::InitDone { revision } => {
                *state = next.take().unwrap_or_default();
                *at = revision;
            }
            ListWatchEvent::Apply(o) => {
                state.insert(
                    String::from_utf8_lossy(o.key()).into_owned(),
                    o.object().cloned(),
                );
                *at = o.mod_revision();
            }
            ListWatchEvent::Delete { key, revision, .. } => {
                state.remove(&*String::from_utf8_lossy(&key));
                *at = revision;
            }
        }
    }
    Ok(())
}

async fn run(endpoints: Vec<String>) -> Result<(), String> {
    let mut client = testkit::Connect::new().try_client(&endpoints).await?;
    let prefix = testkit::unique_prefix("typed-config");
    let json = |owner: &str, port: u16| format!(r#"{{"owner":"{owner}","port":{port}}}"#);
    for (i, owner) in ["a", "b", "a"].iter().enumerate() {
        client
            .put(
                format!("{prefix}svc-{i}"),
                json(owner, 8000 + i as u16),
                None,
            )
            .await
            .map_err(|e| e.to_string())?;
    }
    let cache = Cache::builder(client.clone())
        .prefix(prefix.clone())
        .build()
        .await
        .map_err(|e| e.to_string())?;
    cache
        .wait_ready_timeout(Duration::from_secs(10))
        .await
        .map_err(|e| e.to_string())?;
    let view: TypedView<Service> = cache
        .typed(JsonCodec::<Service>::new())
        .index("owner", |s: &Service| vec![s.owner.clone()])
        .build()
        .map_err(|e| e.to_string())?;

    let mut subscribers: Vec<(ListWatch<TypedKv<Service>>, State, i64)> = (0..100)
        .map(|_| (view.list_watch(), State::new(), 0))
        .collect();
    let head = cache
        .get(prefix.as_str(), None)
        .await
        .map_err(|e| e.to_string())?
        .revision();
    for (lw, state, at) in &mut subscribers {
        follow(lw, state, at, head).await?;
    }
    println!(
        "100 subscribers hold {} services at revision {head}",
        subscribers[0].1.len()
    );

    let mut last = 0;
    for (key, value) in [
        ("svc-1", json("c", 9001)),
        ("svc-3", json("b", 9003)),
        ("svc-4", "{broken".to_string()),
        ("svc-5", json("a", 9005)),
    ] {
        last = client
            .put(format!("{prefix}{key}"), value, None)
            .await
            .map_err(|e| e.to_string())?
            .header()
            .map_or(0, |h| h.revision());
    }
    last = client
        .delete(format!("{prefix}svc-0"), None)
        .await
        .map_err(|e| e.to_string())?
        .header()
        .map_or(0, |h| h.revision())
        .max(last);
    for (lw, state, at) in &mut subscribers {
        follow(lw, state, at, last).await?;
    }

    // Every subscriber's map is etcd's content, decoded; the same Arc everywhere.
    let truth = client
        .get(
            prefix.as_str(),
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .map_err(|e| e.to_string())?;
    let truth: BTreeMap<String, Option<Service>> = truth
        .kvs()
        .iter()
        .map(|kv| {
            (
                String::from_utf8_lossy(kv.key()).into_owned(),
                serde_json::from_slice(kv.value()).ok(),
            )
        })
        .collect();
    for (i, (_, state, _)) in subscribers.iter().enumerate() {
        let mine: BTreeMap<String, Option<Service>> = state
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    v.as_ref().map(|s| Service {
                        owner: s.owner.clone(),
                        port: s.port,
                    }),
                )
            })
            .collect();
        if mine != truth {
            return Err(format!(
                "subscriber {i} differs from etcd:\n  {mine:?}\n  {truth:?}"
            ));
        }
        for (key, obj) in state {
            if let (Some(a), Some(Some(b))) = (obj, subscribers[0].1.get(key)) {
                if !Arc::ptr_eq(a, b) {
                    return Err(format!("subscriber {i} holds another copy of {key}"));
                }
            }
        }
    }
    let (decodes, failures) = view.decodes();
    println!(
        "{decodes} values decoded ({failures} refused) for 100 subscribers of 4 puts over 3 keys"
    );
    if decodes != 7 || failures != 1 {
        return Err(format!(
            "expected 7 decodes (3 listed + 4 puts), 1 refused; saw {decodes}, {failures}"
        ));
    }
    let broken = view
        .get(format!("{prefix}svc-4"))
        .await
        .map_err(|e| e.to_string())?
        .ok_or("svc-4 missing")?;
    match broken.value() {
        Err(e) => println!("reported for its key: {e}"),
        Ok(_) => return Err("svc-4 should not decode".into()),
    }

    // The index against a scan of the view at the same revision.
    for owner in ["a", "b", "c"] {
        let by = view
            .by_index("owner", owner)
            .await
            .map_err(|e| e.to_string())?;
        let list = view.list().await.map_err(|e| e.to_string())?;
        let scan: Vec<&[u8]> = list
            .items()
            .iter()
            .filter(|o| o.object().is_some_and(|s| s.owner == owner))
            .map(|o| o.key())
            .collect();
        let got: Vec<&[u8]> = by.items().iter().map(|o| o.key()).collect();
        if got != scan || by.revision() != list.revision() {
            return Err(format!(
                "index {owner}: {got:?} at {} vs scan {scan:?} at {}",
                by.revision(),
                list.revision()
            ));
        }
        println!(
            "owner {owner}: {} services at revision {}",
            got.len(),
            by.revision()
        );
    }
    cache.close().await;
    println!("OK: 100 subscribers equal etcd, 7 decodes, the index equals a scan");
    Ok(())
}

fn main() -> ExitCode {
    testkit::example_main("typed_config", Duration::from_secs(30), run)
}
