//! The Lock service (v3lock), forwarded; under a namespace, lock names and keys are
//! moved into it and back.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::forward_macros::call_upstream;
use crate::pb::v3lockpb::*;
use crate::state::State;
use crate::upstream::fresh;

/// etcd's Lock service.
pub(crate) struct LockService {
    state: Arc<State>,
}

impl LockService {
    pub(crate) fn new(state: Arc<State>) -> Self {
        LockService { state }
    }
}

#[tonic::async_trait]
impl lock_server::Lock for LockService {
    async fn lock(&self, req: Request<LockRequest>) -> Result<Response<LockResponse>, Status> {
        let metadata = req.metadata().clone();
        let mut r = req.into_inner();
        r.name = self.state.namespace.key(&r.name);
        let upstream = &self.state.upstream;
        let mut resp = call_upstream!(upstream, &metadata, r, lock.lock)
            .await?
            .into_inner();
        resp.key = self.state.namespace.strip(std::mem::take(&mut resp.key));
        Ok(Response::new(resp))
    }

    async fn unlock(
        &self,
        req: Request<UnlockRequest>,
    ) -> Result<Response<UnlockResponse>, Status> {
        let metadata = req.metadata().clone();
        let mut r = req.into_inner();
        r.key = self.state.namespace.key(&r.key);
        let upstream = &self.state.upstream;
        call_upstream!(upstream, &metadata, r, lock.unlock)
            .await
            .map(fresh)
    }
}
