//! The Cluster service: MemberList answers with the proxy itself (its advertised client
//! URL), so a client that syncs its endpoints from the member list stays on the proxy, as
//! with etcd's grpc-proxy `--advertise-client-url`. Membership changes are not served.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::forward::{call_upstream, unserved};
use crate::pb::etcdserverpb::*;
use crate::state::State;

/// etcd's Cluster service.
pub(crate) struct ClusterService {
    st: Arc<State>,
}

impl ClusterService {
    pub(crate) fn new(st: Arc<State>) -> Self {
        ClusterService { st }
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
    unserved!(
        member_add,
        MemberAddRequest,
        MemberAddResponse,
        "Cluster.MemberAdd"
    );
    unserved!(
        member_remove,
        MemberRemoveRequest,
        MemberRemoveResponse,
        "Cluster.MemberRemove"
    );
    unserved!(
        member_update,
        MemberUpdateRequest,
        MemberUpdateResponse,
        "Cluster.MemberUpdate"
    );
    unserved!(
        member_promote,
        MemberPromoteRequest,
        MemberPromoteResponse,
        "Cluster.MemberPromote"
    );

    async fn member_list(
        &self,
        req: Request<MemberListRequest>,
    ) -> Result<Response<MemberListResponse>, Status> {
        if self.st.authz.enabled() {
            // etcd refuses a MemberList it would refuse the caller (3.6 asks for a
            // user): etcd decides, the proxy answers with itself.
            let md = req.metadata().clone();
            let up = &self.st.up;
            call_upstream!(up, &md, req.into_inner(), cluster.member_list).await?;
        }
        let url = self.st.advertised_url.clone();
        let name = std::env::var("HOSTNAME")
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "etcd-cache-proxy".into());
        let member = Member {
            id: member_id(&url),
            name,
            peer_ur_ls: Vec::new(),
            client_ur_ls: vec![url],
            is_learner: false,
        };
        Ok(Response::new(MemberListResponse {
            header: Some(self.st.up.header(self.st.revision())),
            members: vec![member],
        }))
    }
}
