//! The Cluster service, as etcd's grpc-proxy serves it: with `--advertise-client-url`,
//! MemberList answers with the proxy itself (that URL), so a client that syncs its
//! endpoints from the member list stays on the proxy; with `--resolver-prefix` as well,
//! with every proxy registered there (`register.rs`), itself when none is yet; without
//! it, MemberList is etcd's. The registrations are read with the caller's token: a caller
//! etcd does not let read `--resolver-prefix` gets the proxy alone.
//! Membership changes are forwarded to etcd with the caller's token (etcd asks for root).

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::forward_macros::{call_upstream, forward};
use crate::pb::etcdserverpb::*;
use crate::register;
use crate::state::State;

/// etcd's Cluster service.
pub(crate) struct ClusterService {
    state: Arc<State>,
}

impl ClusterService {
    pub(crate) fn new(state: Arc<State>) -> Self {
        ClusterService { state }
    }
}

/// A stable member id for the proxy: a hash of its advertised URL (never 0).
fn member_id(url: &str) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    url.hash(&mut h);
    h.finish().max(1)
}

#[tonic::async_trait]
impl cluster_server::Cluster for ClusterService {
    forward!(member_add, cluster, MemberAddRequest, MemberAddResponse);
    forward!(
        member_remove,
        cluster,
        MemberRemoveRequest,
        MemberRemoveResponse
    );
    forward!(
        member_update,
        cluster,
        MemberUpdateRequest,
        MemberUpdateResponse
    );
    forward!(
        member_promote,
        cluster,
        MemberPromoteRequest,
        MemberPromoteResponse
    );

    async fn member_list(
        &self,
        req: Request<MemberListRequest>,
    ) -> Result<Response<MemberListResponse>, Status> {
        let Some(url) = self.state.advertised_url.clone() else {
            let metadata = req.metadata().clone();
            let upstream = &self.state.upstream;
            return call_upstream!(upstream, &metadata, req.into_inner(), cluster.member_list)
                .await
                .map(crate::upstream::fresh);
        };
        if self.state.authz.enabled() {
            // etcd refuses a MemberList it would refuse the caller (3.6 asks for a
            // user): etcd decides, the proxy answers with itself.
            let metadata = req.metadata().clone();
            let upstream = &self.state.upstream;
            call_upstream!(upstream, &metadata, *req.get_ref(), cluster.member_list).await?;
        }
        // The registrations, read with the caller's token: one etcd does not let read
        // them gets the proxy alone.
        let mut members = match &self.state.resolver_prefix {
            Some(prefix) => {
                match register::members(&self.state.upstream, req.metadata(), prefix, member_id)
                    .await
                {
                    Err(s) if crate::etcd_errors::is_auth_refusal(&s) => Vec::new(),
                    other => other?,
                }
            }
            None => Vec::new(),
        };
        if members.is_empty() {
            members.push(Member {
                id: member_id(&url),
                name: register::hostname(),
                peer_ur_ls: Vec::new(),
                client_ur_ls: vec![url],
                is_learner: false,
            });
        }
        Ok(Response::new(MemberListResponse {
            header: Some(self.state.upstream.header(self.state.revision())),
            members,
        }))
    }
}
