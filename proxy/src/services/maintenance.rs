//! The Maintenance service, forwarded with the caller's token, as etcd's grpc-proxy
//! forwards it. Defragment, MoveLeader and Downgrade reach the member the balanced
//! channel picks (with one `--endpoints`, that member).

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use tonic::{Request, Response, Status};

use crate::forward_macros::{call_upstream, forward};
use crate::pb::etcdserverpb::*;
use crate::state::State;

/// etcd's Maintenance service.
pub(crate) struct MaintenanceService {
    state: Arc<State>,
}

impl MaintenanceService {
    pub(crate) fn new(state: Arc<State>) -> Self {
        MaintenanceService { state }
    }
}

type SnapshotStream = Pin<Box<dyn Stream<Item = Result<SnapshotResponse, Status>> + Send>>;

#[tonic::async_trait]
impl maintenance_server::Maintenance for MaintenanceService {
    forward!(alarm, maintenance, AlarmRequest, AlarmResponse);
    forward!(status, maintenance, StatusRequest, StatusResponse);
    forward!(hash, maintenance, HashRequest, HashResponse);
    forward!(hash_kv, maintenance, HashKvRequest, HashKvResponse);
    forward!(
        defragment,
        maintenance,
        DefragmentRequest,
        DefragmentResponse
    );
    forward!(
        move_leader,
        maintenance,
        MoveLeaderRequest,
        MoveLeaderResponse
    );
    forward!(downgrade, maintenance, DowngradeRequest, DowngradeResponse);

    type SnapshotStream = SnapshotStream;

    async fn snapshot(
        &self,
        req: Request<SnapshotRequest>,
    ) -> Result<Response<SnapshotStream>, Status> {
        let metadata = req.metadata().clone();
        let upstream = &self.state.upstream;
        let stream = call_upstream!(upstream, &metadata, req.into_inner(), maintenance.snapshot)
            .await?
            .into_inner();
        Ok(Response::new(Box::pin(stream)))
    }
}
