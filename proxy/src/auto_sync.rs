//! `--endpoints-auto-sync-interval`: every interval, etcd's member list, and the
//! endpoints forwarded calls balance over set to its members' client URLs, as grpc-proxy
//! does (its clientv3's `AutoSyncInterval`, `Client.Sync`): the members that have a name
//! (have started) and are not learners; an answer with none leaves the endpoints as they
//! are. Each endpoint added or removed is logged with its URL, and
//! `etcd_cache_proxy_upstream_endpoints` counts them.
//!
//! The member list is asked of the endpoints as they are, through the forwarding channel,
//! with the proxy's own token (with `--user`); a failure is logged and the next interval
//! asks again.
//!
//! The cache's own client (`cache_slot.rs`) follows the same endpoints: once the members
//! of `--endpoints` are gone, it reconnects through the others, as forwarded calls do.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::pb::etcdserverpb::{Member, MemberListRequest};
use crate::upstream::Upstream;

/// Syncs `upstream`'s endpoints every `interval` until aborted.
pub(crate) fn spawn(upstream: Arc<Upstream>, interval: Duration) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            sync(&upstream).await;
        }
    })
}

/// One sync: the member list, then the endpoints set to its client URLs.
async fn sync(upstream: &Upstream) {
    let list = upstream
        .own_call(MemberListRequest::default(), |req| {
            let mut cluster = upstream.cluster();
            async move { cluster.member_list(req).await }
        })
        .await;
    let members = match list {
        Ok(resp) => resp.into_inner().members,
        Err(e) => {
            tracing::warn!(error = %e.message(), "endpoints auto sync: MemberList failed");
            return;
        }
    };
    let urls = client_urls(&members);
    if urls.is_empty() {
        tracing::warn!("endpoints auto sync: no started voting member; endpoints kept");
        return;
    }
    let (added, removed) = upstream.set_endpoints(&urls).await;
    for url in &added {
        tracing::info!(endpoint = %url, "endpoints auto sync: endpoint added");
    }
    for url in &removed {
        tracing::info!(endpoint = %url, "endpoints auto sync: endpoint removed");
    }
    if !added.is_empty() || !removed.is_empty() {
        let now = upstream.endpoints();
        crate::metrics::get().endpoints_synced(now.len());
        tracing::info!(endpoints = ?now, "endpoints auto sync: etcd endpoints set");
    }
}

/// The client URLs of the members clientv3's `Sync` takes: started (a name) and voting.
fn client_urls(members: &[Member]) -> Vec<String> {
    members
        .iter()
        .filter(|m| !m.name.is_empty() && !m.is_learner)
        .flat_map(|m| m.client_ur_ls.iter().cloned())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As clientv3's `Sync`: a member not started yet (no name) and a learner are left out.
    #[test]
    fn started_voting_members_only() {
        let member = |name: &str, learner: bool, urls: &[&str]| Member {
            name: name.into(),
            is_learner: learner,
            client_ur_ls: urls.iter().map(|u| u.to_string()).collect(),
            ..Default::default()
        };
        let members = [
            member("a", false, &["http://a:2379", "http://a2:2379"]),
            member("", false, &["http://new:2379"]),
            member("l", true, &["http://learner:2379"]),
            member("b", false, &["https://b:2379"]),
        ];
        assert_eq!(
            client_urls(&members),
            ["http://a:2379", "http://a2:2379", "https://b:2379"]
        );
        assert!(client_urls(&[]).is_empty());
    }
}
